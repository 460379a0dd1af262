"""`cellseg view ROOT [STORE ...]`: EM, predictions and truth crops in neuroglancer, served locally and offline.

    cellseg view DATA_ROOT OUT.zarr                        # predict-volume's store beside the EM
    cellseg view DATA_ROOT --dataset jrc_hela-2            # EM and truth crops only
    cellseg view DATA_ROOT OUT.zarr --no-browser --port 8080   # on a cluster node, behind `ssh -L`
    cellseg view DATA_ROOT OUT.zarr --screenshot view.png      # a picture from headless Chromium, then exit

Prints the viewer URL and serves until Ctrl-C (or SIGTERM); with --screenshot, writes the picture once the view's
data has loaded and stops. docs/viewing.md explains each layer, the tunnel and the screenshots.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import webbrowser
from pathlib import Path

ORDER = 91  # after show (90): the other way to look at results
LAYOUTS = ("4panel", "xy", "xz", "yz", "3d")  # = cellseg.viz.view_state.LAYOUTS (not imported: neuroglancer-free --help)
FIT_FRACTION = 0.9  # a screenshot fits the focused region into this share of a panel's shorter side
log = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `view` sub-command."""
    parser = subparsers.add_parser(
        "view", help="show EM, predictions and truth crops in neuroglancer (local, offline)",
        description="Serve a data root and prediction stores with neuroglancer's own server and print the "
                    "viewer's URL. One state holds the dataset's EM (its stored multiscale levels), every "
                    "prediction (probabilities as images in the class colour, opacity = probability; masks and "
                    "object ids as segmentations) and the dataset's truth crops, each at its world position in "
                    "nm. STORE: predict-volume's OUT.zarr, or a crop store of predict, ensemble or postprocess "
                    "(uint8 or segmentation channels). Needs the 'view' extra: pip install 'cellseg[view]'. "
                    "Runs until Ctrl-C.",
        epilog="example: cellseg view /data OUT.zarr --no-browser --port 8080  (then on your computer: "
               "ssh -N -L 8080:127.0.0.1:8080 NODE and open the printed URL)",
    )
    parser.add_argument("root", metavar="ROOT", type=Path, help="data root (cellseg synth, fetch or import)")
    parser.add_argument("stores", nargs="*", metavar="STORE", type=Path,
                        help="prediction stores to show (predict-volume OUT.zarr, or crop stores)")
    parser.add_argument("--dataset", metavar="NAME",
                        help="dataset to show (default: the one the stores cover, or the root's only one)")
    parser.add_argument("--classes", metavar="A,B",
                        help="comma-separated classes to show (default: every class of the stores; without "
                             "stores, every truth class)")
    parser.add_argument("--crop", metavar="N",
                        help="start the view on crop N of the data root (a training or test crop), fitted to its "
                             "box (default: the first store's ROI or first crop, else the whole EM)")
    parser.add_argument("--bind", default="127.0.0.1", metavar="ADDR",
                        help="address to listen on (default 127.0.0.1: this machine only; 0.0.0.0: every "
                             "network interface, for anyone who can reach this host)")
    parser.add_argument("--port", type=int, default=0, metavar="N",
                        help="port to listen on (default 0: any free port); fix it for an SSH tunnel")
    parser.add_argument("--no-browser", action="store_true", help="only print the URL (default: also open it)")
    parser.add_argument("--layers", metavar="PATTERN[,PATTERN]",
                        help="show only the layers whose names match (shell patterns, e.g. '*EM,pred/*/mito'); the "
                             "others stay in the layer bar, hidden")
    parser.add_argument("--layout", choices=LAYOUTS, default="4panel",
                        help="panels: 4panel (xy, xz, yz and 3D; default) or one of them")
    shot = parser.add_argument_group("screenshot (headless nodes, docs and reports)")
    shot.add_argument("--screenshot", type=Path, metavar="OUT.png",
                      help="render the view in headless Chromium, write OUT.png once every visible chunk has "
                           "loaded, and exit (no serving)")
    shot.add_argument("--size", default="1200x900", metavar="WxH", help="picture size in pixels (default 1200x900)")
    shot.add_argument("--browser", metavar="PATH",
                      help="the Chromium or Chrome to run (default: $CELLSEG_BROWSER, else chromium, "
                           "chromium-browser, google-chrome, ... on PATH)")
    shot.add_argument("--timeout", type=float, default=180.0, metavar="S",
                      help="give up when no picture came within S seconds (default 180)")
    parser.add_argument("--state-json", type=Path, metavar="PATH",
                        help="write the viewer state (neuroglancer JSON) to PATH")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --state-json or --screenshot file")
    parser.set_defaults(func=run)


