"""bench/native_grids.py and bench/decode_cost.py run end to end on CPU (`--quick`, a small size)."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def load(name: str):
    """A bench module of this checkout (`python bench/<name>.py` from the repository root)."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    return importlib.import_module(f"bench.{name}")


def test_quick_run_scores_both_grids_per_voxel_size(tiny_synth_root: Path, tmp_path: Path) -> None:
    out = tmp_path / "native_grids"
    load("native_grids").main(["--quick", "--data", str(tiny_synth_root), "--out", str(out)])
    doc = json.loads(out.with_suffix(".json").read_text())
    assert doc["tta"] == 1 and doc["models"] == ["unet_3d", "resnet_3d"]
    assert set(doc["oracle_bands"]) == set(doc["bands"])  # ideal probabilities: the same crops
    bands = doc["bands"]
    assert "all" in bands and "4×4×4" in bands and "16×16×16" in bands  # test crops at 4 and 16 nm
    assert len(bands["all"]["crops"]) == sum(len(b["crops"]) for k, b in bands.items() if k != "all")
    for row in bands.values():
        for key in ("model_2025", "model_2026", "annotation_2025", "annotation_2026"):
            assert set(row[key]) == {"overall_score", "overall_instance_score", "overall_semantic_score", "classes"}
    assert "| all | " in out.with_suffix(".md").read_text()
    seg = tmp_path / "native_grids_work" / "seg_ensemble_annotation.zarr" / "crop501" / ".zattrs"
    assert json.loads(seg.read_text())["cellseg_crop"]["grid"]["voxel_size_nm"] == [4.0, 4.0, 4.0]


def test_decode_cost_small_run(tmp_path: Path, monkeypatch) -> None:
    out = tmp_path / "decode_cost"
    monkeypatch.setattr(sys, "argv", ["decode_cost", "--size", "16", "--repeat", "2", "--workers", "1",
                                      "--out", str(out)])
    load("decode_cost").main()
    doc = json.loads(out.with_suffix(".json").read_text())
    assert doc["path"]["annotation"]["total_seconds"] > 0 and doc["projection"]["fine_voxel_classes"] > 6e10
    assert set(doc["decoder"]) == {"semantic", "instance"}
