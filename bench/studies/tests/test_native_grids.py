"""bench/studies/native_grids (`python -m bench.studies.native_grids`) and bench/decode_cost.py run end to end on CPU (`--quick`, a small size)."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def load(name: str):
    """A bench module of this checkout (`python bench/<name>.py` from the repository root)."""
    return importlib.import_module(f"bench.{name}")


def test_quick_run_decides_and_scores_both_grids_with_intervals(tiny_synth_root: Path, tmp_path: Path) -> None:
    out = tmp_path / "native_grids"
    load("studies.native_grids").main(["--quick", "--data", str(tiny_synth_root), "--out", str(out)])
    doc = json.loads(out.with_suffix(".json").read_text())
    assert doc["tta"] == 1 and doc["models"] == ["unet_3d", "resnet_3d"]
    # decisions on the tuning crops only; scored: the test crops and the report crops, never a tuning crop
    assert doc["tuning_crops"] and not set(doc["tuning_crops"]) & set(doc["scored_crops"])
    ens, oracle = doc["ensemble"], doc["oracle"]
    roles = ens["bands"]["all"]["roles"]
    assert set(roles) == set(doc["scored_crops"]) and set(roles.values()) <= {"test", "report"}
    assert {"crop501", "crop502"} <= set(roles)  # the tiny preset's test crops (4 and 16 nm)
    assert set(oracle["bands"]) == set(ens["bands"])  # ideal probabilities: the same crops
    assert {"all", "4×4×4", "16×16×16", "finer than the model"} <= set(ens["bands"])
    assert "16×16×16" not in ens["bands"]["finer than the model"]["crops"]
    # both sides decided: weights scored on the ensemble's grid + tuned on the model grid, or both on labels
    (decided,) = doc["decisions"].values()  # one data root
    model, native = decided["model"], decided["annotation"]
    assert (model["weights_score_grid"], model["tuning_grid"]) == ("ensemble", "model")
    assert (native["weights_score_grid"], native["tuning_grid"]) == ("annotation", "annotation")
    for side in (model, native):
        assert side["tuning_crops"] == doc["tuning_crops"] and side["weights"] and side["params"]
    assert set(ens["rows"]) == {"model_grid", "model_grid_native_decoding", "native", "uniform_model", "uniform_annotation"}
    for section in (ens, oracle):
        for row in section["rows"].values():
            assert set(row) == set(section["bands"])
            for name, band in row.items():
                for era in ("2025", "2026"):
                    scores = band[era]
                    per_class = {"classes"} if name in ("all", "finer than the model") else set()
                    assert set(scores) == {"overall", "semantic", "instance", "interval", "skipped"} | per_class
                    low, high = scores["interval"]["overall"]
                    assert low - 1e-9 <= scores["overall"] <= high + 1e-9
    change = ens["changes"]["decisions"]
    assert (change["from"], change["to"]) == ("model_grid", "native")
    for band in ens["bands"]:
        entry = change["bands"][band]["2026"]["overall"]
        low, high = entry["interval"]
        assert low - 1e-9 <= entry["change"] <= high + 1e-9 and isinstance(entry["within_noise"], bool)
    assert set(ens["changes"]) == {"decisions", "decoding", "decision_grid", "decoding_defaults"}
    text = out.with_suffix(".md").read_text()
    assert "| all | " in text and "Δ overall [95 % CI]" in text
    work = tmp_path / "native_grids_work"
    for store, voxel in (("seg_native_annotation", 4.0), ("seg_model_decisions_model", 8.0)):
        attrs = json.loads((work / f"{store}.zarr" / "crop501" / ".zattrs").read_text())
        assert attrs["cellseg_crop"]["grid"]["voxel_size_nm"] == [voxel] * 3


def test_decode_cost_small_run(tmp_path: Path, monkeypatch) -> None:
    out = tmp_path / "decode_cost"
    monkeypatch.setattr(sys, "argv", ["decode_cost", "--size", "16", "--repeat", "2", "--workers", "1",
                                      "--out", str(out)])
    load("decode_cost").main()
    doc = json.loads(out.with_suffix(".json").read_text())
    assert doc["path"]["annotation"]["total_seconds"] > 0 and doc["projection"]["fine_voxel_classes"] > 6e10
    assert set(doc["decoder"]) == {"semantic", "instance"}


def test_fragments_run_writes_the_three_ways(tmp_path: Path) -> None:
    out = tmp_path / "frag"
    assert load("studies.native_grids.fragments").main(["--size", "32", "--seeds", "0", "--noise", "0.1",
                                                "--out", str(out)]) == 0
    doc = json.loads(out.with_suffix(".json").read_text())
    ways = doc["rows"][0]["ways"]
    assert set(ways) == {"model_grid", "annotation_grid_pieces", "annotation_grid"}
    assert ways["model_grid"]["pieces"] == ways["model_grid"]["ids"]  # nearest upsampling never splits an id
    assert ways["annotation_grid"]["pieces"] <= ways["annotation_grid_pieces"]["pieces"]
    assert all(0.0 <= w["combined"] <= 1.0 for w in ways.values())
    assert "| mean |" in out.with_suffix(".md").read_text()
