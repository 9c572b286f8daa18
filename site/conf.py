"""Sphinx's configuration of the course's website, for both languages.

Do not run sphinx-build on it directly: `python tools/build_site.py` (or `bash run.sh site`) prepares the pages
of each language in build/site/<language>/ and passes what differs between the languages (the language, the
site's words in it, each chapter's Binder and download links) in a JSON file named by TL_SITE_CONTEXT.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sphinx.application import Sphinx

_context_file = os.environ.get("TL_SITE_CONTEXT")
if not _context_file:
    raise RuntimeError("TL_SITE_CONTEXT is not set: build the site with `python tools/build_site.py`")
_context = json.loads(pathlib.Path(_context_file).read_text(encoding="utf-8"))

if _context["language"] == "zh":
    import jieba  # Sphinx's Chinese search splits words with it

    jieba.setLogLevel(logging.WARNING)  # not its progress messages on every build

project = "transformer_lab"
author = "transformer_lab"
language = _context["sphinx_language"]  # "zh_CN": Sphinx's Chinese catalogue for navigation, search, prev/next
locale_dirs = [_context["locale_dir"]]  # the theme's words that Sphinx's catalogue lacks (build_site.py writes them)

extensions = ["myst_nb"]
# The notebooks are shown as committed: their stored outputs are the figures, nothing is executed.
nb_execution_mode = "off"
nb_ipywidgets_js = {}  # no require.js and widget manager from a CDN: widgets are shown as stills
nb_merge_streams = True
myst_enable_extensions = ["dollarmath"]  # $...$ and $$...$$, as Jupyter writes formulas
exclude_patterns = ["_extra", "_search", "locale"]

html_theme = "furo"
html_title = _context["title"]
html_static_path = ["static"]
html_css_files = ["transformer_lab.css"]
html_extra_path = [_context["extra_path"]]  # the learner edition's notebooks, for "Download the notebook"
templates_path = ["templates"]
html_sidebars = {
    "**": [
        "sidebar/brand.html",
        "sidebar/language.html",
        "sidebar/search.html",
        "sidebar/scroll-start.html",
        "sidebar/navigation.html",
        "sidebar/scroll-end.html",
    ]
}
html_theme_options = {"top_of_page_buttons": []}  # no "view source" / "edit" links
html_copy_source = False
html_use_index = False  # no index entries: no empty index page
html_show_sourcelink = False
html_show_sphinx = False
html_show_copyright = False
html_permalinks_icon = "#"
html_search_options = _context["search_options"]  # Chinese: jieba with the glossary's terms as its dictionary
html_favicon = "static/favicon.svg"
html_context = {
    "tl_texts": _context["texts"],
    "tl_pages": _context["pages"],
    "tl_repository": _context["repository"],
    "tl_twin_language": _context["twin_language"],
    "tl_twin_name": _context["twin_name"],
    "tl_twin_hreflang": _context["twin_hreflang"],
}

# MathJax served by the site itself (tools/build_site.py copies it from a pinned PyPI package); Sphinx's default
# and myst-nb's point at a CDN.
mathjax_path = _context["mathjax_path"]


def _page_context(app: Sphinx, pagename: str, templatename: str, context: dict[str, Any], doctree: Any) -> None:
    """What the templates use: `tl_(english)` (the site's words in the page's language; a missing one fails the
    build), the page's twin in the other language, and a chapter's own links."""
    texts = context["tl_texts"]

    def tl_(english: str) -> str:
        if english not in texts:
            raise KeyError(f"translations/zh/site.json has no interface entry for {english!r}")
        return texts[english]

    depth = pagename.count("/") + 1
    context["tl_"] = tl_
    context["tl_twin"] = "../" * depth + f"{context['tl_twin_language']}/{pagename}.html"
    context["tl_chapter"] = context["tl_pages"].get(pagename)


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("html-page-context", _page_context)
    return {"parallel_read_safe": True}
