"""The course's website (tools/build_site.py), built and read in a real browser.

The site is built once for the module, the way `bash run.sh site` builds it (a build in _site/ made from the
files as they are now is reused), served on 127.0.0.1, and every page of both languages is opened in headless
Chromium with every request routed through the test: a request to any other host fails the test, as does a
console error. On each page: no formula left as raw TeX and the typeset ones present, every image loaded, the
language switch reaching the same page in the other language. Then: the search finds "LayerNorm" in English and
"层归一化" in Chinese, an exercise's solution stays folded until its control is clicked, and every link inside
the site leads to a file and an anchor that exist. Screenshots of chapter 01 in both languages and the build's
timing go to test-artifacts/site/.

The translations the site needs (translations/zh/site.json) and what a chapter's page is made from are checked
without a browser. Chromium: Debian's /usr/bin/chromium with the flags of tests/test_browser.py; without it the
browser tests skip, except under CI.
"""

from __future__ import annotations

import faulthandler
import functools
import html
import http.server
import json
import pathlib
import re
import sys
import threading
import time
import urllib.parse

import pytest
from support import require
from test_browser import CHROMIUM, CHROMIUM_ARGS

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import build_site  # noqa: E402  (tools/build_site.py)
import editions  # noqa: E402  (tools/editions.py)

ARTIFACTS = ROOT / "test-artifacts" / "site"
LANGUAGES = tuple(build_site.EDITIONS)
CHAPTERS = [p.stem for p in build_site.chapters_of(build_site.EDITIONS["en"])]
PAGES = ["index", *CHAPTERS, "search"]  # every page of one language
SEARCHES = {"en": "LayerNorm", "zh": "层归一化"}
RAW_TEX = re.compile(r"\$[^$\s][^$]*\$|\\frac|\\\(|\\\[|\\sqrt")


# ------------------------------------------------------------------ without a browser


def test_site_json_translates_every_text_and_nothing_else():
    words = build_site.Words()
    syllabus = build_site.syllabus_texts()
    problems = [f"syllabus: no Chinese for {t!r}" for t in syllabus if not words.groups["syllabus"].get(t, "").strip()]
    problems += [
        f"syllabus: {t!r} is no longer in docs/syllabus.md" for t in words.groups["syllabus"] if t not in syllabus
    ]
    used_by_site = "".join(p.read_text(encoding="utf-8") for p in (ROOT / "site").rglob("*.html"))
    used_by_site += pathlib.Path(build_site.__file__).read_text(encoding="utf-8")
    used_by_site = re.sub(r'"\s*\n\s*"', "", used_by_site)  # a long text is split over source lines
    for text, chinese in words.groups["interface"].items():
        if not chinese.strip():
            problems.append(f"interface: no Chinese for {text!r}")
        if text not in used_by_site:
            problems.append(f"interface: {text!r} is used neither by site/ nor by tools/build_site.py")
        fields = re.findall(r"\{\w+\}", text)
        if fields != re.findall(r"\{\w+\}", chinese):
            problems.append(f"interface: {text!r}: the Chinese must keep the fields {fields}")
    import furo
    import sphinx

    theme_files = [*pathlib.Path(furo.__file__).parent.rglob("*.html")]
    theme_files += pathlib.Path(sphinx.__file__).parent.joinpath("themes", "basic", "static").glob("*.js")
    theme_templates = "".join(p.read_text(encoding="utf-8") for p in theme_files)
    for text, chinese in words.groups["theme"].items():
        if not chinese.strip():
            problems.append(f"theme: no Chinese for {text!r}")
        if text.strip() not in theme_templates:
            problems.append(f"theme: {text!r} is not a word of the theme's templates or Sphinx's search scripts")
    assert not problems, "translations/zh/site.json:\n" + "\n".join(problems)


