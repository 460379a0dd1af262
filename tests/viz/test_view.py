"""`cellseg view`: the viewer state of a synthetic root and a whole-volume store, what neuroglancer's server
serves (the viewer and the zarr chunks the viewer reads), the command's lifetime and its user errors."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import urllib.parse
from pathlib import Path

import numpy as np
import pytest

from cellseg.cli import main
from cellseg.data.crops import Catalog
from cellseg.data.grid import Grid
from cellseg.data.prediction_store import PredictionStore, quantise
from cellseg.data.write import write_multiscale
from cellseg.viz.view_layers import plan_view
from cellseg.viz.view_state import class_hex, layer_names, source_url, viewer_state

pytest.importorskip("neuroglancer")  # the 'view' extra (in dev)

DATASET = "synth-iso4-1"  # 96³ EM voxels at 4 nm, crops 1 and 2
ROI_OFFSET_NM = (64.0, 32.0, 0.0)  # the store's ROI: lower corner (edge of voxel 0), z y x
ROI_VOXEL_NM = (8.0, 8.0, 8.0)
ROI_SHAPE_VOX = (16, 24, 32)
BASE = "http://example.invalid/files"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def volume_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny predict-volume store (VOLUME_LAYOUT): probabilities of mito and er, labels (mito ids, er mask)."""
    out = tmp_path_factory.mktemp("volume") / "out.zarr"
    out.mkdir()
    (out / ".zgroup").write_text(json.dumps({"zarr_format": 2}))
    attrs = {"kind": "volume-prediction", "format": 1, "dataset": DATASET, "classes": ["mito", "er"],
             "instance_classes": ["mito"], "voxel_size_nm": list(ROI_VOXEL_NM),
             "roi_nm": {"offset": list(ROI_OFFSET_NM), "shape": [n * v for n, v in zip(ROI_SHAPE_VOX, ROI_VOXEL_NM, strict=True)]}}
    (out / ".zattrs").write_text(json.dumps({"cellseg": attrs}))
    rng = np.random.default_rng(0)
    translation = [o + v / 2 for o, v in zip(ROI_OFFSET_NM, ROI_VOXEL_NM, strict=True)]  # centre of voxel 0
    grid = {"voxel_size_nm": ROI_VOXEL_NM, "translation_nm": translation}
    for cls in ("mito", "er"):
        write_multiscale(out / "probabilities" / cls, quantise(rng.random(ROI_SHAPE_VOX)), kind="em", **grid)
    ids = rng.integers(0, 5, ROI_SHAPE_VOX).astype(np.uint64)
    write_multiscale(out / "labels" / "mito", ids, kind="labels", **grid)
    write_multiscale(out / "labels" / "er", (ids > 2).astype(np.uint8), kind="labels", **grid)
    return out


def _by_name(state: dict) -> dict[str, dict]:
    return {layer["name"]: layer for layer in state["layers"]}


def test_state_has_em_predictions_and_truth_with_sources_shaders_and_dimensions(tiny_synth_root, volume_store):
    state = viewer_state(plan_view(tiny_synth_root, stores=[volume_store]), BASE)  # dataset from the store
    names = layer_names(state)
    assert names[:5] == [f"{DATASET} EM", "out/probabilities/mito", "out/probabilities/er", "out/labels/mito",
                         "out/labels/er"]
    layers = _by_name(state)
    em = layers[f"{DATASET} EM"]
    assert em["type"] == "image"
    assert em["source"] == f"{BASE}/root/{DATASET}/{DATASET}.zarr/recon-1/em/fibsem-uint8/|zarr2:"
    for cls in ("mito", "er"):
        prob = layers[f"out/probabilities/{cls}"]
        assert prob["type"] == "image" and prob["source"] == f"{BASE}/store1/probabilities/{cls}/|zarr2:"
        assert f'color(default="{class_hex(cls)}")' in prob["shader"] and "toNormalized" in prob["shader"]
        assert "step=0.01, default=0.5)" in prob["shader"]  # the first view shows p ≥ 0.5 only: no wash over the EM
        assert layers[f"out/labels/{cls}"]["type"] == "segmentation"
    assert layers["out/labels/er"]["segmentDefaultColor"] == class_hex("er")  # a mask: the class colour
    assert "segmentDefaultColor" not in layers["out/labels/mito"]  # ids: a colour per object
    # global dimensions z, y, x at the EM's 4 nm (neuroglancer writes metres); the xy panel shows x across
    assert state["dimensions"] == {axis: [4e-9, "m"] for axis in "zyx"}
    assert state["displayDimensions"] == ["x", "y", "z"]
    # the view starts at the store's ROI centre: corner (64, 32, 0) nm + half of (128, 192, 256) nm, in 4 nm units
    assert state["position"] == [32.0, 32.0, 32.0]
    # without a whole-volume store, at the EM's centre: voxel centres from 0 nm, 96 voxels of 4 nm -> 190 nm
    assert viewer_state(plan_view(tiny_synth_root, dataset=DATASET), BASE)["position"] == [47.5, 47.5, 47.5]
    # truth: the dataset's crops, for the stores' classes only, hidden under the predictions
    truth = [n for n in names if n.startswith("truth/")]
    assert truth == ["truth/crop1/er", "truth/crop1/mito", "truth/crop2/er", "truth/crop2/mito"]
    assert all(layers[n]["type"] == "segmentation" and layers[n]["visible"] is False for n in truth)
    assert layers[truth[0]]["source"].startswith(f"{BASE}/root/{DATASET}/{DATASET}.zarr/recon-1/labels/groundtruth/")
    # neuroglancer's own state class takes the state as it is
    import neuroglancer

    assert neuroglancer.ViewerState(state).to_json()["layers"] == state["layers"]


