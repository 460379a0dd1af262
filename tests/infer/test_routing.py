"""A routed `cellseg predict-ensemble` on the tiny synthetic root, whose test crops come at 4 nm (crop501) and
16 nm (crop502): two 8 nm runs serve the band (0, 8] nm, one 16 nm run the band (8, 32] nm. Each crop equals the
plain predict-ensemble of its band's members (a band of one: that run's `cellseg predict`), bit for bit; a killed
run resumes; every bad plan is a one-line error (exit 2) before anything is written."""

from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from cellseg.cli import main as cli
from cellseg.config import load_run_config
from cellseg.config.inference import InferConfig, RouteConfig
from cellseg.config.load import from_dict
from cellseg.data.crops import Crop, Geometry
from cellseg.data.prediction_store import PredictionStore
from cellseg.infer.fused import predict_ensemble
from cellseg.infer.predict import predict_run
from cellseg.infer.routing import annotation_scale, predict_routed, route_crops
from cellseg.infer.selection import CropTarget
from cellseg.infer.weights import WEIGHTS_FILE

OPTS = InferConfig(tta=8, overlap=0.0, batch_size=8, checkpoint="last", progress=False)
FLAGS = ["--tta", "8", "--overlap", "0", "--batch-size", "8", "--checkpoint", "last"]  # OPTS on the command line
FINE, COARSE = "crop501", "crop502"  # 4 nm and 16 nm test crops of `tiny_synth_root`
SMOKE_3D = Path(__file__).resolve().parents[2] / "configs" / "smoke" / "unet_3d.yaml"


def train_coarse(root: Path, run_dir: Path, *overrides: str) -> Path:
    """The 3D smoke model trained at 16 nm (as `tiny_run` is trained at 8 nm)."""
    from cellseg.train.trainer import train

    train(load_run_config(SMOKE_3D, [f"data.root={root}", f"run_dir={run_dir}", "data.voxel_size_nm=[16,16,16]",
                                     *overrides]))
    return run_dir


@pytest.fixture(scope="module")
def coarse_run(tiny_synth_root, tmp_path_factory) -> Path:
    """The 3D smoke model at 16 nm."""
    return train_coarse(tiny_synth_root, tmp_path_factory.mktemp("runs") / "coarse")


def bands(fine: list[Path], coarse: list[Path], *, fine_weights: object = "uniform") -> list[dict]:
    return [{"band_nm": [0, 8], "members": [str(r) for r in fine], "weights": fine_weights},
            {"band_nm": [8, 32], "members": [str(r) for r in coarse]}]


def recipe(path: Path, routes: list[dict]) -> Path:
    path.write_text("# routed\n" + yaml.safe_dump({"ensemble": {"routes": routes}}))
    return path


def routes_of(routes: list[dict]) -> list[RouteConfig]:
    return [from_dict(RouteConfig, r) for r in routes]


def assert_same_crop(got: PredictionStore, want: PredictionStore, crop: str) -> None:
    assert got.grid(crop) == want.grid(crop) and got.crop_channels(crop) == want.crop_channels(crop)
    for channel in got.crop_channels(crop):
        np.testing.assert_array_equal(got.read(crop, channel), want.read(crop, channel), err_msg=f"{crop}/{channel}")


def test_routed_equals_each_bands_plain_ensemble(tiny_run, tiny_run_2d, coarse_run, tmp_path, capsys, caplog):
    plan = bands([tiny_run, tiny_run_2d], [coarse_run], fine_weights=[3, 1])
    out = tmp_path / "routed.zarr"
    with caplog.at_level(logging.WARNING, logger="cellseg.infer.routing"):
        assert cli(["predict-ensemble", str(recipe(tmp_path / "routed.yaml", plan)), "--crops", "test",
                    "--out", str(out), *FLAGS]) == 0
    routed = PredictionStore.open(out)
    assert routed.completed() == [FINE, COARSE]
    predict_ensemble([tiny_run, tiny_run_2d], FINE, tmp_path / "fine.zarr", weights=[3.0, 1.0], opts=OPTS)
    predict_run(coarse_run, COARSE, tmp_path / "coarse.zarr", OPTS)  # a band of one run: its own prediction
    assert_same_crop(routed, PredictionStore.open(tmp_path / "fine.zarr"), FINE)
    assert_same_crop(routed, PredictionStore.open(tmp_path / "coarse.zarr"), COARSE)
    assert routed.grid(FINE).voxel_size_nm == (8.0, 8.0, 8.0) and routed.grid(COARSE).voxel_size_nm == (16.0,) * 3
    assert routed.crop_attrs(FINE)["band_nm"] == [0, 8] and routed.crop_attrs(COARSE)["members"] == 1
    printed = capsys.readouterr().out
    assert f"{FINE} (" in printed and "2 members" in printed and "1 members" in printed
    prov = routed.provenance
    assert prov["ensemble"]["routed"] and [r["band_nm"] for r in prov["routes"]] == [[0, 8], [8, 32]]
    assert prov["routes"][1]["members"] == [str(coarse_run.resolve())]
    assert prov["weights"][0]["mito"] == [0.75, 0.25] and prov["data_root"]
    saved = json.loads((out / WEIGHTS_FILE).read_text())
    assert saved["method"] == "routed" and saved["routes"][0]["weights"]["method"] == "explicit"
    # The 16 nm crop is scored on coarse classes the smoke models do not predict: named in a warning.
    warned = [r.getMessage() for r in caplog.records if "(8, 32] nm" in r.getMessage()]
    assert warned and f"{COARSE}: cell" in warned[0] and "perox" in warned[0]