def test_a_chapter_page_holds_no_grader_marker_or_live_widget_and_folds_every_answer():
    path = build_site.EDITIONS["en"].source / "01_attention.ipynb"
    source = json.loads(path.read_text(encoding="utf-8"))
    notebook = build_site.site_notebook(source, path.name, "en", build_site.Words())
    text = json.dumps(notebook)
    for marker in (editions.SOLUTION_BEGIN, editions.SOLUTION_END, editions.HIDDEN_BEGIN, editions.HIDDEN_END):
        assert marker not in text, marker
    assert build_site.WIDGET_VIEW not in text and "widgets" not in notebook["metadata"]
    exercises = [c for c in source["cells"] if c.get("metadata", {}).get("nbgrader", {}).get("solution")]
    sources = [editions.source_text(c) for c in notebook["cells"]]
    assert sum('class="tl-solution"' in s for s in sources) == len(exercises) == 5
    assert sum('class="tl-hints"' in s for s in sources) == len(exercises)
    assert sum("# YOUR CODE HERE" in s for s in sources) == len(exercises)  # the blank function shows
    assert len({c["id"] for c in notebook["cells"]}) == len(notebook["cells"])


def test_the_chinese_page_gives_the_hints_in_chinese_and_the_widget_line_too():
    path = build_site.EDITIONS["zh"].source / "01_attention.ipynb"
    notebook = build_site.site_notebook(
        json.loads(path.read_text(encoding="utf-8")), path.name, "zh", build_site.Words()
    )
    sources = "".join(editions.source_text(c) for c in notebook["cells"])
    assert "的提示（第 1 条，共 3 条）" in sources and "Hint 1 of" not in sources
    still = [o for c in notebook["cells"] for o in c.get("outputs", []) if "tl-widget-note" in str(o.get("data"))]
    assert still and "交互控件" in str(still[0]["data"])


@pytest.mark.parametrize("lang", LANGUAGES)
def test_every_chapter_page_opens_in_colab_and_kaggle_from_the_readme_place(lang, tmp_path):
    """The staged context gives each chapter Colab and Kaggle links to its learner edition in the page's language,
    at the README's OWNER/REPO and the release's tag (as the READMEs' tables and the install lines have them)."""
    import install_cell

    edition = build_site.EDITIONS[lang]
    context = build_site.stage(edition, build_site.Words(), tmp_path)
    repository = build_site.repository_url().removeprefix("https://github.com/")
    folder = "notebooks/zh" if lang == "zh" else "notebooks"
    tag = "v" + install_cell.version()
    assert set(context["pages"]) == set(CHAPTERS)
    for name, page in context["pages"].items():
        source = f"github.com/{repository}/blob/{tag}/{folder}/{name}.ipynb"
        assert page["colab"] == f"https://colab.research.google.com/{source.replace('github.com/', 'github/', 1)}"
        assert page["kaggle"] == f"https://kaggle.com/kernels/welcome?src=https://{source}"
        assert (ROOT / folder / f"{name}.ipynb").exists()
    template = (ROOT / "site" / "templates" / "page.html").read_text(encoding="utf-8")
    for key, words in (("colab", "Open in Colab"), ("kaggle", "Open in Kaggle")):
        assert f'href="{{{{ tl_chapter.{key} }}}}">{{{{ tl_("{words}") }}}}' in template


def test_the_glossary_gives_jieba_its_terms():
    terms = build_site.glossary_terms()
    assert "层归一化" in terms and "多头注意力" in terms and len(terms) >= 40
    assert all(re.fullmatch(r"[\u4e00-\u9fff\w]+", t) for t in terms), [t for t in terms if " " in t]


# ------------------------------------------------------------------ the built site, in a browser


@pytest.fixture(scope="module")
def site() -> pathlib.Path:
    """The built site: reused if it was built from the files as they are now, else built (both languages)."""
    try:
        import myst_nb  # noqa: F401
    except ImportError:
        require(False, "the site's tools are not installed: pip install -r requirements-site.txt")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    if build_site.is_fresh(build_site.OUT):
        note = "reused a fresh build"
    else:
        start = time.monotonic()
        seconds = build_site.build(build_site.OUT)
        note = (
            f"built in {time.monotonic() - start:.1f} s ("
            + ", ".join(f"{k} {v:.1f} s" for k, v in seconds.items())
            + ")"
        )
    (ARTIFACTS / "timings.txt").write_text(note + "\n", encoding="utf-8")
    return build_site.OUT


