"""`cellseg models` through the real dispatcher."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cellseg.cli import main as cli_main
from cellseg.models import list_models


def _main(argv: list[str]) -> int:
    return cli_main(argv)


def test_models_lists_every_architecture(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "models.json"
    assert _main(["models", "--preset", "tiny", "--json", str(out)]) == 0
    table = capsys.readouterr().out
    assert "fwd GFLOP/patch" in table and "patch (vox)" in table
    for name in list_models():
        assert name in table
    rows = json.loads(out.read_text())
    assert [row["name"] for row in rows] == list_models()
    unet_3d = next(row for row in rows if row["name"] == "unet_3d")
    assert unet_3d["patch_shape_vox"] == [16, 16, 16] and unet_3d["voxel_size_nm"] == [8.0, 8.0, 8.0]
    assert unet_3d["num_params"] > 0 and unet_3d["forward_gflop_per_patch"] > 0


def test_models_subset_and_unknown_names(capsys: pytest.CaptureFixture[str]) -> None:
    assert _main(["models", "--preset", "tiny", "--names", "vit_3d"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and lines[2].startswith("vit_3d")
    assert _main(["models", "--names", "unet_9d"]) == 2


def test_default_preset_counts_the_reference_unet() -> None:
    from cellseg.models.summary import summarize_model

    # nnU-Net-like 3D UNet at 128^3: 956 GFLOP forward, 456 kFLOP/voxel (what `cellseg models` prints).
    row = summarize_model("unet_3d")
    assert 900 < row.forward_gflop_per_patch < 1000
    assert 430 < row.forward_kflop_per_voxel < 480
