"""The notebooks are committed without outputs; their execution is `pytest --nbmake notebooks` (scripts/test.sh).

Outputs (PNG figures, temporary paths, timings) would bloat the repository and change on every run, so a
notebook in git has no outputs, no execution counts and no per-run metadata. Strip one with
`jupyter nbconvert --clear-output --inplace notebooks/NAME.ipynb`, or "Clear All Outputs" before saving.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
EXPECTED = ("01_explore_data", "02_train_and_monitor", "03_predictions_and_scores", "04_ensemble_ablation",
            "05_whole_volume")
RUN_METADATA = ("execution", "ExecuteTime", "collapsed", "scrolled")  # written by Jupyter when cells run


def _notebooks() -> list[Path]:
    return sorted(NOTEBOOKS.glob("*.ipynb"))


def test_the_notebooks_of_the_guide_exist():
    names = {p.stem for p in _notebooks()}
    assert set(EXPECTED) <= names, f"missing in {NOTEBOOKS}: {sorted(set(EXPECTED) - names)}"


@pytest.mark.parametrize("path", _notebooks(), ids=lambda p: p.name)
def test_notebook_is_committed_without_outputs(path: Path):
    nb = json.loads(path.read_text(encoding="utf-8"))
    assert nb.get("nbformat") == 4, f"{path.name}: not an nbformat-4 notebook"
    assert nb["metadata"].get("kernelspec", {}).get("name") == "python3", f"{path.name}: kernel is not python3"
    for number, cell in enumerate(nb["cells"]):
        where = f"{path.name}, cell {number}"
        leftovers = [key for key in RUN_METADATA if key in cell.get("metadata", {})]
        assert not leftovers, f"{where}: run metadata {leftovers} (clear the outputs before committing)"
        if cell["cell_type"] == "code":
            assert cell["outputs"] == [], f"{where}: has outputs (clear them before committing)"
            assert cell["execution_count"] is None, f"{where}: execution_count {cell['execution_count']}, not null"