@pytest.fixture(scope="module")
def server(site):
    """An HTTP server on 127.0.0.1 serving the site; yields its base address."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:  # noqa: ANN002
            pass

    class Server(http.server.ThreadingHTTPServer):
        def handle_error(self, request, client_address) -> None:  # noqa: ANN001
            if not isinstance(sys.exc_info()[1], ConnectionError):  # a page left before a file was sent: fine
                super().handle_error(request, client_address)

    httpd = Server(("127.0.0.1", 0), functools.partial(Quiet, directory=str(site)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture(scope="module")
def context(server):
    """One Chromium context for the module (each test opens its own page in it)."""
    require(pathlib.Path(CHROMIUM).exists(), f"no Chromium at {CHROMIUM}: install it with apt-get install chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            context = chromium.new_context(viewport={"width": 1300, "height": 1000}, service_workers="block")
            context.set_default_timeout(60_000)  # every wait bounded, also on a loaded machine
            yield context
        finally:
            chromium.close()


@pytest.fixture(scope="module")
def tab(context, server):
    """One tab for all of the module's pages. A new tab per page cost about twice the CPU of a navigation in the same
    one (30 pages: 105-113 s of CPU against 43-44 s, measured side by side), on a machine the whole test run keeps
    busy."""
    made = Visit(context, server)
    yield made
    made.close()


@pytest.fixture
def visit(tab):
    """The module's tab, its problems cleared; after the test it is sent to about:blank, which ends whatever the test
    left loading (a fresh tab replaces it if even that fails)."""
    tab.problems.clear()
    yield tab
    try:
        tab.page.goto("about:blank")
    except Exception:  # noqa: BLE001 - a crashed or hung tab: the next test gets a new one
        tab.renew()
    tab.problems.clear()


@pytest.fixture(autouse=True)
def watchdog(request):
    """A browser test that hangs (a page whose script never returns: no Playwright call can time out then) ends
    the test process after 5 minutes with every thread's traceback, instead of holding the run until CI's limit."""
    if "context" not in request.fixturenames and "visit" not in request.fixturenames:
        yield
        return
    faulthandler.dump_traceback_later(300, exit=True)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


class Visit:
    """A page opened with every request checked: any that leaves the site's origin is refused and recorded, and
    so is every console error, uncaught exception and failed response."""

    def __init__(self, context, server: str) -> None:  # noqa: ANN001
        self.origin = urllib.parse.urlsplit(server).netloc
        self.server = server
        self.context = context
        self.problems: list[str] = []
        self._new_page()

    def _new_page(self) -> None:
        self.page = self.context.new_page()
        self.page.route("**/*", self._route)
        self.page.on("console", lambda m: m.type == "error" and self.problems.append(f"console error: {m.text}"))
        self.page.on("pageerror", lambda e: self.problems.append(f"uncaught: {e}"))
        self.page.on("response", lambda r: r.status >= 400 and self.problems.append(f"HTTP {r.status}: {r.url}"))

    def _route(self, route) -> None:  # noqa: ANN001
        url = urllib.parse.urlsplit(route.request.url)
        if url.scheme in ("data", "blob") or url.netloc == self.origin:
            route.continue_()
        else:
            self.problems.append(f"a request left the site: {route.request.url}")
            route.abort()

    def open(self, path: str) -> None:
        """Load the page and wait until MathJax has typeset it, every wait bounded by Playwright's own timer.

        A page that does not get there in time (Chromium starved of CPU on a loaded machine: in a full test run a
        page once never answered) is loaded once more in a fresh tab, and the retry is recorded in
        test-artifacts/site/retries.txt; a second failure fails the test. (`page.evaluate` has no timeout: a page
        whose renderer never answers would hold the test for ever, so the wait is `wait_for_function`'s.)
        """
        from playwright.sync_api import Error as PlaywrightError

        try:
            self._load(path)
        except PlaywrightError as error:
            with (ARTIFACTS / "retries.txt").open("a", encoding="utf-8") as log:
                log.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {path}: {str(error).splitlines()[0]}; loaded again\n")
            self.renew()
            self._load(path)

    def _load(self, path: str) -> None:
        self.page.goto(f"{self.server}/{path}")
        self.page.wait_for_load_state("load")
        # MathJax typesets after the page loaded; its promise settles when every formula is done. If MathJax
        # failed it never settles: after 90 s this is a timeout, and the formulas' count would say what is missing.
        self.page.wait_for_function(TYPESET, timeout=90_000, polling=200)

    def renew(self) -> None:
        """A fresh tab in place of this one (a page that failed or hung), its problems forgotten."""
        self.page.close()
        self.problems.clear()
        self._new_page()

    def close(self) -> None:
        self.page.close()


TYPESET = """() => {
    if (!(window.MathJax && MathJax.startup && MathJax.startup.promise)) return true;
    if (window.tlTypeset === undefined) {
        window.tlTypeset = false;
        const done = () => { window.tlTypeset = true; };
        MathJax.startup.promise.then(done, done);
    }
    return window.tlTypeset;
}"""
# Text a reader sees, without code, outputs and typeset formulas (where `$` or `\frac` may legitimately stand).
PROSE = """() => {
    const main = document.querySelector('article') || document.body;
    const copy = main.cloneNode(true);
    copy.querySelectorAll('pre, code, mjx-container, script, style, .highlight, .output').forEach(n => n.remove());
    return copy.textContent;
}"""
IMAGES = """() => [...document.images].map(
    img => ({src: img.getAttribute('src'), ok: img.complete && img.naturalWidth > 0}))"""


def page_ids() -> list:
    return [pytest.param(lang, page, id=f"{lang}-{page}") for lang in LANGUAGES for page in PAGES]


@pytest.mark.slow
def test_the_site_has_exactly_the_pages_tested(site):
    for lang in LANGUAGES:
        built = sorted(p.stem for p in (site / lang).glob("*.html"))
        assert built == sorted(PAGES), f"{lang}: pages built {built}, tested {sorted(PAGES)}"
    assert (site / "index.html").exists() and (site / ".nojekyll").exists()


@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.parametrize(("lang", "page"), page_ids())
def test_every_page_loads_offline_typeset_and_switches_language(lang, page, visit, server, site):
    visit.open(f"{lang}/{page}.html")
    prose = visit.page.evaluate(PROSE)
    raw = sorted(set(RAW_TEX.findall(prose)))
    assert not raw, f"{lang}/{page}: formulas left as raw TeX: {raw[:5]}"
    html_text = (site / lang / f"{page}.html").read_text(encoding="utf-8")
    formulas = html_text.count('class="math notranslate nohighlight"')
    typeset = visit.page.locator("mjx-container").count()
    assert typeset >= formulas, f"{lang}/{page}: {formulas} formulas, {typeset} typeset"
    for image in visit.page.evaluate(IMAGES):
        assert image["ok"], f"{lang}/{page}: the image {image['src']} did not load"
    if page in CHAPTERS:
        bar = visit.page.locator(".tl-chapter-bar")
        notebook = "notebooks/zh/" if lang == "zh" else "notebooks/"
        assert bar.locator("a.tl-binder").get_attribute("href").endswith(f"lab/tree/{notebook}{page}.ipynb")
        assert bar.locator("a.tl-download").get_attribute("href") == f"notebooks/{page}.ipynb"
        assert bar.locator("a.tl-repository").get_attribute("href").startswith("https://github.com/")
        for service, start in (
            ("colab", "https://colab.research.google.com/github/"),
            ("kaggle", "https://kaggle.com/"),
        ):
            href = bar.locator(f"a.tl-{service}").get_attribute("href")
            assert href.startswith(start) and href.endswith(f"/{notebook}{page}.ipynb"), href
    if lang == "zh" and page != "search":  # the theme speaks Chinese too
        chrome = visit.page.locator("footer, .sidebar-search-container").all_inner_texts()
        english = [w for w in ("Next", "Previous", "Search", "Back to top") if w in " ".join(chrome)]
        assert not english, f"zh/{page}: the theme's words in English: {english}"
    if page == "01_attention":
        visit.page.screenshot(path=str(ARTIFACTS / f"01_attention-{lang}.png"))
    twin = "zh" if lang == "en" else "en"
    with visit.page.expect_navigation(wait_until="commit"):  # the twin page is checked in its own test
        visit.page.locator("a.tl-language-switch").first.click()
    assert visit.page.url == f"{server}/{twin}/{page}.html", f"{lang}/{page}: the switch went to {visit.page.url}"
    assert not visit.problems, f"{lang}/{page}:\n" + "\n".join(visit.problems)


@pytest.mark.slow
@pytest.mark.browser
def test_the_root_page_offers_both_languages(visit, server):
    visit.open("index.html")
    for lang in LANGUAGES:
        visit.page.locator(f'a[href="{lang}/index.html"]').click()
        visit.page.wait_for_load_state("load")
        assert visit.page.url == f"{server}/{lang}/index.html"
        visit.page.go_back()
    assert not visit.problems, "\n".join(visit.problems)


@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.parametrize("lang", LANGUAGES)
def test_search_finds_the_term(lang, visit):
    term = SEARCHES[lang]
    visit.open(f"{lang}/search.html?q={urllib.parse.quote(term)}")
    results = visit.page.locator("#search-results ul.search li")
    results.first.wait_for(timeout=60_000)
    links = [a.get_attribute("href") or "" for a in results.locator("a").all()]
    assert any("04_normalization" in link for link in links), f"{lang}: {term!r} found {links}"
    summary = visit.page.locator("#search-results .search-summary").inner_text()
    assert ("Search finished" in summary) == (lang == "en"), f"{lang}: the search says {summary!r}"
    assert not visit.problems, "\n".join(visit.problems)


@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.parametrize("lang", LANGUAGES)
def test_a_solution_is_hidden_until_its_control_is_clicked(lang, visit):
    visit.open(f"{lang}/01_attention.html")
    solution = visit.page.locator("details.tl-solution").nth(1)
    code = solution.locator("pre")
    assert "row_max" in (code.text_content() or "")  # the answer is in the page...
    assert not code.is_visible()  # ...folded
    solution.locator("summary").click()
    assert code.is_visible()
    hints = visit.page.locator("details.tl-hints").nth(1)
    assert not hints.locator("details.tl-hint").first.is_visible()
    hints.locator("summary").first.click()
    assert hints.locator("details.tl-hint").count() == 3
    assert not visit.problems, "\n".join(visit.problems)


# Sphinx writes every attribute in double quotes: a regular expression reads a page's ids and links much faster
# than an HTML parser would.
ATTRIBUTE = re.compile(r"<(\w+)\s[^>]*?>", re.S)
VALUE = re.compile(r'\s(id|name|href|src)="([^"]*)"')


def ids_and_targets(text: str) -> tuple[set[str], list[str]]:
    """The ids (and anchors' names) of a page, and the addresses it links to or loads."""
    ids, targets = set(), []
    for tag in ATTRIBUTE.finditer(text):
        for name, value in VALUE.findall(tag.group(0)):
            value = html.unescape(value)
            if name == "id" or (name == "name" and tag.group(1) == "a"):
                ids.add(value)
            elif name in ("href", "src") and value:
                targets.append(value)
    return ids, targets


@pytest.mark.slow
def test_every_link_inside_the_site_resolves(site):
    root = site.resolve()
    pages = {
        path.resolve(): ids_and_targets(path.read_text(encoding="utf-8"))
        for path in root.rglob("*.html")
        if root / build_site.MATHJAX_FOLDER not in path.parents
    }
    broken = []
    for path, (_, targets) in pages.items():
        for target in targets:
            parts = urllib.parse.urlsplit(target)
            if parts.scheme or parts.netloc:
                continue  # a link out of the site (Binder, the repository): not a request the page makes
            file = (path.parent / urllib.parse.unquote(parts.path)).resolve() if parts.path else path
            if file.is_dir():
                file = file / "index.html"
            where = f"{path.relative_to(root)}: {target}"
            if root not in file.parents or not file.exists():
                broken.append(f"{where} (no such file)")
            elif parts.fragment and file.suffix == ".html":
                if urllib.parse.unquote(parts.fragment) not in pages.get(file, (set(), []))[0]:
                    broken.append(f"{where} (no such anchor)")
    assert len(pages) == 1 + len(LANGUAGES) * len(PAGES)
    assert not broken, f"{len(broken)} broken links:\n" + "\n".join(broken[:40])
