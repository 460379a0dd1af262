"""`cellseg view` in a real browser: headless Chromium draws the viewer's state of a tiny synthetic root and a crop
store, and the picture shows the EM, and the prediction's class colour exactly where the store puts it in world
space (a store written with a wrong voxel size is caught: its colour lands elsewhere; a layer whose source is wrong
gives no picture and is named). Skipped, with the reason, where no Chromium is installed."""

from __future__ import annotations

import colorsys
import dataclasses
import io
import json
import os
from pathlib import Path

import numpy as np
import pytest

from cellseg.cli import main
from cellseg.data.crops import Catalog
from cellseg.data.grid import Grid
from cellseg.data.prediction_store import PredictionStore, quantise
from cellseg.viz.view_layers import plan_view, show_only
from cellseg.viz.view_screenshot import find_browser, take_screenshot
from cellseg.viz.view_serve import serve
from cellseg.viz.view_state import class_hex, layer_names

pytest.importorskip("neuroglancer")
try:
    BROWSER = find_browser()
except FileNotFoundError as err:
    if os.environ.get("CELLSEG_REQUIRE_BROWSER"):  # CI installed Chromium: its absence is a failure, not a skip
        raise
    pytest.skip(f"no browser for the real-browser test: {err}", allow_module_level=True)

SIZE = (480, 480)  # one xy panel
FIT = 400  # the crop fits into this many pixels
BLOCK = (slice(None), slice(4, 12), slice(2, 10))  # where the store's probability is 1 (crop voxels, z y x)
COLOURED = 60  # max - min of RGB (0..255): the class colour at strength 0.7 over grey EM; grey EM has 0
HUE_TOLERANCE = 0.035  # of the hue circle (about 12 degrees): orange mito, not the yellow box or the red axis
MARGIN_PX = 3  # pixels left out along the block's edges (resampling, half-pixel conventions)


def _store(root: Path, out: Path, *, scale: float = 1.0) -> tuple[Path, Grid]:
    """A crop store over training crop 1 with mito probability 1 in `BLOCK`, 0 elsewhere; `scale` multiplies the
    voxel size written into its multiscale metadata (1: right; else a store placed wrongly on purpose)."""
    crop = Catalog.from_dir(root).train[1]
    g = crop.labels["mito"]
    grid = Grid.of(translation_nm=g.translation_nm, shape_vox=g.shape_vox, voxel_size_nm=g.voxel_size_nm)
    probs = np.zeros(g.shape_vox, np.float32)
    probs[BLOCK] = 1.0
    store = PredictionStore.create(out, kind="probabilities", channels=["mito"])
    store.write_crop("crop1", grid, {"mito": quantise(probs)}, attrs={"dataset": crop.dataset})
    if scale != 1.0:
        attrs_path = out / "crop1" / "mito" / ".zattrs"
        attrs = json.loads(attrs_path.read_text())
        for ds in attrs["multiscales"][0]["datasets"]:
            for t in ds["coordinateTransformations"]:
                if t["type"] == "scale":
                    t["scale"] = [v * scale for v in t["scale"]]
        attrs_path.write_text(json.dumps(attrs))
    return out, grid


def _picture(root: Path, store: Path, out: Path, *, source: str | None = None, timeout_s: float = 120
             ) -> tuple[np.ndarray, dict]:
    """The xy panel of the store's crop 1 with its EM and prediction; `source` replaces the prediction layer's
    path (a source broken on purpose)."""
    from PIL import Image

    plan = show_only(plan_view(root, stores=[store], crop="1"), ["*EM", "pred/*"])
    if source is not None:
        plan = dataclasses.replace(plan, layers=tuple(dataclasses.replace(layer, path=source)
                                                      if layer.name.startswith("pred/") else layer
                                                      for layer in plan.layers))
    served = serve(plan, layout="xy", fit_pixels=FIT)
    try:
        take_screenshot(served, out, size=SIZE, browser=BROWSER, timeout_s=timeout_s)
        state = served.state
    finally:
        served.stop()
    return np.asarray(Image.open(io.BytesIO(out.read_bytes())).convert("RGB")).astype(int), state


def _block_pixels(state: dict, grid: Grid) -> tuple[slice, slice]:
    """Rows (y) and columns (x) of the xy panel that `BLOCK` covers, from the state's position and zoom."""
    em_voxel_nm = [d[0] * 1e9 for d in state["dimensions"].values()]  # z, y, x
    scale = state["crossSectionScale"]  # EM voxels per screen pixel
    out = []
    for axis, centre_px in ((1, SIZE[1] / 2), (2, SIZE[0] / 2)):
        lo_nm = grid.translation_nm[axis] - grid.voxel_size_nm[axis] / 2 + BLOCK[axis].start * grid.voxel_size_nm[axis]
        hi_nm = lo_nm + (BLOCK[axis].stop - BLOCK[axis].start) * grid.voxel_size_nm[axis]
        to_px = lambda nm, a=axis, c=centre_px: c + (nm / em_voxel_nm[a] - state["position"][a]) / scale  # noqa: E731
        out.append(slice(round(to_px(lo_nm)), round(to_px(hi_nm))))
    return out[0], out[1]


