"""Real-browser fixtures: one JupyterLab server and one Chromium for the whole test session.

- ``lab_server`` (session): JupyterLab on 127.0.0.1, a free port and a random token, in a fresh
  temporary root that holds a copy of ``widgets_e2e.ipynb``; config, data, runtime, settings and
  workspace folders all live in that root, so nothing from the user's own Jupyter setup leaks in
  (and the news / update popups are switched off). Stopped (``/api/shutdown``, then signals) and
  deleted at the end; its log is kept as ``test-artifacts/browser/jupyterlab.log``.
- ``browser`` (session): Debian's Chromium (``/usr/bin/chromium``, or ``PACKSIM_CHROMIUM``) driven
  by Python Playwright with the flags DESIGN.md lists. Never ``playwright install``. The tests skip
  only when no Chromium executable exists; anything else that goes wrong fails.
- ``notebook_page`` (module): the test notebook opened in JupyterLab; waits for ``Idle`` in the
  status bar, then Run > Run All Cells through the menu, until the last cell prints
  ``DONE_MARKER`` (a cell that raises fails at once with its traceback).
- ``lab`` (function): that page, with screenshots ``test-artifacts/browser/<test>-<step>.png``;
  when the test fails, a ``failure`` screenshot and a dump of the notebook's error outputs, the
  log console (errors raised in widget click handlers land there), the browser console and the
  server log.

JupyterLab runs with ``expose_app_in_browser`` so the tests can read the notebook's outputs from
its model (``window.jupyterapp``); the learner-facing clicks all go through the DOM.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
NOTEBOOK = HERE / "widgets_e2e.ipynb"
ARTIFACTS = REPO / "test-artifacts" / "browser"
DEFAULT_CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
DONE_MARKER = "packsim-e2e: all cells ran"  # printed by the notebook's last cell
SERVER_START_S = 60
KERNEL_IDLE_S = 60
RUN_ALL_S = float(os.environ.get("PACKSIM_BROWSER_RUN_S", 90))  # more on a busy machine
VIEWPORT = {"width": 1500, "height": 1000}
TRACEBACK = "Traceback (most recent call last)"
SHOTS: list[Path] = []  # every screenshot of this session, listed in the terminal summary


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "browser: drives Chromium against a live JupyterLab (tests/browser)"
    )


def pytest_terminal_summary(terminalreporter):
    """List this session's screenshots (CI keeps test-artifacts/ as artifacts)."""
    if SHOTS:
        terminalreporter.section("browser screenshots")
        for path in SHOTS:
            terminalreporter.write_line(str(path))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Keep each phase's report on the item, so fixtures can tell whether the test failed."""
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)


# ---- Chromium -----------------------------------------------------------------------------------


def find_chromium() -> str | None:
    """The Chromium to drive: ``$PACKSIM_CHROMIUM`` if set, else /usr/bin/chromium or PATH's."""
    wanted = os.environ.get("PACKSIM_CHROMIUM")
    if wanted:
        if not (os.path.isfile(wanted) and os.access(wanted, os.X_OK)):
            pytest.fail(f"PACKSIM_CHROMIUM={wanted!r} is not an executable file; fix or unset it")
        return wanted
    if os.access(DEFAULT_CHROMIUM, os.X_OK):
        return DEFAULT_CHROMIUM
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="session")
def chromium_path() -> str:
    path = find_chromium()
    if path is None:
        pytest.skip(
            "no Chromium executable: looked at $PACKSIM_CHROMIUM, /usr/bin/chromium and PATH "
            "(install Debian's chromium with apt, as .ci/run does; never `playwright install`)"
        )
    return path


@pytest.fixture(scope="session")
def browser(chromium_path):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(
            executable_path=chromium_path, args=CHROMIUM_FLAGS, headless=True
        )
        try:
            yield chromium
        finally:
            chromium.close()


# ---- JupyterLab server --------------------------------------------------------------------------


