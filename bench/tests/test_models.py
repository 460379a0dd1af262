"""bench/models.py runs end to end on CPU (``--quick``), so the GPU run is known to start."""

from __future__ import annotations

import json
from pathlib import Path

from bench import models as bench


def test_quick_bench_writes_json_and_markdown(tmp_path: Path) -> None:
    assert (
        bench.main(
            ["--quick", "--names", "unet_3d,vit_2d", "--configs", "bf16-cl,fp32", "--out", str(tmp_path)]
        )
        == 0
    )
    report = json.loads((tmp_path / "models.json").read_text())
    assert [row["name"] for row in report["models"]] == ["unet_3d", "vit_2d"]
    for row in report["models"]:
        assert row["train_gflop_per_step"] > 0
        assert {key: value["status"] for key, value in row["settings"].items()} == {
            "bf16-cl": "ok",
            "fp32": "ok",
        }
    table = (tmp_path / "models.md").read_text()
    assert "| unet_3d | 2 x 16x16x16 | bf16-cl |" in table and report["environment"]["torch"] in table