def test_truth_sources_declare_the_crops_world_offsets(tiny_synth_root):
    """Each truth layer's source is the crop's group, whose OME-NGFF translation (neuroglancer places layers by
    it) is the manifest's (nm); without stores every truth class shows."""
    plan = plan_view(tiny_synth_root, dataset=DATASET)
    crops = {c.name: c for c in Catalog.from_dir(tiny_synth_root).crops_of(DATASET)}
    truth = [layer for layer in plan.layers if layer.name.startswith("truth/")]
    assert {layer.name.split("/")[1] for layer in truth} == set(crops)
    assert all(layer.visible for layer in truth)
    by_name = {layer.name: layer for layer in truth}
    for crop in crops.values():
        for cls, geometry in crop.labels.items():  # every class the manifest lists for the crop
            layer = by_name[f"truth/{crop.name}/{cls}"]
            zattrs = json.loads((tiny_synth_root / layer.path / ".zattrs").read_text())
            s0 = zattrs["multiscales"][0]["datasets"][0]["coordinateTransformations"]
            assert s0 == [{"type": "scale", "scale": list(geometry.voxel_size_nm)},
                          {"type": "translation", "translation": list(geometry.translation_nm)}]


def test_crop_stores_show_uint8_float16_and_segmentation_channels(tiny_synth_root, tmp_path, caplog):
    caplog.set_level("INFO", logger="cellseg.viz.view_layers")
    crop = Catalog.from_dir(tiny_synth_root).train[1]
    g = crop.labels["mito"]
    grid = Grid.of(translation_nm=g.translation_nm, shape_vox=g.shape_vox, voxel_size_nm=g.voxel_size_nm)
    ids = np.zeros(g.shape_vox, np.uint32)
    ids[4:9, 4:9, 4:9] = 7
    seg = PredictionStore.create(tmp_path / "seg.zarr", kind="segmentation", channels=["mito", "er"],
                                 instance_channels=["mito"])
    seg.write_crop("crop1", grid, {"mito": ids, "er": ids > 0}, attrs={"dataset": crop.dataset})
    probs = np.full(g.shape_vox, 0.5, np.float32)
    for name, data in (("u8", quantise(probs)), ("f16", probs)):
        store = PredictionStore.create(tmp_path / f"{name}.zarr", kind="probabilities", channels=["mito"])
        store.write_crop("crop1", grid, {"mito": data}, attrs={"dataset": crop.dataset})
    plan = plan_view(tiny_synth_root, stores=[tmp_path / "seg.zarr", tmp_path / "u8.zarr", tmp_path / "f16.zarr"],
                     dataset=crop.dataset)
    layers = {layer.name: layer for layer in plan.layers}
    assert {"seg/crop1/mito", "seg/crop1/er", "u8/crop1/mito", "f16/crop1/mito"} <= set(layers)  # none dropped
    assert "1 float16 channels served as uint8" in caplog.text
    assert layers["seg/crop1/mito"].kind == "labels" and layers["seg/crop1/mito"].dtype == "<u4"
    assert layers["u8/crop1/mito"].kind == "probabilities"
    assert layers["f16/crop1/mito"].dtype == "|u1" and layers["f16/crop1/mito"].mount == "store3+u8"
    assert source_url(BASE, layers["seg/crop1/er"]) == f"{BASE}/store1/crop1/er/|zarr2:"
    # served: the float16 array reads as the uint8 one `--uint8` wrote, chunk for chunk
    from cellseg.viz.view_serve import serve

    served = serve(plan, port=0)
    try:
        state = _by_name(served.state)
        f16 = state["f16/crop1/mito"]["source"].removesuffix("|zarr2:")
        u8 = state["u8/crop1/mito"]["source"].removesuffix("|zarr2:")
        meta = json.loads(_get(f16 + "s0/.zarray"))
        assert meta["dtype"] == "|u1" and meta["compressor"] is None
        u8_meta = json.loads(_get(u8 + "s0/.zarray"))
        assert meta["shape"] == u8_meta["shape"] and meta["chunks"] == u8_meta["chunks"]
        chunk = "s0/" + "0.0.0".replace(".", u8_meta.get("dimension_separator", "."))
        import numcodecs

        stored = (tmp_path / "u8.zarr" / "crop1" / "mito" / chunk).read_bytes()
        want = numcodecs.get_codec(u8_meta["compressor"]).decode(stored) if u8_meta["compressor"] else stored
        assert _get(f16 + chunk) == bytes(want) and set(_get(f16 + chunk)) == {128}  # round(255 · 0.5)
        assert json.loads(_get(f16 + ".zattrs")) == json.loads((tmp_path / "f16.zarr/crop1/mito/.zattrs").read_text())
        with pytest.raises(HTTPStatus):  # nothing outside the served store
            _get(f16 + "../../../../etc/passwd")
    finally:
        served.stop()