@dataclass
class LabServer:
    """A running JupyterLab: ``url`` (no trailing slash), ``token``, its ``root`` and log."""

    url: str
    token: str
    root: Path
    log_path: Path
    process: subprocess.Popen

    def notebook_url(self, name: str) -> str:
        return f"{self.url}/lab/tree/{name}?token={self.token}"

    def api(self, path: str, method: str = "GET", timeout: float = 5) -> bytes:
        request = urllib.request.Request(
            f"{self.url}/api/{path}",
            method=method,
            headers={"Authorization": f"token {self.token}"},
            data=b"" if method == "POST" else None,
        )
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.read()

    def log_tail(self, n_lines: int = 40) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError as err:
            return f"(no server log: {err})"
        return "\n".join(lines[-n_lines:])


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1))


def _prepare_root(root: Path, port: int, token: str, theme: str | None = None) -> dict[str, str]:
    """Lay out an isolated Jupyter home under ``root``; returns the environment for the server.

    ``theme``: a JupyterLab theme name (e.g. "JupyterLab Dark"), set in the user settings that
    the server reads (``@jupyterlab/apputils-extension:themes``), as a learner's choice would be.
    """
    for sub in ("notebooks", "config", "data", "runtime", "settings", "workspaces", "ipython"):
        (root / sub).mkdir()
    shutil.copy(NOTEBOOK, root / "notebooks" / NOTEBOOK.name)
    if theme is not None:
        _write_json(root / "settings" / "@jupyterlab" / "apputils-extension" / "themes.jupyterlab-settings",
                    {"theme": theme})
    _write_json(
        root / "config" / "jupyter_server_config.json",
        {
            "ServerApp": {
                "ip": "127.0.0.1",
                "port": port,
                "port_retries": 0,
                "open_browser": False,
                "root_dir": str(root / "notebooks"),
                "terminals_enabled": False,
                "jpserver_extensions": {"jupyter_lsp": False},  # no language servers: faster
                "allow_root": os.getuid() == 0,
            },
            "IdentityProvider": {"token": token},
            "LabApp": {
                "user_settings_dir": str(root / "settings"),
                "workspaces_dir": str(root / "workspaces"),
                "news_url": None,
                "check_for_updates_class": "jupyterlab.NeverCheckForUpdate",
                "expose_app_in_browser": True,  # window.jupyterapp: read outputs on failure
            },
        },
    )
    _write_json(
        root / "settings" / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings",
        {"fetchNews": "false", "checkForUpdates": False},
    )
    env = dict(os.environ)
    env.update(
        JUPYTER_CONFIG_DIR=str(root / "config"),
        JUPYTER_DATA_DIR=str(root / "data"),
        JUPYTER_RUNTIME_DIR=str(root / "runtime"),
        IPYTHONDIR=str(root / "ipython"),
        PYDEVD_DISABLE_FILE_VALIDATION="1",
    )
    env.setdefault("PACKSIM_FAST", "1")
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def _wait_until_up(server: LabServer) -> None:
    deadline = time.monotonic() + SERVER_START_S
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            pytest.fail(
                f"JupyterLab exited with code {server.process.returncode} before answering; "
                f"log:\n{server.log_tail()}"
            )
        try:
            server.api("status", timeout=2)
            return
        except (urllib.error.URLError, OSError):
            time.sleep(0.25)
    pytest.fail(f"JupyterLab did not answer within {SERVER_START_S} s; log:\n{server.log_tail()}")


