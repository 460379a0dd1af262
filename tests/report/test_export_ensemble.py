"""`cellseg export DECISIONS`: an ensemble with its decisions as one package. On the report's two smoke runs: the
package predicts the same crop store (`predict-ensemble PACKAGE`) and the same whole-volume store (`predict-volume
PACKAGE`) as the runs with their decisions file, bit for bit with the torch backend and to float32 rounding with
ONNX Runtime; it checks itself; a decisions file whose member is gone is refused and nothing is written."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cellseg.cli import main as cli
from cellseg.data.prediction_store import PredictionStore
from cellseg.export.package import check_export
from cellseg.volume.store import VolumeStore

CPU = ("--overlap", "0", "--device", "cpu")  # as the report fixture predicted (conftest FAST)
VOLUME = ("--dataset", "synth-iso8-1", "--device", "cpu", "--workers", "1", "--block-vox", "32", "--roi-nm",
          "796:1052,396:780,1196:1708", "volume.chunk_vox=32", "infer.overlap=0", "volume.cpu_workers=1")


@pytest.fixture(scope="module")
def package(report_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("export") / "ensemble"
    assert cli(["export", str(report_dir / "decisions.json"), "--out", str(out)]) == 0
    return out


def _same(a: PredictionStore, b: PredictionStore, *, exact: bool) -> None:
    assert a.completed() == b.completed() and sorted(a.channels) == sorted(b.channels)
    for crop in a.completed():
        for channel in a.channels:
            x, y = a.read(crop, channel).astype(np.float32), b.read(crop, channel).astype(np.float32)
            if exact:
                np.testing.assert_array_equal(x, y, err_msg=f"{crop}/{channel}")
            else:  # float32 rounding of the graph, stored as float16: within one float16 step
                np.testing.assert_allclose(y, x, rtol=2**-10, atol=2**-14, err_msg=f"{crop}/{channel}")


def test_the_package_holds_its_members_and_decisions(package, report_dir, report_runs):
    doc = json.loads((package / "ensemble.json").read_text())
    assert doc["kind"] == "ensemble" and doc["members"] == [r.name for r in report_runs]
    decisions = json.loads((package / "decisions.json").read_text())
    original = json.loads((report_dir / "decisions.json").read_text())
    assert [m["run_dir"] for m in decisions["members"]] == [f"members/{r.name}" for r in report_runs]
    assert decisions["weights"] == original["weights"] and decisions["classes"] == original["classes"]
    for name in doc["members"]:
        assert (package / "members" / name / "rdf.yaml").is_file()
    checked = check_export(package)
    assert len(checked) == 2 and all(set(d) == {"torchscript", "onnx"} for d in checked.values())


def test_the_package_predicts_the_runs_store(package, report_dir, tmp_path):
    runs, torch_, onnx = tmp_path / "runs.zarr", tmp_path / "package.zarr", tmp_path / "onnx.zarr"
    assert cli(["-q", "predict-ensemble", "--decisions", str(report_dir / "decisions.json"), "--crops", "501",
                "--out", str(runs), *CPU]) == 0
    assert cli(["-q", "predict-ensemble", str(package), "--crops", "501", "--out", str(torch_), *CPU]) == 0
    assert cli(["-q", "predict-ensemble", str(package), "--crops", "501", "--out", str(onnx), "--backend", "onnx",
                *CPU]) == 0
    _same(PredictionStore.open(runs), PredictionStore.open(torch_), exact=True)
    _same(PredictionStore.open(runs), PredictionStore.open(onnx), exact=False)
    seg = tmp_path / "seg.zarr"  # the package's decisions decode it too
    assert cli(["-q", "postprocess", str(torch_), "--decisions", str(package), "--out", str(seg), "--device",
                "cpu"]) == 0


def test_the_package_predicts_the_runs_volume(package, report_dir, tmp_path):
    runs, packaged = tmp_path / "runs.zarr", tmp_path / "package.zarr"
    assert cli(["-q", "predict-volume", "--decisions", str(report_dir / "decisions.json"), "--out", str(runs),
                *VOLUME]) == 0
    assert cli(["-q", "predict-volume", str(package), "--out", str(packaged), *VOLUME]) == 0
    a, b = VolumeStore.open(runs), VolumeStore.open(packaged)
    assert a.channels == b.channels
    for channel in a.channels:
        np.testing.assert_array_equal(a.array("probabilities", channel, 0)[:],
                                      b.array("probabilities", channel, 0)[:], err_msg=channel)


def test_a_missing_member_is_refused_and_nothing_is_written(report_dir, tmp_path, capsys):
    doc = json.loads((report_dir / "decisions.json").read_text())
    doc["members"][1]["run_dir"] = str(tmp_path / "gone")
    edited = tmp_path / "decisions.json"
    edited.write_text(json.dumps(doc))
    out = tmp_path / "package"
    assert cli(["export", str(edited), "--out", str(out), "--format", "torchscript"]) == 2
    err = capsys.readouterr().err
    assert "member" in err and "gone" in err and not out.exists()
