"""bench/studies/test_set runs end to end on CPU (`--quick`), so the GPU run is known to start and to report."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

from cellseg.data.crops import Catalog
from cellseg.synth.presets import mirror_crops, mirror_preset

REPO = Path(__file__).resolve().parents[3]
STAGES = ("generate", "build_runs", "predict", "ensemble", "postprocess", "submit", "validate")


def load_bench():
    """The `bench.studies.test_set` package of this checkout (`python -m bench.studies.test_set` from the repository root)."""
    return importlib.import_module("bench.studies.test_set")


def test_mirrored_test_crops_follow_the_real_ones() -> None:
    real = Catalog.official().test("2026")
    crops = {c.real_id: c for c in mirror_crops(real, 16.0)}
    assert sorted(crops) == sorted(real) and len({c.dataset for c in crops.values()}) == 6
    assert crops[983].spec.shape_vox == (62, 62, 62) and crops[983].voxel_size_nm == (32.0, 32.0, 32.0)  # 8 nm × 4
    assert crops[985].voxel_size_nm == (16.0, 16.0, 16.0)  # real 4 → 32 nm (8×) becomes 4 → 16 nm
    assert crops[557].voxel_size_nm == (1.74, 2.0, 2.0) and crops[557].spec.classes == "all"
    assert crops[980].spec.classes == "coarse"
    preset = mirror_preset(list(crops.values()))
    assert [len(d.crops) for d in preset.datasets] == [4, 3, 4, 4, 3, 4]  # test crops + one training crop each
    volumes = load_bench().real_volumes(real, "max8")
    assert volumes[983]["shape_vox"] == [1000, 1000, 1000] and volumes[557]["voxel_size_nm"] == [8.0, 8.0, 8.0]


def test_quick_run_writes_every_stage_and_both_projections(tmp_path: Path) -> None:
    bench = load_bench()
    out = tmp_path / "test_set"
    assert bench.main(["--quick", "--out", str(out), "--work", str(tmp_path / "work")]) == 0
    report = json.loads(out.with_name("test_set.json").read_text())
    stages = report["stages"]
    assert set(STAGES) <= set(stages)
    for name in ("unet_3d", "unet_2d"):
        assert stages["build_runs"][name]["status"] == "ok"
        run_dir = Path(stages["build_runs"][name]["run_dir"])
        assert {"config.yaml", "meta.json", "checkpoints"} <= {p.name for p in run_dir.iterdir()}
        predict = stages["predict"][name]
        assert predict["status"] == "ok" and predict["crops"] == 16 and predict["tiles"] > 0
    for stage in STAGES[3:]:
        assert stages[stage]["status"] == "ok", stages[stage]
        assert stages[stage]["per_item_seconds"] >= 0 and stages[stage]["per_voxel_seconds"] >= 0
    labels, rest = divmod(stages["submit"]["probe_voxels"], 64**3)  # crop 983 (8³ at 32 nm) on the 4 nm probe grid
    assert rest == 0 and 2 <= labels <= bench.PROBE_LABELS
    assert stages["ensemble"]["members"] == 2 and stages["postprocess"]["device"] == "cpu"
    synthetic = report["synthetic"]["crops"]
    assert len(synthetic) == 16 and len({c["dataset"] for c in synthetic}) == 6
    assert sorted(c["real_id"] for c in synthetic) == sorted(Catalog.official().test("2026"))
    for policy in ("8nm", "max8"):
        projection = report["projection"][policy]
        assert set(projection["stages"]["predict"]) == {"unet_3d", "unet_2d"}
        assert {"ensemble", "postprocess", "submit", "validate"} <= set(projection["stages"])
        assert projection["total_minutes"] > projection["predict_minutes"] > 0
    assert report["projection"]["8nm"]["model_voxels"] > 50 * report["projection"]["max8"]["model_voxels"]
    table = out.with_name("test_set.md").read_text()
    assert "| 515 | 983 | jrc_zf-cardiac-1 |" in table and "| **total** |" in table


def test_quick_fused_run_projects_the_members_at_their_steady_rates(tmp_path: Path) -> None:
    """`--fused`: one predict-ensemble stage instead of a store per model + ensemble; the projection prices each
    member's tiles at the engine rate of a forward_probe report (written here as that bench writes it)."""
    bench = load_bench()
    rates = {"unet_3d": 2.0, "unet_2d": 0.5}  # ms per tile pass
    steady = tmp_path / "steady.json"
    steady.write_text(json.dumps({"rows": [{"model": m, "batch": 2, "engine": {"ms_per_tile": ms, "tta_fold": 1,
                                                                              "overlap": 0.25}}
                                           for m, ms in rates.items()]}))
    out = tmp_path / "fused"
    assert bench.main(["--quick", "--fused", "--out", str(out), "--work", str(tmp_path / "work"),
                       "--steady", str(steady)]) == 0
    report = json.loads(out.with_name("fused.json").read_text())
    stages = report["stages"]
    fused = stages["predict_ensemble"]
    assert fused["status"] == "ok" and fused["crops"] == 16 and fused["tiles"] > 0
    assert "predict" not in stages and "ensemble" not in stages
    assert all(stages[s]["status"] == "ok" for s in ("postprocess", "submit", "validate"))
    projected = report["projection"]["max8_ov25"]
    row = projected["stages"]["predict_ensemble"]
    members = sum(r["tiles"] * rates[m] / 1e3 for m, r in row["members"].items())
    assert set(row["members"]) == set(rates) and all(r["tiles"] > 0 for r in row["members"].values())
    assert row["seconds"] > members + row["write_seconds"] > members > 0
    assert projected["complete"]
    assert "predict-ensemble" in out.with_name("fused.md").read_text()
