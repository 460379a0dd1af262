"""`cellseg predict-volume --decisions`: a whole-volume run applies the report's decisions as `predict-ensemble
--decisions` does for crops: each class the weighted mean of its members with or without TTA as decided. On a world
ROI of the tiny root's 8 nm dataset, the decided store equals, channel by channel, the plain runs of each pass (the
TTA classes' members with 8 transforms, the others' with one) over the same ROI and blocks."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from cellseg.cli import main as cli
from cellseg.decide.document import Decisions
from cellseg.volume.store import VolumeStore

DATASET = "synth-iso8-1"
ROI_NM = "796:1052,396:780,1196:1708"  # 32 × 48 × 64 voxels at 8 nm (as tests/volume)
COMMON = ("--dataset", DATASET, "--device", "cpu", "--workers", "1", "--block-vox", "32", "--roi-nm", ROI_NM,
          "volume.chunk_vox=32", "infer.overlap=0", "volume.cpu_workers=1")


def _pass(decisions: Decisions, classes: list[str], tta: int, out: Path) -> Path:
    """The plain run of one pass: the members weighing `classes`, their weights for them (others uniform)."""
    members = decisions.members_for(classes)
    weights = out.with_suffix(".weights.json")
    weights.write_text(json.dumps({"channels": decisions.pass_weights(classes, members),
                                   "members": [{"run_dir": decisions.members[i].run_dir} for i in members]}))
    runs = [decisions.members[i].run_dir for i in members]
    extra = ("--weights", str(weights)) if len(runs) > 1 else ()
    assert cli(["-q", "predict-volume", *runs, "--out", str(out), "--tta", str(tta), *extra, *COMMON]) == 0
    return out


def test_a_decided_volume_is_each_class_from_its_own_pass(report_dir, tmp_path):
    decisions = Decisions.load(report_dir / "decisions.json")
    with_tta = decisions.tta_classes()
    without = [c for c in decisions.classes if c not in with_tta]
    assert with_tta and without  # the report's decisions exercise both passes
    decided = tmp_path / "decided.zarr"
    assert cli(["-q", "predict-volume", "--decisions", str(report_dir / "decisions.json"), "--out", str(decided),
                *COMMON]) == 0
    store = VolumeStore.open(decided)
    recorded = store.attrs["members"]
    assert {m["tta"] for m in recorded} == {1, 8} and store.attrs["settings"]["decisions"]["sha256"]
    passes = {8: _pass(decisions, with_tta, 8, tmp_path / "tta8.zarr"),
              1: _pass(decisions, without, 1, tmp_path / "tta1.zarr")}
    for channel in store.channels:
        tta = 8 if channel.removesuffix("_boundary") in with_tta else 1
        got = store.array("probabilities", channel, 0)[:]
        want = VolumeStore.open(passes[tta]).array("probabilities", channel, 0)[:]
        np.testing.assert_array_equal(got, want, err_msg=channel)
        assert 0 < got.mean() < 255, channel
