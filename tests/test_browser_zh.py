"""A Chinese chapter in a real browser (issue 17): JupyterLab with its interface in Chinese (the language pack of
requirements.txt, chosen as Settings > Language or `bash run.sh lab zh` chooses it), the Chinese learner edition
of chapter 02 opened with its outputs stripped, Run All from the Chinese "运行" menu; then: the menus are Chinese,
the chapter's prose is Chinese, every code cell ran without a traceback or stderr output, the exercises' checks
print their Chinese "not done yet", and the widget renders. A screenshot goes to test-artifacts/browser/.

Without Chromium this test skips, except under CI (as tests/test_browser.py).
"""

from __future__ import annotations

import pathlib
import re
import time

import pytest
from support import require
from test_browser import (
    ARTIFACTS,
    CHROMIUM,
    CHROMIUM_ARGS,
    open_notebook,
    run_all,
    running_lab,
    shutdown_kernels,
    strip,
)

ROOT = pathlib.Path(__file__).resolve().parents[1]
CHAPTER = ROOT / "notebooks" / "zh" / "02_masking.ipynb"


@pytest.fixture(scope="module")
def lab_zh(tmp_path_factory):
    require(pathlib.Path(CHROMIUM).exists(), f"no Chromium at {CHROMIUM}: install it with apt-get install chromium")
    if not CHAPTER.exists():
        pytest.fail(f"{CHAPTER.relative_to(ROOT)} is missing: run python tools/translate.py")
    tmp = tmp_path_factory.mktemp("lab-zh")
    (tmp / "course" / "notebooks").mkdir(parents=True)
    strip(CHAPTER, tmp / "course" / "notebooks" / CHAPTER.name)
    yield from running_lab(tmp, locale="zh_CN")


def test_a_chinese_chapter_in_a_chinese_jupyterlab(lab_zh):
    from playwright.sync_api import sync_playwright

    base, token, _ = lab_zh
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000}, locale="zh-CN")
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        try:
            start = time.monotonic()
            open_notebook(page, base, token, CHAPTER.name)
            menus = page.locator(".lm-MenuBar-itemLabel").all_inner_texts()
            assert "运行" in menus and "设置" in menus, f"the menus are not Chinese: {menus}"
            run_all(page, menu="运行", item="运行所有单元格")
            ran = time.monotonic()
            panel = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)")
            stderr = panel.locator('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]')
            assert stderr.count() == 0, f"traceback or stderr output:\n{stderr.first.inner_text()}"
            prose = " ".join(panel.locator(".jp-MarkdownOutput").all_inner_texts())
            assert len(re.findall(r"[\u4e00-\u9fff]", prose)) > 1000, "the chapter's prose is not Chinese"
            outputs = " ".join(panel.locator(".jp-OutputArea-output").all_inner_texts())
            assert "尚未完成" in outputs and "not done yet" not in outputs, "the checks did not speak Chinese"
            for text in ("Error displaying widget", "Error rendering output"):
                assert panel.get_by_text(text).count() == 0, f"{text!r} in the page"
            widget = panel.locator(".jp-CodeCell:has(.widget-checkbox)").first
            widget.wait_for(timeout=60_000)
            widget.scroll_into_view_if_needed()
            page.screenshot(path=str(ARTIFACTS / "zh-02_masking.png"))
            assert not errors, f"JavaScript errors in the page: {errors}"
            line = f"zh/{CHAPTER.name}: Chinese interface, ran all cells in {ran - start:.1f} s\n"
            with (ARTIFACTS / "timings.txt").open("a", encoding="utf-8") as f:
                f.write(line)
        finally:
            page.close()
            browser.close()
            shutdown_kernels(base, token)