def test_killed_run_resumes(tiny_run, tiny_run_2d, coarse_run, tmp_path):
    routes = routes_of(bands([tiny_run, tiny_run_2d], [coarse_run]))
    opts = InferConfig(**{**OPTS.__dict__, "block_vox": 8, "tta": 1})  # 8² columns: each 16³ crop has four
    reference = tmp_path / "ref.zarr"
    predict_routed(routes, "test", reference, opts=opts)
    ref = PredictionStore.open(reference)
    # A run killed while writing the fine crop (planes 0-7 of its first column written) before the coarse one.
    resumed = tmp_path / "resumed.zarr"
    shutil.copytree(reference, resumed)
    shutil.rmtree(resumed / FINE)
    shutil.rmtree(resumed / COARSE)
    store = PredictionStore.open(resumed)
    writer = store.crop_writer(FINE, ref.grid(FINE), key="fused_column8", channels=ref.crop_channels(FINE))
    for channel in ref.crop_channels(FINE):
        writer.write(channel, np.full((8, 8, 8), 0.25, dtype=np.float32))
    writer.mark_done("0_0_0:8")
    summaries = predict_routed(routes, "test", resumed, opts=opts)
    assert sorted(s["crop"] for s in summaries) == [FINE, COARSE]
    assert_same_crop(store, ref, COARSE)
    first = (slice(0, 8),) * 3
    for channel in ref.crop_channels(FINE):
        got, want = store.read(FINE, channel), ref.read(FINE, channel)
        assert (got[first] == 0.25).all(), "the planes written were predicted again"
        rest = np.ones(got.shape, dtype=bool)
        rest[first] = False
        np.testing.assert_array_equal(got[rest], want[rest])
    assert predict_routed(routes, "test", resumed, opts=opts) == []  # complete: nothing to do
    with pytest.raises(ValueError, match="routes"):  # another plan does not extend the store
        predict_routed(routes_of(bands([tiny_run], [coarse_run])), "test", resumed, opts=opts)


@pytest.fixture(scope="module")
def fewer_classes_run(tiny_synth_root, tmp_path_factory) -> Path:
    """The 3D smoke model at 16 nm without the class ld."""
    return train_coarse(tiny_synth_root, tmp_path_factory.mktemp("runs") / "no_ld", "data.classes=[mito,er,nuc,ecs,pm]")


