"""The course in a real browser: JupyterLab in headless Chromium, widgets included.

A JupyterLab server runs on 127.0.0.1 on a temporary copy of the learner edition (notebooks/,
every exercise blank), its kernels with one thread and the reduced training setting
(TRANSFORMER_LAB_QUICK=1). Each chapter that uses tl.widgets (and a small fixture,
tests/fixtures/browser/97_widget_sample.ipynb, that checks this test's own machinery) is opened
with its stored outputs and widget state stripped, so that what shows comes from the live kernel;
then Run All; then: every code cell ran, no traceback or stderr output, every check cell says "not done
yet" (tests/test_editions.py's blank run of these chapters is this one), the widgets rendered (no
"Error displaying widget"), and moving the first slider with the keyboard changes what the widget
shows. A screenshot of each notebook, with that widget in view
after the change, goes to test-artifacts/browser/, with the timings in timings.txt.

Chromium: Debian's /usr/bin/chromium (.ci/run installs it), driven by Python playwright, with
the flags that keep it off the network. Without Chromium this test skips, except under CI.
"""

from __future__ import annotations

import json
import os
import pathlib
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import nbformat
import pytest
from support import check_cells, require

ROOT = pathlib.Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "test-artifacts" / "browser"
FIXTURE = ROOT / "tests" / "fixtures" / "browser" / "97_widget_sample.ipynb"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
RUN_ALL_TIMEOUT_S = 900  # a whole chapter on a loaded 2-core machine; normally well under a minute
WIDGET_MARKERS = ("tl.widgets", "transformer_lab.widgets", "from transformer_lab import widgets")

pytestmark = [pytest.mark.slow, pytest.mark.browser]


def uses_widgets(path: pathlib.Path) -> bool:
    """Whether a notebook shows one of the course's explorers: a code cell calls tl.widgets.

    (tqdm's progress bars in chapter 09 are widgets too, but there is nothing to move on them.)
    """
    nb = nbformat.read(path, as_version=4)
    return any(
        cell.cell_type == "code" and any(marker in cell.source for marker in WIDGET_MARKERS) for cell in nb.cells
    )


WIDGET_CHAPTERS = [p for p in sorted(ROOT.glob("notebooks/[0-9][0-9]_*.ipynb")) if uses_widgets(p)]