def _write_json(path: Path, data: dict) -> None:
    """Write `data` to `path` through a temporary sibling (never a half-written file)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def run(args: argparse.Namespace) -> int:
    """Check the inputs, serve them, print the URL, wait for Ctrl-C or SIGTERM."""
    from cellseg.viz.view_layers import plan_view, show_only
    from cellseg.viz.view_serve import import_neuroglancer, serve, wait_for_signal

    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port {args.port}: choose 0 (any free port) or a port in 1..65535")
    if args.state_json is not None and args.state_json.exists() and not args.overwrite:
        raise FileExistsError(f"{args.state_json} exists; pass --overwrite to replace it")
    classes = [c.strip() for c in args.classes.split(",") if c.strip()] if args.classes else None
    try:
        import_neuroglancer()
    except ImportError as err:
        print(f"cellseg view: error: {err}", file=sys.stderr)
        return 2
    plan = plan_view(args.root, dataset=args.dataset, stores=args.stores, classes=classes, crop=args.crop)
    if args.layers:
        plan = show_only(plan, [p.strip() for p in args.layers.split(",") if p.strip()])
    if args.screenshot is not None:
        return _screenshot(args, plan)
    served = serve(plan, bind=args.bind, port=args.port, layout=args.layout)
    try:
        if args.state_json is not None:
            _write_json(args.state_json, served.state)
            log.info("wrote the viewer state to %s", args.state_json)
        num_truth = sum(layer.name.startswith("truth/") for layer in plan.layers)
        log.info("dataset %s: EM, %d prediction layers, %d truth layers", plan.dataset,
                 len(plan.layers) - 1 - num_truth, num_truth)
        print(served.url, flush=True)
        if not args.no_browser:
            webbrowser.open(served.url)
        log.info("serving %s; press Ctrl-C to stop", ", ".join(str(p) for p in plan.mounts.values()))
        signum = wait_for_signal()
        log.info("stopping (%s)", signal.Signals(signum).name)
    finally:
        served.stop()
    return 0


def _screenshot(args: argparse.Namespace, plan: object) -> int:
    """Serve `plan` on this machine only, render it in headless Chromium into --screenshot, stop."""
    from cellseg.cli._recipe import show_progress
    from cellseg.viz.figure import check_png
    from cellseg.viz.view_screenshot import find_browser, parse_size, take_screenshot
    from cellseg.viz.view_serve import serve

    size = parse_size(args.size)
    check_png(args.screenshot, overwrite=args.overwrite)
    browser = find_browser(args.browser)  # before serving: a missing browser is named at once
    panels = (size[0] / 2, size[1] / 2) if args.layout == "4panel" else size
    served = serve(plan, bind="127.0.0.1", port=args.port, layout=args.layout,  # type: ignore[arg-type]
                   fit_pixels=FIT_FRACTION * min(panels))
    try:
        if args.state_json is not None:
            _write_json(args.state_json, served.state)
        shot = take_screenshot(served, args.screenshot, size=size, browser=browser, timeout_s=args.timeout,
                               overwrite=args.overwrite, progress=show_progress(args, True))
    finally:
        served.stop()
    print(f"wrote {shot.path}: {shot.width} × {shot.height} pixels, {shot.chunks} chunks, {shot.seconds:.1f} s")
    return 0
