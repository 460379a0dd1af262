"""`cellseg view --screenshot OUT.png`: the viewer's state drawn by headless Chromium, once its data has loaded.

neuroglancer's client takes screenshots itself: asked through the viewer's connection (`async_screenshot`), it waits
until every chunk the view needs is loaded and drawn, then sends the canvas as a PNG, reporting the chunks loaded
as it goes. cellseg serves the same data and state as `cellseg view`, opens the viewer's URL in a headless Chromium
(software WebGL through SwiftShader: no GPU and no display needed, so it runs on a cluster's compute node), asks for
the picture at the requested size with the UI controls hidden, writes it atomically and stops the browser. This
needs no browser driver: the viewer's own connection carries the request and the picture.

Chromium runs with a new empty profile, without its background network services (sync, component updates, the
field-trial fetches), and without its sandbox: it opens only the local viewer, and the sandbox cannot start in
most containers or as root.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cellseg.viz.figure import check_png, write_atomically
from cellseg.viz.view_serve import Served

log = logging.getLogger(__name__)
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome", "headless_shell")
BROWSER_ENV = "CELLSEG_BROWSER"  # a browser's path, when it is not on PATH under one of `BROWSERS`
INSTALL_HINT = ("install Chromium (Debian/Ubuntu: apt install chromium; Fedora/RHEL: dnf install chromium; or a "
                "site module), or pass --browser PATH / set CELLSEG_BROWSER")
DEFAULT_SIZE = (1200, 900)  # pixels: a 4-panel view with 600 × 450 per panel
MAX_EDGE = 8192  # pixels: WebGL canvases beyond this fail in software rendering
TIMEOUT_S = 180.0  # for the first picture: the browser's start, the viewer's code, every visible chunk
STOP_GRACE_S = 0.5  # after the browser exits, for its helpers' last writes
SIZE_RETRIES = 3  # the first picture can come before the canvas takes the requested size (as neuroglancer retries)
FLAGS = ("--headless=new", "--no-sandbox", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-quic", "--disable-dev-shm-usage",
         "--use-angle=swiftshader", "--enable-unsafe-swiftshader", "--hide-scrollbars", "--mute-audio")


@dataclass(frozen=True)
class Screenshot:
    """What `take_screenshot` wrote."""

    path: Path
    width: int
    height: int
    chunks: int  # visible chunks the picture needed, all loaded
    seconds: float


def find_browser(given: str | None = None) -> str:
    """The Chromium or Chrome to run: `given`, else $CELLSEG_BROWSER, else the first of `BROWSERS` on PATH.

    Raises:
        FileNotFoundError: none found (the message says what to install).
    """
    choice = given or os.environ.get(BROWSER_ENV)
    if choice:
        found = shutil.which(choice)
        if found is None:
            raise FileNotFoundError(f"browser {choice!r}: not an executable on this machine; {INSTALL_HINT}")
        return found
    for name in BROWSERS:
        if (found := shutil.which(name)) is not None:
            return found
    raise FileNotFoundError(f"cellseg view --screenshot needs Chromium or Chrome and found none "
                            f"({', '.join(BROWSERS)} on PATH); {INSTALL_HINT}")


def parse_size(text: str) -> tuple[int, int]:
    """'WIDTHxHEIGHT' in pixels (e.g. 1200x900).

    Raises:
        ValueError: not two positive integers up to `MAX_EDGE`.
    """
    try:
        width, height = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise ValueError(f"--size {text!r}: give WIDTHxHEIGHT in pixels, e.g. 1200x900") from None
    if not (16 <= width <= MAX_EDGE and 16 <= height <= MAX_EDGE):
        raise ValueError(f"--size {text!r}: each side must be 16..{MAX_EDGE} pixels")
    return width, height


def _tail(path: Path, lines: int = 5) -> str:
    text = path.read_text(errors="replace").strip().splitlines() if path.is_file() else []
    # no session bus on a compute node, and Debian's launcher script's shell test: noise, not the cause
    useful = [t for t in text if "dbus" not in t.lower() and "unexpected operator" not in t]
    return " | ".join(useful[-lines:]) or "(nothing)"


class _Request:
    """One screenshot asked of the client: the reply, and the loading counts reported until it comes."""

    def __init__(self, viewer: Any, progress: Any):
        self.done = threading.Event()
        self.reply: Any = None
        self.loaded, self.total = 0, 0
        self.progress = progress
        viewer.async_screenshot(self._on_reply, statistics_callback=self._on_statistics)

    def _on_reply(self, action: Any) -> None:
        self.reply = action.screenshot
        self.done.set()

    def _on_statistics(self, statistics: Any) -> None:
        total = statistics.total
        self.total = int(total.visible_chunks_total or 0)
        self.loaded = int(total.visible_chunks_gpu_memory or 0)
        if self.progress is not None:
            self.progress.total = max(self.total, 1)
            self.progress.n = min(self.loaded, self.progress.total)
            self.progress.refresh()


def take_screenshot(served: Served, out: Path, *, size: tuple[int, int] = DEFAULT_SIZE, browser: str | None = None,
                    timeout_s: float = TIMEOUT_S, overwrite: bool = False, progress: bool = False) -> Screenshot:
    """Render `served`'s state in headless Chromium and write it to `out` (module docstring).

    Raises:
        FileNotFoundError: no browser (what to install is named), or `out`'s folder is missing.
        FileExistsError: `out` exists and `overwrite` is False.
        RuntimeError: the browser exited, or gave no picture within `timeout_s` (the chunks loaded so far and the
            end of the browser's log are named); nothing is written.
    """
    from tqdm import tqdm

    check_png(out, overwrite=overwrite)
    executable = find_browser(browser)
    viewer = served.viewer
    with viewer.txn() as state:  # no side panel: the picture is the data panels alone
        state.selected_layer.visible = False
    with viewer.config_state.txn() as config:
        config.show_ui_controls = False
        config.show_panel_borders = False
        config.viewer_size = list(size)
    start = time.monotonic()
    # a helper process that outlives the group's SIGTERM by a moment must not turn cleaning up into an error
    with tempfile.TemporaryDirectory(prefix="cellseg-chromium-", ignore_cleanup_errors=True) as profile:
        browser_log = Path(profile) / "browser.log"
        window = f"--window-size={size[0] + 64},{size[1] + 64}"  # room for the canvas at the requested size
        with open(browser_log, "wb") as log_file:
            proc = subprocess.Popen([executable, *FLAGS, f"--user-data-dir={profile}/data", window, served.url],
                                    stdout=subprocess.DEVNULL, stderr=log_file, stdin=subprocess.DEVNULL,
                                    start_new_session=True)  # its own process group: its helpers stop with it
        log.info("rendering in headless %s (pid %d), %d × %d pixels", Path(executable).name, proc.pid, *size)
        bar = tqdm(desc="screenshot: chunks loaded", unit="chunk", total=1, disable=not progress, leave=False)
        try:
            reply, chunks = _wait(served, proc, size, start, timeout_s, bar, browser_log)
        finally:
            bar.close()
            _stop(proc)
    write_atomically(out, lambda tmp: tmp.write_bytes(reply.image))
    return Screenshot(path=out, width=reply.width, height=reply.height, chunks=chunks,
                      seconds=time.monotonic() - start)


def _stop(proc: subprocess.Popen) -> None:
    """Stop Chromium and its helper processes (renderer, GPU, utility: one process group), then reap it."""
    for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:  # the group is gone
            break
        try:
            proc.wait(timeout=wait_s)
            break
        except subprocess.TimeoutExpired:
            continue
    time.sleep(STOP_GRACE_S)  # helpers finish their last writes to the profile before it is removed


def _timed_out(served: Served, request: _Request, timeout_s: float, browser_log: Path) -> str:
    """Why no picture came: the browser never connected, chunks still loading, or every chunk loaded but a layer
    never became ready (its source unreadable: the files the viewer asked for in vain are named)."""
    if request.total == 0:
        why = "the browser never reported loading anything"
    elif request.loaded < request.total:
        why = f"{request.loaded} of {request.total} visible chunks loaded"
    else:
        why = f"all {request.total} visible chunks loaded, but a layer never became ready"
    asked = {name: {m.rsplit("/", 1)[0] for m in served.missing if m.endswith("/" + name)} for name in (".zarray", ".zattrs")}
    absent = sorted(asked[".zarray"] & asked[".zattrs"])  # a group has .zattrs, an array .zarray: neither is no source
    if absent:
        why += "; no zarr array or group where a layer's source points: " + ", ".join(absent[:5])
    return f"no picture within {timeout_s:.0f} s: {why}; browser log: {_tail(browser_log)}"


def _wait(served: Served, proc: subprocess.Popen, size: tuple[int, int], start: float, timeout_s: float, bar: Any,
          browser_log: Path) -> tuple[Any, int]:
    """The client's screenshot reply at `size`, asked again when the canvas had another size."""
    for _ in range(SIZE_RETRIES):
        request = _Request(served.viewer, bar)
        while not request.done.wait(0.25):
            if proc.poll() is not None:
                raise RuntimeError(f"the browser exited (status {proc.returncode}) before the picture was taken: "
                                   f"{_tail(browser_log)}")
            if time.monotonic() - start > timeout_s:
                raise RuntimeError(_timed_out(served, request, timeout_s, browser_log))
        reply = request.reply
        if (reply.width, reply.height) == tuple(size):
            return reply, request.total
    raise RuntimeError(f"the browser drew {reply.width} × {reply.height} pixels, not the {size[0]} × {size[1]} asked")
