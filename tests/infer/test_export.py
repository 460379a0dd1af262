"""`cellseg export`: every architecture exports to TorchScript and ONNX within 1e-4 of PyTorch; a run's package loads
with TorchScript or ONNX Runtime alone, checks its own files, holds a BioImage.IO description that bioimageio.spec
validates, and predicts the same store as the run; bad input names what is wrong and writes nothing."""

import json
import shutil

import numpy as np
import pytest
import torch
import yaml

from cellseg.cli import main
from cellseg.data.prediction_store import PredictionStore
from cellseg.export import bioimageio
from cellseg.export.network import PARITY_ATOL, example_input, exported, to_onnx, to_torchscript
from cellseg.export.package import check_export, parse_formats
from cellseg.infer.packaged import onnx_session, torchscript_quietly
from cellseg.models import build_model, list_models

CPU = ("--overlap", "0", "--device", "cpu", "--tta", "2")


@pytest.mark.parametrize("name", list_models())
def test_every_architecture_exports_to_torchscript_and_onnx_within_tolerance(name):
    torch.manual_seed(0)
    model = build_model(name, 1, 5, preset="tiny").eval()
    patch = tuple(model.spec.default_patch_vox)
    patch = patch if len(patch) == 3 else (1, *patch)
    example = example_input(patch, model.spec.spatial_dims)
    wrapped = exported(model)
    traced, diff = to_torchscript(wrapped, example)
    assert diff <= PARITY_ATOL
    graph, onnx_diff = to_onnx(wrapped, example)
    assert onnx_diff <= PARITY_ATOL
    three = torch.cat([example, example.flip(-2), example.flip(-1)])  # a batch size neither graph was made from
    with torch.no_grad():
        want = wrapped(three)
        assert want.shape == (3, 5, *example.shape[2:]) and 0 <= float(want.min()) and float(want.max()) <= 1
        torch.testing.assert_close(traced(three), want, rtol=0, atol=PARITY_ATOL)
    got = onnx_session(graph).run(None, {"em": three.numpy()})[0]
    np.testing.assert_allclose(got, want.numpy(), rtol=0, atol=PARITY_ATOL)


def test_formats_are_checked():
    assert parse_formats("onnx,torchscript") == ("torchscript", "onnx")
    for bad, words in [("tflite", "unknown tflite"), ("", "unknown empty"), ("bioimageio", "add torchscript")]:
        with pytest.raises(ValueError, match=words):
            parse_formats(bad)


@pytest.fixture(scope="module")
def package(tiny_run, tmp_path_factory):
    out = tmp_path_factory.mktemp("export") / "unet_3d"
    assert main(["export", str(tiny_run), "--out", str(out), "--author", "A. Researcher", "--maintainer",
                 "researcher"]) == 0
    return out


def test_a_run_exports_a_package_that_runs_without_cellseg(package):
    doc = json.loads((package / "model.json").read_text())
    assert doc["format"] == "cellseg-export" and doc["kind"] == "model" and doc["architecture"] == "unet_3d"
    assert doc["input"]["axes"] == "bczyx" and doc["input"]["shape"][2:] == [32, 32, 32]
    assert doc["input"]["voxel_size_nm"] == {"z": 8.0, "y": 8.0, "x": 8.0}
    assert doc["output"]["channels"][:len(doc["output"]["classes"])] == doc["output"]["classes"]
    assert doc["test_input"].startswith("EM of crop")  # the run's own EM, not noise
    assert set(doc["parity"]["max_abs_diff"]) == {"torchscript", "onnx"}
    assert {"model.torchscript.pt", "model.onnx", "rdf.yaml", "cover.png", "checkpoints/best.pt", "config.yaml",
            "meta.json", "datasplit.csv", "test_input.npy", "test_output.npy"} <= set(doc["files"])
    assert doc["provenance"]["checkpoint_sha256"] and doc["provenance"]["step"] == 4
    validation = doc["provenance"]["validation"]  # the run's last validation, with crop-bootstrap intervals
    assert validation["crops"] and len(validation["overall"]["interval"]) == 2
    low, high = validation["overall"]["interval"]
    assert 0 <= low <= high <= 1 and 0 <= validation["overall"]["score"] <= 1
    em = np.load(package / "test_input.npy")
    assert em.dtype == np.uint8 and em.std() > 0  # raw EM goes in: the normalisation is inside
    want = np.load(package / "test_output.npy")
    with torchscript_quietly():  # torch ≥ 2.10 warns that TorchScript is deprecated
        model = torch.jit.load(str(package / "model.torchscript.pt"))
    np.testing.assert_allclose(model(torch.from_numpy(em)).numpy(), want, atol=PARITY_ATOL)
    got = onnx_session(str(package / "model.onnx")).run(None, {"em": em.astype(np.float32)})[0]
    np.testing.assert_allclose(got, want, atol=PARITY_ATOL)
    assert main(["export", "--check", str(package)]) == 0