def _mito(pixels: np.ndarray) -> np.ndarray:
    """Pixels of mito's colour: strongly coloured (grey EM has none) and of its hue, which blending over grey keeps
    (the crop's yellow box, the red and green axis lines have other hues)."""
    hue_of = lambda rgb: colorsys.rgb_to_hsv(*(c / 255 for c in rgb))[0]  # noqa: E731
    target = hue_of([int(class_hex("mito")[i:i + 2], 16) for i in (1, 3, 5)])
    rgb = pixels / 255
    top, bottom = rgb.max(axis=-1), rgb.min(axis=-1)
    spread = np.where(top > bottom, top - bottom, 1.0)
    r, g, b = np.moveaxis(rgb, -1, 0)
    hue = np.where(top == r, (g - b) / spread % 6, np.where(top == g, (b - r) / spread + 2, (r - g) / spread + 4)) / 6
    return ((top - bottom) * 255 > COLOURED) & (np.abs(hue - target) < HUE_TOLERANCE)


def _inner(s: slice) -> slice:
    return slice(s.start + MARGIN_PX, s.stop - MARGIN_PX)


def test_the_browser_draws_the_em_and_the_prediction_where_the_store_puts_it(tiny_synth_root, tmp_path):
    store, grid = _store(tiny_synth_root, tmp_path / "pred.zarr")
    pixels, state = _picture(tiny_synth_root, store, tmp_path / "view.png")
    assert pixels.shape == (SIZE[1], SIZE[0], 3)
    assert layer_names(state)[:2] == [f"{Catalog.from_dir(tiny_synth_root).train[1].dataset} EM", "pred/crop1/mito"]
    rows, cols = _block_pixels(state, grid)
    assert rows.stop - rows.start > 4 * MARGIN_PX and cols.stop - cols.start > 4 * MARGIN_PX  # zoomed in
    mito = _mito(pixels)
    assert mito[_inner(rows), _inner(cols)].mean() > 0.95, "the prediction is not drawn where the store puts it"
    outside = np.ones(mito.shape, bool)
    outside[rows.start - MARGIN_PX:rows.stop + MARGIN_PX, cols.start - MARGIN_PX:cols.stop + MARGIN_PX] = False
    assert mito[outside].mean() < 0.001, "the prediction's colour is drawn outside its block"
    grey = pixels[outside].mean(axis=-1)
    assert grey.std() > 10 and 20 < grey.mean() < 235, "the EM is not drawn (blank or saturated)"


def test_a_store_with_a_wrong_voxel_size_is_caught(tiny_synth_root, tmp_path):
    store, grid = _store(tiny_synth_root, tmp_path / "pred.zarr", scale=2.0)
    pixels, state = _picture(tiny_synth_root, store, tmp_path / "view.png")
    rows, cols = _block_pixels(state, grid)
    assert _mito(pixels)[_inner(rows), _inner(cols)].mean() < 0.95  # the check above fails for a misplaced layer


def test_a_layer_with_a_wrong_source_is_named(tiny_synth_root, tmp_path):
    store, _ = _store(tiny_synth_root, tmp_path / "pred.zarr")
    with pytest.raises(RuntimeError, match="no zarr array or group where a layer's source points: crop1/nothing"):
        _picture(tiny_synth_root, store, tmp_path / "view.png", source="crop1/nothing", timeout_s=45)
    assert not (tmp_path / "view.png").exists()


def test_the_command_writes_the_picture_and_refuses_what_it_cannot_do(tiny_synth_root, tmp_path, capsys):
    store, _ = _store(tiny_synth_root, tmp_path / "pred.zarr")
    out = tmp_path / "shot.png"
    args = ["view", str(tiny_synth_root), str(store), "--screenshot", str(out), "--size", "320x240", "--crop", "1"]
    assert main(args) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "wrote" in capsys.readouterr().out
    assert main(args) == 2 and "exists; pass --overwrite" in capsys.readouterr().err
    assert main([*args, "--overwrite", "--browser", "no-such-browser"]) == 2
    assert "install Chromium" in capsys.readouterr().err
    assert main([*args, "--overwrite", "--layers", "nothing*"]) == 2
    assert "--layers nothing*: no such layer" in capsys.readouterr().err
    assert main([*args, "--overwrite", "--size", "10x10"]) == 2