def _get(url: str) -> bytes:
    """The body at `url` (one HTTP GET, its connection closed); another status than 200 raises `HTTPStatus`."""
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        connection.request("GET", parts.path)
        response = connection.getresponse()
        body = response.read()
    finally:
        connection.close()
    if response.status != 200:
        raise HTTPStatus(response.status)
    return body


class HTTPStatus(Exception):
    """A response other than 200 OK."""

    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status


def test_server_serves_the_viewer_and_the_chunks_it_reads(tiny_synth_root, volume_store):
    from cellseg.viz.view_serve import serve

    served = serve(plan_view(tiny_synth_root, stores=[volume_store]), port=0)
    try:
        assert served.url.startswith("http://127.0.0.1:")
        assert b"<html" in _get(served.url).lower()  # the viewer client bundled in neuroglancer's wheel
        layers = _by_name(served.state)
        em = layers[f"{DATASET} EM"]["source"].removesuffix("|zarr2:")
        assert em.startswith(served.data_url)
        em_dir = tiny_synth_root / DATASET / f"{DATASET}.zarr" / "recon-1" / "em" / "fibsem-uint8"
        assert json.loads(_get(em + ".zattrs")) == json.loads((em_dir / ".zattrs").read_text())
        assert json.loads(_get(em + "s0/.zarray"))["shape"] == [96, 96, 96]
        assert _get(em + "s0/0/0/0") == (em_dir / "s0" / "0" / "0" / "0").read_bytes()  # a chunk, as stored
        prob = layers["out/probabilities/mito"]["source"].removesuffix("|zarr2:")
        assert _get(prob + "s0/0/0/0") == (volume_store / "probabilities" / "mito" / "s0" / "0" / "0" / "0").read_bytes()
        with pytest.raises(HTTPStatus) as missing:  # a chunk never written: the viewer uses the fill value
            _get(em + "s0/9/9/9")
        assert missing.value.status == 404
        with pytest.raises(HTTPStatus):  # nothing outside the served folders
            _get(served.data_url + "/root/../../../etc/passwd")
    finally:
        served.stop()
    with pytest.raises(ConnectionError):  # stopped: the port no longer answers
        _get(served.url)


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


def test_command_prints_the_url_writes_the_state_and_stops_on_ctrl_c(tiny_synth_root, volume_store, tmp_path):
    state_path = tmp_path / "state.json"
    command = [sys.executable, "-m", "cellseg", "view", str(tiny_synth_root), str(volume_store), "--no-browser",
               "--port", "0", "--classes", "mito", "--state-json", str(state_path)]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
                          cwd=tmp_path) as proc:
        try:
            url = proc.stdout.readline().strip()
            assert url.startswith("http://127.0.0.1:") and "/v/" in url, url or proc.stderr.read()
            assert b"<html" in _get(url).lower()
            state = json.loads(state_path.read_text())
            assert [n for n in layer_names(state) if n.startswith("out/")] == ["out/probabilities/mito",
                                                                                "out/labels/mito"]
            assert len(_get(state["layers"][0]["source"].removesuffix("|zarr2:") + "s0/0/0/0")) > 0
            proc.send_signal(signal.SIGINT)  # Ctrl-C
            assert proc.wait(timeout=30) == 0
            assert "stopping (SIGINT)" in proc.stderr.read()
        finally:
            if proc.poll() is None:
                proc.kill()


