"""`cellseg export`: every architecture traces to TorchScript within 1e-4 of PyTorch, and a run's package loads
with TorchScript alone, checks its own files and reproduces its test output; bad input names what is wrong."""

import json
import shutil

import numpy as np
import pytest
import torch

from cellseg.cli import main
from cellseg.infer.export import (
    PARITY_ATOL,
    Exported,
    check_export,
    example_input,
    torchscript_quietly,
    trace,
)
from cellseg.models import build_model, list_models


@pytest.mark.parametrize("name", list_models())
def test_every_architecture_traces_within_tolerance(name):
    torch.manual_seed(0)
    model = build_model(name, 1, 5, preset="tiny").eval()
    patch = tuple(model.spec.default_patch_vox)
    patch = patch if len(patch) == 3 else (1, *patch)
    example = example_input(patch, model.spec.spatial_dims)
    traced, diff = trace(model, example)
    assert diff <= PARITY_ATOL
    with torch.no_grad():
        out = traced(example)
        assert out.shape == (1, 5, *example.shape[2:]) and 0 <= float(out.min()) and float(out.max()) <= 1
        torch.testing.assert_close(out, Exported(model)(example), rtol=0, atol=PARITY_ATOL)


def test_a_run_exports_and_its_package_checks_itself(tiny_run, tmp_path, capsys):
    out = tmp_path / "unet_3d"
    assert main(["export", str(tiny_run), "--out", str(out)]) == 0
    assert "wrote" in capsys.readouterr().out
    doc = json.loads((out / "model.json").read_text())
    assert doc["format"] == "cellseg-export" and doc["architecture"] == "unet_3d"
    assert doc["input"]["axes"] == "bczyx" and doc["input"]["shape"][2:] == [32, 32, 32]
    assert doc["input"]["voxel_size_nm"] == {"z": 8.0, "y": 8.0, "x": 8.0}
    assert doc["output"]["channels"][:len(doc["output"]["classes"])] == doc["output"]["classes"]
    assert set(doc["files"]) == {"model.torchscript.pt", "test_input.npy", "test_output.npy"}
    # TorchScript alone (no cellseg model code) reproduces the test output
    with torchscript_quietly():  # torch ≥ 2.10 warns that TorchScript is deprecated
        model = torch.jit.load(str(out / "model.torchscript.pt"))
    em = torch.from_numpy(np.load(out / "test_input.npy"))
    assert em.dtype == torch.uint8  # raw EM goes in: the normalisation is inside
    np.testing.assert_allclose(model(em).numpy(), np.load(out / "test_output.npy"), atol=PARITY_ATOL)
    assert main(["export", "--check", str(out)]) == 0
    # a package changed after export, an existing --out, a folder that is not an export: named errors
    np.save(out / "test_output.npy", np.load(out / "test_output.npy") + 1)
    with pytest.raises(ValueError, match="sha256 differs"):
        check_export(out)
    assert main(["export", str(tiny_run), "--out", str(out)]) == 2
    assert "already exists" in capsys.readouterr().err
    assert main(["export", str(tiny_run), "--out", str(out), "--overwrite"]) == 0  # an export cellseg wrote
    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("x")
    assert main(["export", str(tiny_run), "--out", str(other), "--overwrite"]) == 2
    assert "cellseg did not write" in capsys.readouterr().err and (other / "notes.txt").is_file()
    with pytest.raises(ValueError, match="not a cellseg export"):
        check_export(other)
    broken = tmp_path / "run"
    shutil.copytree(tiny_run, broken)
    (broken / "meta.json").unlink()
    assert main(["export", str(broken), "--out", str(tmp_path / "x")]) == 2
    assert "meta.json: missing" in capsys.readouterr().err and not (tmp_path / "x").exists()