def strip(path: pathlib.Path, dest: pathlib.Path) -> None:
    """Copy a notebook without outputs, execution counts or saved widget state."""
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    nb.metadata.pop("widgets", None)
    nbformat.write(nb, dest)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_json(path: pathlib.Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1), encoding="utf-8")


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A JupyterLab server on a temporary copy of the course; yields (base url, token, notebook folder)."""
    require(pathlib.Path(CHROMIUM).exists(), f"no Chromium at {CHROMIUM}: install it with apt-get install chromium")
    tmp = tmp_path_factory.mktemp("lab")
    (tmp / "course" / "notebooks").mkdir(parents=True)
    for path in [*WIDGET_CHAPTERS, FIXTURE]:
        strip(path, tmp / "course" / "notebooks" / path.name)
    yield from running_lab(tmp)


def running_lab(tmp: pathlib.Path, locale: str | None = None):
    """Run JupyterLab on tmp/course (its interface in `locale`, e.g. "zh_CN", if given); yield (base, token, tmp)."""
    course = tmp / "course"
    config, settings = tmp / "config", tmp / "settings"
    if locale:  # the interface's language, as Settings > Language (or `bash run.sh lab zh`) sets it
        write_json(
            settings / "@jupyterlab" / "translation-extension" / "plugin.jupyterlab-settings", {"locale": locale}
        )
    # Like Binder: no nbgrader in the lab (its server and lab extensions are installed in the test env).
    write_json(
        config / "jupyter_server_config.json",
        {
            "ServerApp": {
                "jpserver_extensions": {
                    f"nbgrader.server_extensions.{name}": False
                    for name in ("formgrader", "validate_assignment", "assignment_list", "course_list")
                }
            }
        },
    )
    # window.jupyterapp, through which the module's one page opens and closes each notebook (as Galata, JupyterLab's
    # own browser tests, does)
    write_json(
        config / "labconfig" / "page_config.json",
        {"disabledExtensions": {"@jupyter/nbgrader": True}, "exposeAppInBrowser": True},
    )
    # Off the network (no news, no update check), and every cell in the page (no windowing).
    write_json(
        settings / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings",
        {"fetchNews": "false", "checkForUpdates": False},
    )
    write_json(
        settings / "@jupyterlab" / "notebook-extension" / "tracker.jupyterlab-settings", {"windowingMode": "none"}
    )
    port, token = free_port(), secrets.token_hex(16)
    env = dict(os.environ)
    env.update(
        TRANSFORMER_LAB_QUICK="1",
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        JUPYTER_CONFIG_DIR=str(config),
        JUPYTER_RUNTIME_DIR=str(tmp / "runtime"),
        JUPYTER_DATA_DIR=str(tmp / "data"),
        IPYTHONDIR=str(tmp / "ipython"),
        MPLCONFIGDIR=str(tmp / "mpl"),
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    )
    log = (tmp / "server.log").open("w", encoding="utf-8")
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyter",
            "lab",
            "--no-browser",
            "--ip=127.0.0.1",
            f"--port={port}",
            "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={token}",
            f"--ServerApp.root_dir={course}",
            f"--LabApp.user_settings_dir={settings}",
            f"--LabApp.workspaces_dir={tmp / 'workspaces'}",
            "--LabApp.news_url=None",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
            *(["--allow-root"] if os.geteuid() == 0 else []),  # CI containers run as root
        ],
        cwd=course,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group, kernels included, so the finalizer stops them all
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            if server.poll() is not None:
                raise RuntimeError(
                    f"jupyter lab exited ({server.returncode}):\n{(tmp / 'server.log').read_text(encoding='utf-8')}"
                )
            try:
                with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=5) as reply:
                    if reply.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"jupyter lab did not answer in 180 s:\n{(tmp / 'server.log').read_text(encoding='utf-8')}"
                )
            time.sleep(0.5)  # polling the server's readiness; there is no event to wait on
        yield base, token, tmp
    finally:
        stop(server)
        log.close()
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shutil.copy(tmp / "server.log", ARTIFACTS / ("server.log" if not locale else f"server-{locale}.log"))


def stop(server: subprocess.Popen) -> None:
    """Stop the server and its kernels: SIGTERM to its process group, SIGKILL if it lingers."""
    if server.poll() is None:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(server.pid, signal.SIGKILL)  # kernels left in the group, if any
    except ProcessLookupError:
        pass
    server.wait(timeout=30)


@pytest.fixture(scope="module")
def browser(lab):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


# JavaScript run in the page.
CELLS_DONE = """() => {
    const indicator = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook-ExecutionIndicator');
    if (!indicator || indicator.getAttribute('data-status') !== 'idle') return false;
    const cells = [...document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell')];
    return cells.length > 0 && cells.every(cell => {
        const source = cell.querySelector('.jp-InputArea-editor .cm-content');
        if (source && source.textContent.trim() === '') return true;
        const prompt = cell.querySelector('.jp-InputPrompt');
        return prompt && /\\[\\d+\\]/.test(prompt.textContent);
    });
}"""
# What a widget shows: its figures, and the text of its output areas (not the slider's own readout).
WIDGET_STATE = """(cell) => JSON.stringify({
    images: [...cell.querySelectorAll('.jp-OutputArea-output img')].map(img => img.src),
    text: [...cell.querySelectorAll('.widget-output')].map(node => node.textContent).join('|'),
})"""
CHANGED = """([cell, before]) => {
    const state = JSON.parse((WIDGET_STATE)(cell)), old = JSON.parse(before);
    return (state.images.length > 0 || state.text.trim() !== '') && JSON.stringify(state) !== before;
}""".replace("(WIDGET_STATE)", f"({WIDGET_STATE})")
# Every queued update drawn: the kernel idle and what the widget shows unchanged for 1.5 s.
SETTLED = """(cell) => {
    const idle = [...document.querySelectorAll('.jp-StatusBar-TextItem')]
        .some(item => /Python 3.*\\|\\s*(?:Idle|空闲)/.test(item.textContent));
    const now = (WIDGET_STATE)(cell) + idle, memo = window.__settled || (window.__settled = {state: null, since: 0});
    if (memo.state !== now) { memo.state = now; memo.since = Date.now(); return false; }
    return idle && Date.now() - memo.since > 1500;
}""".replace("(WIDGET_STATE)", f"({WIDGET_STATE})")
KERNEL_IDLE = """() => [...document.querySelectorAll('.jp-StatusBar-TextItem')]
    .some(item => /Python 3.*\\|\\s*(?:Idle|空闲)/.test(item.textContent))"""


def api(base: str, token: str, path: str, method: str = "GET") -> object:
    request = urllib.request.Request(f"{base}{path}", headers={"Authorization": f"token {token}"}, method=method)
    with urllib.request.urlopen(request, timeout=60) as reply:
        body = reply.read()
    return json.loads(body) if body else None


def open_notebook(page, base: str, token: str, name: str) -> None:
    """Open the notebook and wait until its kernel has started and is idle (server side and in the page)."""
    page.goto(f"{base}/lab/tree/notebooks/{name}?token={token}&reset")
    wait_for_kernel(page, base, token, name)


def wait_for_kernel(page, base: str, token: str, name: str) -> None:  # noqa: ANN001
    """Wait until the notebook `name` shows its cells and its kernel has started and is idle (server side and in
    the page)."""
    page.wait_for_selector(".jp-NotebookPanel .jp-Notebook .jp-Cell", timeout=180_000)
    deadline = time.monotonic() + 180
    while not any(
        s["path"].endswith(name) and s["kernel"]["execution_state"] == "idle"
        for s in api(base, token, "/api/sessions")  # type: ignore[union-attr]
    ):
        assert time.monotonic() < deadline, f"{name}: no idle kernel after 180 s"
        page.wait_for_timeout(500)  # polling the server's REST API: the page has no event for it
    page.wait_for_function(KERNEL_IDLE, timeout=180_000, polling=500)


class LabPage:
    """One JupyterLab page for the module's notebooks: JupyterLab starts in it once (about 10 s of a loaded 2-core
    machine each time), and each test opens its notebook there and throws it away after. A test that failed leaves
    a page in an unknown state: the next test gets a fresh one."""

    def __init__(self, browser, base: str, token: str) -> None:  # noqa: ANN001
        self.browser, self.base, self.token = browser, base, token
        self.page = None
        self.errors: list[str] = []

    def open(self, name: str):  # noqa: ANN201
        """The page, with `name` (in notebooks/) open in it, its kernel started and idle; JavaScript errors from
        here on go to `self.errors`."""
        if self.page is None:
            self.page = self.browser.new_page(viewport={"width": 1400, "height": 1000})
            self.page.on("pageerror", lambda error: self.errors.append(str(error)))
            self.page.goto(f"{self.base}/lab?token={self.token}&reset")
            self.page.wait_for_function("() => !!window.jupyterapp", timeout=180_000, polling=200)
            self.page.evaluate("() => window.jupyterapp.restored.then(() => true)")
        self.errors.clear()
        self.page.evaluate(
            "path => window.jupyterapp.commands.execute('docmanager:open', {path, factory: 'Notebook'})"
            ".then(() => true)",
            f"notebooks/{name}",
        )
        wait_for_kernel(self.page, self.base, self.token, name)
        return self.page

    def close_notebooks(self) -> None:
        """Throw the open notebooks away unsaved (no "save your changes?" dialog) and stop their kernels."""
        self.page.evaluate(
            """() => { for (const widget of Array.from(window.jupyterapp.shell.widgets('main'))) {
                if (widget.context) widget.context.model.dirty = false;
                widget.dispose();
            } }"""
        )
        shutdown_kernels(self.base, self.token)

    def discard(self) -> None:
        if self.page is not None:
            self.page.close()
            self.page = None
        shutdown_kernels(self.base, self.token)


@pytest.fixture(scope="module")
def lab_page(lab, browser):
    base, token, _ = lab
    made = LabPage(browser, base, token)
    try:
        yield made
    finally:
        made.discard()


def run_all(page, menu: str = "Run", item: str = "Run All Cells") -> None:
    """Run All from JupyterLab's menu (`menu` and `item` as the interface's language labels them)."""
    page.locator(".lm-MenuBar-itemLabel", has_text=menu).first.click()
    page.locator(".lm-Menu-itemLabel", has_text=item).first.click()
    page.wait_for_function(CELLS_DONE, timeout=RUN_ALL_TIMEOUT_S * 1000, polling=500)


def shutdown_kernels(base: str, token: str) -> None:
    """Delete every session of the server (stops their kernels), so one notebook's kernel doesn't outlive its test."""
    for session in api(base, token, "/api/sessions"):  # type: ignore[union-attr]
        api(base, token, f"/api/sessions/{session['id']}", method="DELETE")


def params() -> list:
    chapters = [pytest.param(p, id=p.stem) for p in WIDGET_CHAPTERS]
    if not chapters:
        chapters = [pytest.param(None, id="no-widget-chapters")]
    return [*chapters, pytest.param(FIXTURE, id="fixture")]


@pytest.mark.parametrize("path", params())
def test_widgets_work_in_jupyterlab(path, lab_page):
    if path is None:
        pytest.fail("no chapter notebook uses tl.widgets (expected 01, 02, 04 and 08)")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    failed = True
    try:
        start = time.monotonic()
        page = lab_page.open(path.name)
        page_errors = lab_page.errors
        opened = time.monotonic()
        run_all(page)
        ran = time.monotonic()

        panel = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)")
        # an error's traceback is drawn as stderr output too
        problems = panel.locator('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]')
        assert problems.count() == 0, f"{path.name}: traceback or stderr output:\n{problems.first.inner_text()}"
        # tests/test_editions.py's blank run, here in JupyterLab: every check cell says its exercise is not done
        notebook = nbformat.read(path, as_version=4)
        cells = panel.locator(".jp-Notebook .jp-Cell")
        assert cells.count() == len(notebook.cells), f"{path.name}: {cells.count()} cells shown"
        for index in check_cells(notebook):
            printed = cells.nth(index).locator(".jp-OutputArea").inner_text()
            assert "not done yet" in printed, f"{path.name}: check cell {index} printed {printed!r}"
        # The first explorer with a slider (chapter 02's mask explorer has check boxes instead).
        controls = panel.locator(".jp-CodeCell:has(.widget-slider), .jp-CodeCell:has(.widget-checkbox)")
        controls.first.wait_for(timeout=60_000)
        for text in ("Error displaying widget", "Error rendering output", "Loading widget..."):
            assert panel.get_by_text(text).count() == 0, f"{path.name}: {text!r} in the page"

        cell = controls.first
        cell.scroll_into_view_if_needed()
        before = cell.evaluate(WIDGET_STATE)
        assert json.loads(before)["images"] or json.loads(before)["text"], f"{path.name}: the widget shows nothing"
        if cell.locator(".widget-slider").count():
            handle = cell.locator(".widget-slider .noUi-handle").first
            handle.focus()
            for _ in range(3):
                handle.press("ArrowRight")
            moved = "slider moved 3 steps"
        else:
            cell.locator(".widget-checkbox input").first.click()
            moved = "check box toggled"
        page.wait_for_function(CHANGED, arg=[cell.element_handle(), before], timeout=120_000, polling=200)
        page.wait_for_function(SETTLED, arg=cell.element_handle(), timeout=180_000, polling=250)
        page.wait_for_function(
            "(cell) => [...cell.querySelectorAll('img')].every(img => img.complete)", arg=cell.element_handle()
        )
        changed = time.monotonic()
        cell.scroll_into_view_if_needed()
        page.screenshot(path=str(ARTIFACTS / f"{path.stem}.png"))
        assert not page_errors, f"{path.name}: JavaScript errors in the page: {page_errors}"
        line = (
            f"{path.name}: opened {opened - start:.1f} s, ran all cells {ran - opened:.1f} s, "
            f"widget updated {changed - ran:.1f} s ({moved})\n"
        )
        print(line, end="")
        with (ARTIFACTS / "timings.txt").open("a", encoding="utf-8") as f:
            f.write(line)
        failed = False
    finally:
        if lab_page.page is not None and not (ARTIFACTS / f"{path.stem}.png").exists():
            lab_page.page.screenshot(path=str(ARTIFACTS / f"{path.stem}-failed.png"))
        if failed:
            lab_page.discard()  # the next test starts from a fresh page
        else:
            lab_page.close_notebooks()