def test_bad_plans_are_one_line_errors(tiny_run, tiny_run_2d, coarse_run, fewer_classes_run, tmp_path, capsys):
    fine, coarse = [str(tiny_run), str(tiny_run_2d)], [str(coarse_run)]
    cases = {
        "no band": ([{"band_nm": [0, 8], "members": fine}],
                    r"no band for crop502 at 16×16×16 nm \(scale 16 nm\); the bands are \(0, 8\] nm"),
        "overlap": ([{"band_nm": [0, 8], "members": fine}, {"band_nm": [4, 32], "members": coarse}],
                    r"bands \(0, 8\] nm and \(4, 32\] nm overlap"),
        "unsorted": ([{"band_nm": [8, 32], "members": coarse}, {"band_nm": [0, 8], "members": fine}],
                     r"bands unsorted: \(0, 8\] nm comes after \(8, 32\] nm"),
        "voxel sizes": (bands([tiny_run], [coarse_run, tiny_run]),
                        r"band \(8, 32\] nm: members at different voxel sizes .*\[8\.0, 8\.0, 8\.0\] nm"),
        "classes": (bands([tiny_run], [coarse_run, fewer_classes_run]),
                    r"band \(8, 32\] nm: ensemble members have incompatible classes: .* lacks \['ld'\]"),
        "weights": (bands([tiny_run, tiny_run_2d], [coarse_run], fine_weights=[1, 2, 3]),
                    r"band \(0, 8\] nm: --weights gives 3 values for 2 member"),
        "empty band": ([{"band_nm": [0, 8], "members": []}], r"band \(0, 8\] nm: no members"),
    }
    for name, (routes, message) in cases.items():
        path = recipe(tmp_path / f"{name}.yaml", routes)
        assert cli(["predict-ensemble", str(path), "--crops", "test", "--out", str(tmp_path / "a.zarr"),
                    *FLAGS]) == 2, name
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.startswith("cellseg predict-ensemble: error: "), (name, err)
        assert re.search(message, err), (name, err)
    plan = recipe(tmp_path / "plan.yaml", bands([tiny_run], [coarse_run]))
    for extra, message in (([str(tiny_run_2d)], "ensemble.members .* and ensemble.routes both given"),
                           (["--weights", "1,2"], "give the weights per band")):
        assert cli(["predict-ensemble", str(plan), *extra, "--crops", "test", "--out", str(tmp_path / "a.zarr")]) == 2
        assert re.search(message, capsys.readouterr().err)
    assert not (tmp_path / "a.zarr").exists()


def test_allow_partial_averages_each_class_over_the_members_that_have_it(tiny_run, coarse_run, fewer_classes_run,
                                                                          tmp_path):
    """A coarse band whose members differ in classes, with `allow_partial`: ld comes from the one run having it,
    and the crop equals the plain partial ensemble of the band."""
    routes = routes_of(bands([tiny_run], [coarse_run, fewer_classes_run]))
    predict_routed(routes, COARSE, tmp_path / "routed.zarr", allow_partial=True, opts=OPTS)
    predict_ensemble([coarse_run, fewer_classes_run], COARSE, tmp_path / "plain.zarr", allow_partial=True, opts=OPTS)
    assert_same_crop(PredictionStore.open(tmp_path / "routed.zarr"), PredictionStore.open(tmp_path / "plain.zarr"),
                     COARSE)


def test_a_crop_goes_to_the_band_of_the_largest_edge_of_its_finest_annotation():
    """Bands are (low, high]: a crop on a bound belongs to the finer band; anisotropic crops count their largest
    edge; a crop annotated at several voxel sizes counts its finest annotation."""
    def geometry(vs: tuple[float, float, float]) -> Geometry:
        return Geometry(voxel_size_nm=vs, translation_nm=(0.0, 0.0, 0.0), shape_vox=(8, 8, 8))

    mixed = Crop(id=7, dataset="d", labels={"mito": geometry((4.0, 4.0, 4.0)), "nuc": geometry((32.0, 32.0, 32.0))})
    assert annotation_scale(mixed) == ((4.0, 4.0, 4.0), 4.0)
    assert annotation_scale(Crop(id=980, dataset="d", labels={"nuc": geometry((13.92, 16.0, 16.0))}))[1] == 16.0
    routes = routes_of([{"band_nm": [0, 4], "members": ["a"]}, {"band_nm": [4, 16], "members": ["b"]},
                        {"band_nm": [16, 64], "members": ["c"]}])
    scales = {"crop1": ((1.74, 2.0, 2.0), 2.0), "crop2": ((4.0,) * 3, 4.0), "crop3": ((4.001,) * 3, 4.001),
              "crop4": ((8.0,) * 3, 8.0), "crop5": ((16.0,) * 3, 16.0), "crop6": ((32.0,) * 3, 32.0)}
    targets = [CropTarget(name=name, dataset="d", split="test", em_url="", start_nm=(0.0,) * 3, stop_nm=(1.0,) * 3)
               for name in scales]
    assert route_crops(targets, scales, routes) == {"crop1": 0, "crop2": 0, "crop3": 0, "crop4": 1, "crop5": 1,
                                                    "crop6": 2}
    with pytest.raises(ValueError, match=r"no band for crop6 at 32×32×32 nm \(scale 32 nm\); the bands are "
                                         r"\(0, 4\] nm, \(4, 16\] nm"):
        route_crops(targets, scales, routes[:2])
