"""`cellseg evaluate` never prints a skipped (crop, label) as a score: it counts and lists them in both eras."""

import json

import numpy as np
from eval_helpers import balls

from cellseg.cli import main


def _shattered(shape=(48, 48, 48), n=80):
    """`n` isolated voxels (26-connected components of their own): far over the 2026 object-count cutoff."""
    out = np.zeros(shape, np.uint16)
    points = [(z, y, x) for z in range(2, 46, 4) for y in range(2, 46, 4) for x in range(2, 46, 4)][:n]
    for i, p in enumerate(points, start=1):
        out[p] = i
    return out


def test_a_shattered_crop_prints_as_skipped_not_as_perfect(stores, tmp_path, capsys):
    one = balls((48, 48, 48), [((24, 24, 24), 8)])
    truth = stores.truth({"crop1": {"mito": one}, "crop2": {"mito": one}})
    sub = stores.submission({"crop1": {"mito": _shattered()}, "crop2": {"mito": one}})
    out = tmp_path / "s.json"
    assert main(["-v", "evaluate", str(sub), str(truth), "--metric", "2026", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "skipped 1 of 2 (crop, label) pairs" in text
    assert "[1 of 2 crops skipped]" in text
    assert "crop1 (skipped)" in text and "80 predicted objects for 1 true" in text
    crop_line = next(line for line in text.splitlines() if "crop1 (skipped)" in line)
    assert "tp=" not in crop_line  # no numbers for a crop that counts for nothing
    assert "crop1/mito: skipped_too_many_instances" in text
    assert json.loads(out.read_text())["skipped"] == [["crop1", "mito"]]


def test_a_class_skipped_everywhere_is_flagged_and_2025_says_none(stores, capsys):
    one = balls((48, 48, 48), [((24, 24, 24), 8)])
    truth = stores.truth({"crop1": {"mito": one}})
    sub = stores.submission({"crop1": {"mito": _shattered()}})
    assert main(["evaluate", str(sub), str(truth), "--metric", "2026"]) == 0
    text = capsys.readouterr().out
    mito = next(line for line in text.splitlines() if line.startswith("mito"))
    assert "combined=1.0000" in mito and "[all 1 crops skipped: no crop was scored, this is not a score]" in mito
    assert main(["evaluate", str(sub), str(truth), "--metric", "2025"]) == 0  # 2025 scores it 0: nothing skipped
    text = capsys.readouterr().out
    assert "skipped 0 of 1 (crop, label) pairs" in text and "crops skipped" not in text


def test_a_long_list_of_skipped_pairs_is_bounded(stores, capsys):
    one = balls((48, 48, 48), [((24, 24, 24), 8)])
    crops = {f"crop{i}": {"mito": one} for i in range(1, 24)}
    truth = stores.truth(crops)
    sub = stores.submission({c: {"mito": _shattered()} for c in crops})
    assert main(["evaluate", str(sub), str(truth), "--metric", "2026"]) == 0
    text = capsys.readouterr().out
    assert "skipped 23 (crop, label) pairs" in text and "... and 3 more (see --json)" in text