def _stop(server: LabServer) -> None:
    """Ask the server to shut down (it stops its kernels), then escalate to signals."""
    try:
        server.api("shutdown", method="POST")
    except (urllib.error.URLError, OSError):
        pass
    for sig, wait_s in ((None, 15), (signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        if sig is not None:
            server.process.send_signal(sig)
        try:
            server.process.wait(wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


_CLEANED: list[bool] = []


def _clean_artifacts() -> None:
    """Once per session: screenshots and logs of an earlier run would mislead."""
    if not _CLEANED:
        for old in [*ARTIFACTS.glob("*.png"), *ARTIFACTS.glob("jupyterlab*.log")]:
            old.unlink(missing_ok=True)
        _CLEANED.append(True)


@pytest.fixture(scope="session")
def lab_server(chromium_path) -> Iterator[LabServer]:
    """JupyterLab in a fresh temporary root (requests Chromium first: no browser, no server)."""
    yield from _serve()


@pytest.fixture(scope="session")
def dark_lab_server(chromium_path) -> Iterator[LabServer]:
    """A second JupyterLab, its theme set to JupyterLab Dark in its user settings."""
    yield from _serve(theme="JupyterLab Dark", log_name="jupyterlab-dark.log")


def _serve(theme: str | None = None, log_name: str = "jupyterlab.log") -> Iterator[LabServer]:
    _clean_artifacts()
    root = Path(tempfile.mkdtemp(prefix="packsim-lab-"))
    port, token = _free_port(), os.urandom(16).hex()
    env = _prepare_root(root, port, token, theme)
    log_path = root / "jupyterlab.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "jupyterlab", "--no-browser"],
            cwd=root,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    server = LabServer(f"http://127.0.0.1:{port}", token, root, log_path, process)
    try:
        _wait_until_up(server)
        yield server
    finally:
        _stop(server)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shutil.copy(log_path, ARTIFACTS / log_name)
        shutil.rmtree(root, ignore_errors=True)


# ---- the notebook page --------------------------------------------------------------------------

# Every output of the open notebook, read from JupyterLab's model (window.jupyterapp).
_OUTPUTS_JS = """() => {
  const app = window.jupyterapp;
  const panel = app && app.shell.currentWidget;
  if (!panel || !panel.content || !panel.content.model) { return null; }
  const cells = panel.content.model.cells;
  const found = [];
  for (let i = 0; i < cells.length; i++) {
    const cell = cells.get(i);
    if (cell.type !== 'code') { continue; }
    const outputs = cell.outputs;
    for (let j = 0; j < outputs.length; j++) {
      found.push({cell: i, source: cell.sharedModel.getSource(), output: outputs.get(j).toJSON()});
    }
  }
  return found;
}"""


@dataclass
class NotebookPage:
    """The open test notebook: the Playwright ``page`` and what the browser logged."""

    page: object
    server: LabServer
    console: list[str] = field(default_factory=list)

    def screenshot(self, test_name: str, step: str, locator=None) -> Path:
        """Save ``test-artifacts/browser/<test name>-<step>.png`` (one element, or the page)."""
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        name = re.sub(r"\[(.*)\]$", r"-\1", test_name)  # test_x[param] -> test_x-param
        path = ARTIFACTS / f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', name)}-{step}.png"
        if locator is None:
            self.page.screenshot(path=str(path), full_page=True)
        else:
            locator.scroll_into_view_if_needed()
            locator.screenshot(path=str(path))
        SHOTS.append(path)
        print(f"screenshot: {path}")
        return path

    def outputs(self) -> list[dict]:
        return self.page.evaluate(_OUTPUTS_JS) or []

    def errors(self) -> list[str]:
        """The notebook's error outputs (and tracebacks printed to stderr), as text."""
        found = []
        for item in self.outputs():
            out = item["output"]
            if out.get("output_type") == "error":
                tb = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(out.get("traceback", [])))
                found.append(f"cell {item['cell']}:\n{item['source']}\n--> {tb}")
            elif out.get("name") == "stderr" and TRACEBACK in str(out.get("text", "")):
                found.append(f"cell {item['cell']} stderr:\n{out['text']}")
        return found

    def log_console(self) -> str:
        """JupyterLab's log console: where errors raised in widget callbacks (clicks) end up."""
        self.page.evaluate("() => window.jupyterapp.commands.execute('logconsole:open')")
        panel = self.page.locator(".jp-LogConsolePanel")
        panel.first.wait_for(timeout=5_000)
        return panel.first.inner_text()

    def diagnostics(self) -> str:
        """Everything useful after a failure: notebook errors, widget callback log, browser
        console, server log."""
        try:
            errors = self.errors()
        except Exception as err:  # the page itself may be gone
            errors = [f"(could not read the notebook's outputs: {err})"]
        try:
            log = self.log_console()
        except Exception as err:
            log = f"(could not open the log console: {err})"
        parts = [
            "--- notebook error outputs ---",
            "\n\n".join(errors) or "(none)",
            "--- JupyterLab log console (widget callbacks) ---",
            log.strip() or "(empty)",
            "--- browser console (last 40) ---",
            "\n".join(self.console[-40:]) or "(empty)",
            "--- JupyterLab log (end) ---",
            self.server.log_tail(),
        ]
        return "\n".join(parts)


def _kernel_idle_in_status_bar(page):
    """The status bar's kernel item, e.g. 'Python 3 (ipykernel) | Idle' (the toolbar's circle
    says idle before the kernel is really ready)."""
    return page.locator(".jp-StatusBar-Widget").get_by_text(re.compile(r"\|\s*Idle\s*$"))


def _run_all_cells(page) -> None:
    """Run > Run All Cells, through the menu bar as a learner would."""
    page.locator(".lm-MenuBar-item", has_text=re.compile(r"^\s*Run\s*$")).click()
    page.locator('.lm-Menu-item[data-command="runmenu:run-all"]').click()


def _wait_for_run(nb: NotebookPage, run_s: float = RUN_ALL_S) -> None:
    """Until the last cell prints DONE_MARKER; fail at once (with the error) if a cell raises."""
    deadline = time.monotonic() + run_s
    while time.monotonic() < deadline:
        outputs = nb.outputs()
        if any(DONE_MARKER in str(o["output"].get("text", "")) for o in outputs):
            return
        errors = nb.errors()
        if errors:
            pytest.fail("a notebook cell failed during Run All:\n" + "\n\n".join(errors))
        time.sleep(0.5)
    pytest.fail(f"Run All did not reach the last cell within {run_s} s\n{nb.diagnostics()}")


@pytest.fixture(scope="module")
def notebook_page(browser, lab_server) -> Iterator[NotebookPage]:
    """The test notebook open in JupyterLab with every cell run; screenshots opened/ran."""
    yield from _open_and_run(browser, lab_server, NOTEBOOK.name, "notebook")


def _open_and_run(browser, lab_server: LabServer, name: str, label: str,
                  run_s: float = RUN_ALL_S) -> Iterator[NotebookPage]:
    """Open notebook ``name`` of the server, Run All, wait for ``DONE_MARKER``; yield the page."""
    from playwright.sync_api import expect

    context = browser.new_context(viewport=VIEWPORT)
    page = context.new_page()
    page.set_default_timeout(30_000)
    nb = NotebookPage(page, lab_server)
    page.on("console", lambda msg: nb.console.append(f"[{msg.type}] {msg.text}"))
    page.on("pageerror", lambda err: nb.console.append(f"[pageerror] {err}"))
    try:
        page.goto(lab_server.notebook_url(name))
        try:
            expect(_kernel_idle_in_status_bar(page)).to_be_visible(timeout=KERNEL_IDLE_S * 1000)
        except AssertionError as err:
            nb.screenshot(label, "kernel-not-idle")
            pytest.fail(f"the kernel never showed Idle in the status bar: {err}\n{nb.diagnostics()}")
        nb.screenshot(label, "opened")
        _run_all_cells(page)
        _wait_for_run(nb, run_s)
        nb.screenshot(label, "ran")
        yield nb
    finally:
        context.close()


@pytest.fixture
def lab(notebook_page, request) -> Iterator[NotebookPage]:
    """The notebook page for one test; on failure, a ``failure`` screenshot and diagnostics."""
    yield notebook_page
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        try:
            notebook_page.screenshot(request.node.name, "failure")
        except Exception as err:
            print(f"(no failure screenshot: {err})")
        print(notebook_page.diagnostics())


# ---- the dark theme (test_dark_theme.py) --------------------------------------------------------

DARK_NOTEBOOK = "dark_widgets.ipynb"
_DARK_CELLS = (
    "from packsim import viz\nfrom packsim.core.data import make_examples",
    "viz.leakage_explorer(make_examples(6, seed=0))  # untrained tiny model: only the mask differs",
    "viz.quiz(0)",
    "viz.packing_playground(n=40)  # a plotly figure inside a widget",
    f"print({DONE_MARKER!r})",
)


@pytest.fixture(scope="module")
def dark_notebook_page(browser, dark_lab_server) -> Iterator[NotebookPage]:
    """Two widgets (leakage explorer, quiz) run in the dark-theme JupyterLab."""
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook

    nb = new_notebook(cells=[new_code_cell(src) for src in _DARK_CELLS])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, dark_lab_server.root / "notebooks" / DARK_NOTEBOOK)
    # a second kernel next to the first server's: allow it more than RUN_ALL_S on a busy machine
    yield from _open_and_run(browser, dark_lab_server, DARK_NOTEBOOK, "dark", run_s=3 * RUN_ALL_S)