@pytest.mark.parametrize(("args", "message"), [
    (["{missing}"], "no such data root"),
    (["{root}", "--dataset", "jrc_nope"], "dataset 'jrc_nope' is not in"),
    (["{root}"], "choose one with --dataset"),
    (["{root}", "{root}"], "not a prediction store"),
    (["{root}", "{folder}"], "not a prediction store"),
    (["{root}", "{missing}"], "no prediction store here"),
    (["{root}", "{store}", "--dataset", "synth-iso8-1"], f"covers dataset '{DATASET}'"),
    (["{root}", "--dataset", DATASET, "--classes", "mitto"], "no prediction or truth layer of mitto"),
    (["{root}", "--dataset", DATASET, "--port", "70000"], "--port 70000"),
])
def test_bad_input_is_a_clear_error_before_serving(tiny_synth_root, volume_store, tmp_path, capsys, args, message):
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "notes.txt").write_text("not a store")
    paths = {"root": tiny_synth_root, "missing": tmp_path / "absent", "folder": folder, "store": volume_store}
    assert main(["view", *(a.format(**paths) for a in args), "--no-browser"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("cellseg view: error:") and message in err, err


def test_without_neuroglancer_the_error_names_the_install_command(tiny_synth_root):
    code = ("import sys; sys.modules['neuroglancer'] = None; from cellseg.cli import main; "
            f"sys.exit(main(['view', {str(tiny_synth_root)!r}, '--dataset', {DATASET!r}, '--no-browser']))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=120)
    assert done.returncode == 2
    assert "pip install 'cellseg[view]'" in done.stderr and "Traceback" not in done.stderr


def test_an_existing_state_file_is_kept_without_overwrite(tiny_synth_root, tmp_path, capsys):
    state = tmp_path / "state.json"
    state.write_text("{}")
    assert main(["view", str(tiny_synth_root), "--dataset", DATASET, "--state-json", str(state), "--no-browser"]) == 2
    assert "--overwrite" in capsys.readouterr().err and state.read_text() == "{}"


def test_the_first_view_is_fitted_and_centred_on_the_focused_region(tiny_synth_root, volume_store):
    from cellseg.viz.view_state import FIT_PIXELS, MIN_SCALE

    crop = Catalog.from_dir(tiny_synth_root).train[1]  # a crop of the dataset of `volume_store`
    g = crop.labels["mito"]
    plan = plan_view(tiny_synth_root, stores=[volume_store], crop="1")
    centre = [t - v / 2 + n * v / 2 for t, v, n in zip(g.translation_nm, g.voxel_size_nm, g.shape_vox, strict=True)]
    assert plan.focus_nm == pytest.approx(centre) and plan.focus_extent_nm == pytest.approx(
        [n * v for n, v in zip(g.shape_vox, g.voxel_size_nm, strict=True)])
    state = viewer_state(plan, BASE)
    voxel = plan.em_levels[0].voxel_size_nm
    assert state["position"] == pytest.approx([c / v for c, v in zip(centre, voxel, strict=True)])
    largest = max(n * v / e for n, v, e in zip(g.shape_vox, g.voxel_size_nm, voxel, strict=True))
    assert state["crossSectionScale"] == pytest.approx(max(MIN_SCALE, largest / FIT_PIXELS))
    assert state["crossSectionScale"] < 1  # a small crop is zoomed in, not one voxel per screen pixel
    roi = plan_view(tiny_synth_root, stores=[volume_store])  # no crop asked: the store's ROI
    attrs = json.loads((volume_store / ".zattrs").read_text())["cellseg"]["roi_nm"]
    assert roi.focus_extent_nm == pytest.approx(attrs["shape"])
    with pytest.raises(ValueError, match="--crop 999: not a crop of"):
        plan_view(tiny_synth_root, stores=[volume_store], crop="999")
    with pytest.raises(ValueError, match="--crop 5: a crop of synth-iso8-1, not of the dataset shown"):
        plan_view(tiny_synth_root, stores=[volume_store], crop="5")


def test_the_commands_layouts_are_the_states():
    from cellseg.cli.view import LAYOUTS as OFFERED  # a copy: `cellseg view --help` imports no matplotlib
    from cellseg.viz.view_state import LAYOUTS

    assert OFFERED == LAYOUTS