def test_the_bioimageio_description_validates(package, tmp_path):
    assert bioimageio.validate(package / "rdf.yaml") == []  # offline, every file's sha256 recomputed
    rdf = yaml.safe_load((package / "rdf.yaml").read_text())
    broken = tmp_path / "broken"
    shutil.copytree(package, broken)
    (broken / "cover.png").write_bytes(b"not the cover")
    with pytest.raises(ValueError, match="covers"):
        bioimageio.validate(broken / "rdf.yaml")
    assert rdf["authors"] == [{"name": "A. Researcher"}] and rdf["maintainers"] == [{"github_user": "researcher"}]
    assert rdf["license"] == "CC-BY-4.0" and rdf["cite"][0]["doi"]
    space = [a for a in rdf["inputs"][0]["axes"] if a["type"] == "space"]
    assert [(a["id"], a["size"], a["unit"], a["scale"]) for a in space] == [
        (a, 32, "nanometer", 8.0) for a in "zyx"]
    assert rdf["weights"]["onnx"]["parent"] == "torchscript"


def test_the_package_predicts_the_runs_store(package, tiny_run, tmp_path):
    stores = {}
    for name, source, extra in [("run", tiny_run, ()), ("torch", package, ()),
                                ("onnx", package, ("--backend", "onnx")),
                                ("torchscript", package, ("--backend", "torchscript"))]:
        stores[name] = tmp_path / f"{name}.zarr"
        assert main(["-q", "predict", str(source), "--crops", "val", "--out", str(stores[name]), *CPU, *extra]) == 0
    run = PredictionStore.open(stores["run"])
    for name in ("torch", "onnx", "torchscript"):
        other = PredictionStore.open(stores[name])
        assert other.completed() == run.completed() and other.channels == run.channels
        for crop in run.completed():
            for channel in run.channels:
                a, b = run.read(crop, channel).astype(np.float32), other.read(crop, channel).astype(np.float32)
                if name == "torch":  # the same network and weights: the same store, bit for bit
                    assert np.array_equal(a, b), (crop, channel)
                else:  # a graph: within float32 rounding, so within one float16 step
                    np.testing.assert_allclose(b, a, rtol=2**-10, atol=2**-14)
    assert PredictionStore.open(stores["onnx"]).provenance["backend"] == "onnx"


def test_bad_input_is_named_and_nothing_is_written(package, tiny_run, tmp_path, capsys):
    changed = tmp_path / "changed"
    shutil.copytree(package, changed)
    np.save(changed / "test_output.npy", np.load(changed / "test_output.npy") + 1)
    with pytest.raises(ValueError, match="sha256 differs"):
        check_export(changed)
    weights = changed / "checkpoints" / "best.pt"
    weights.write_bytes(weights.read_bytes()[:-1] + b"x")  # one byte of the weights changed
    assert main(["-q", "predict", str(changed), "--crops", "val", "--out", str(tmp_path / "c.zarr"), *CPU]) == 2
    assert "best.pt: sha256 differs" in capsys.readouterr().err and not (tmp_path / "c.zarr").exists()
    assert main(["export", str(tiny_run), "--out", str(package)]) == 2
    assert "already exists" in capsys.readouterr().err
    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("x")
    assert main(["export", str(tiny_run), "--out", str(other), "--overwrite", "--format", "torchscript"]) == 2
    assert "cellseg did not write" in capsys.readouterr().err and (other / "notes.txt").is_file()
    with pytest.raises(ValueError, match="not a cellseg export"):
        check_export(other)
    assert main(["export", str(tiny_run), "--out", str(tmp_path / "x"), "--format", "tflite"]) == 2
    assert "unknown tflite" in capsys.readouterr().err
    broken = tmp_path / "run"
    shutil.copytree(tiny_run, broken)
    shutil.rmtree(broken / "checkpoints")
    assert main(["export", str(broken), "--out", str(tmp_path / "x")]) == 2
    assert "no checkpoint best.pt" in capsys.readouterr().err and not (tmp_path / "x").exists()
    assert main(["-q", "predict", str(tiny_run), "--backend", "onnx", "--crops", "val", "--out",
                 str(tmp_path / "p.zarr"), *CPU]) == 2
    assert "not a package written by `cellseg export`" in capsys.readouterr().err
    assert not (tmp_path / "p.zarr").exists()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("backend", ["torch", "torchscript", "onnx"])
def test_a_package_predicts_on_cuda(tiny_run, tmp_path, backend):
    """Graphs traced on the CPU run on CUDA (no device baked into them): each backend's store on CUDA is the runs'
    CUDA store within bf16 rounding (the torch backend: the same store)."""
    package = tmp_path / "package"
    assert main(["export", str(tiny_run), "--out", str(package), "--format", "torchscript,onnx"]) == 0
    runs, ours = tmp_path / "runs.zarr", tmp_path / f"{backend}.zarr"
    gpu = ("--overlap", "0", "--device", "cuda", "--tta", "2", "--compile", "off")
    assert main(["-q", "predict", str(tiny_run), "--crops", "val", "--out", str(runs), *gpu]) == 0
    assert main(["-q", "predict", str(package), "--crops", "val", "--out", str(ours), "--backend", backend,
                 *gpu]) == 0
    a, b = PredictionStore.open(runs), PredictionStore.open(ours)
    for crop in a.completed():
        for channel in a.channels:
            x, y = a.read(crop, channel).astype(np.float32), b.read(crop, channel).astype(np.float32)
            if backend == "torch":
                assert np.array_equal(x, y), (crop, channel)
            else:  # float32 graphs against the runs' bf16 autocast
                np.testing.assert_allclose(y, x, atol=0.02, err_msg=f"{crop}/{channel}")
