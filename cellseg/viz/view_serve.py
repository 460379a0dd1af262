"""Serving `cellseg view`: neuroglancer's own server holds the viewer and the data, on one port, offline.

`neuroglancer.Viewer()` starts neuroglancer's tornado server, which serves the viewer client bundled in
its wheel (no internet, no CDN). The data root and each store are added to that same server as
read-only folders under a random token (`/cellseg/<token>/<mount>/...`), with neuroglancer's CORS
static-file handler (`neuroglancer.static_file_server.CorsStaticFileHandler`), so the viewer reads the zarr
chunks as files and one port (one SSH tunnel) carries everything. (neuroglancer's `StaticFileServer` would
take a second, random port; `LocalVolume` would re-encode every chunk in Python and cannot use the stored
pyramid levels.) A store's float16 arrays are also served transcoded to uint8 under a mount of their own
(`cellseg.viz.view_transcode`).
"""

from __future__ import annotations

import logging
import re
import signal
import threading
from dataclasses import dataclass, field
from types import FrameType, ModuleType
from typing import Any

from cellseg.viz.view_layers import ViewPlan
from cellseg.viz.view_state import FIT_PIXELS, viewer_state
from cellseg.viz.view_transcode import TRANSCODED_SUFFIX, handler_class

log = logging.getLogger(__name__)
INSTALL_HINT = "pip install 'cellseg[view]'"
FILES_PREFIX = "cellseg"  # URL path of the served folders: /cellseg/<token>/<mount>/<path>


def import_neuroglancer() -> ModuleType:
    """The `neuroglancer` package.

    Raises:
        ImportError: it is not installed; the message names the install command.
    """
    try:
        import neuroglancer
        import neuroglancer.static_file_server
    except ImportError as err:
        raise ImportError(f"cellseg view needs neuroglancer (the optional 'view' extra): {INSTALL_HINT}") from err
    return neuroglancer


@dataclass
class Served:
    """A running viewer: its URL, where the data is served, the state it shows."""

    url: str
    data_url: str
    state: dict[str, Any]
    viewer: Any
    missing: list[str] = field(default_factory=list)  # served paths the viewer asked for and no file answered

    def stop(self) -> None:
        """Stop neuroglancer's server (the viewer URL stops answering)."""
        import neuroglancer.server

        neuroglancer.server.stop()


def serve(plan: ViewPlan, *, bind: str = "127.0.0.1", port: int = 0, layout: str = "4panel",
          fit_pixels: float = FIT_PIXELS) -> Served:
    """Start neuroglancer's server on `bind`:`port` (0: any free port), serve `plan`'s folders, show its state
    in `layout` (`view_state.LAYOUTS`), the focused region fitted into `fit_pixels` screen pixels.

    Raises:
        ImportError: neuroglancer is not installed.
        OSError: the address or port cannot be bound (e.g. the port is taken).
    """
    ng = import_neuroglancer()
    from neuroglancer.random_token import make_random_token
    from neuroglancer.static_file_server import CorsStaticFileHandler

    if ng.server.is_server_running():
        ng.server.stop()  # a server of an earlier call in this process, possibly on another port
    ng.set_server_bind_address(bind, port)
    viewer = ng.Viewer()
    server = ng.server.global_server
    token = make_random_token()
    missing: list[str] = []
    transcoding, files = (_noting_misses(h, missing) for h in (handler_class(), CorsStaticFileHandler))
    routes = [(rf"/{FILES_PREFIX}/{token}/{re.escape(mount)}/(.*)",
               transcoding if mount.endswith(TRANSCODED_SUFFIX) else files, {"path": str(path.resolve())})
              for mount, path in plan.mounts.items()]
    # Runs before any URL is handed out, so no request races the new routes; ".*" matches any host name.
    server.app.add_handlers(r".*", routes)
    data_url = f"{server.server_url}/{FILES_PREFIX}/{token}"
    state = viewer_state(plan, data_url, layout=layout, fit_pixels=fit_pixels)
    viewer.set_state(ng.ViewerState(state))
    return Served(url=viewer.get_viewer_url(), data_url=data_url, state=state, viewer=viewer, missing=missing)


def _noting_misses(handler: type, missing: list[str]) -> type:
    """`handler`, noting in `missing` the mount-relative path of every request it answers with 404 (the viewer
    also probes for optional metadata files, so a miss is a clue, not an error)."""

    class Noting(handler):  # type: ignore[misc, valid-type]
        def on_finish(self) -> None:
            if self.get_status() == 404:
                missing.append(self.request.path.split("/", 4)[-1])  # /cellseg/<token>/<mount>/<path>
            super().on_finish()

    return Noting


def wait_for_signal() -> int:
    """Block until SIGINT (Ctrl-C) or SIGTERM; return the signal's number."""
    received: list[int] = []
    done = threading.Event()

    def handler(signum: int, _frame: FrameType | None) -> None:
        received.append(signum)
        done.set()

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while not done.wait(timeout=1.0):  # a timeout keeps the main thread responsive to signals
            pass
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
    return received[0]
