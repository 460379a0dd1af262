"""`cellseg ensemble` refuses a member whose own grid holds a NaN or an infinity: NaN means "not covered" only
outside a member's grid, and nothing non-finite is clipped into a probability."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cellseg.cli import main
from cellseg.data.grid import Grid
from cellseg.data.prediction_store import PredictionStore

GRID = Grid(translation_nm=(4.0, 4.0, 4.0), shape_vox=(4, 6, 6), voxel_size_nm=(8.0, 8.0, 8.0))
COARSE = Grid(translation_nm=(8.0, 8.0, 8.0), shape_vox=(2, 3, 3), voxel_size_nm=(16.0, 16.0, 16.0))


def member(path: Path, grid: Grid, bad: float | None = None) -> Path:
    """A probability store of one crop (`crop1`, channel `mito`) on `grid`; `bad` put at one voxel."""
    probs = np.full(grid.shape_vox, 0.25, np.float32)
    if bad is not None:
        probs[1, 1, 2] = bad
    store = PredictionStore.create(path, kind="probabilities", channels=("mito",))
    store.write_crop("crop1", grid, {"mito": probs})
    return path


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("bad_grid", [GRID, COARSE], ids=["same-grid", "resampled"])
def test_a_non_finite_member_is_refused_naming_store_crop_channel(tmp_path: Path, bad: float, bad_grid: Grid,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    good = member(tmp_path / "good.zarr", GRID)
    broken = member(tmp_path / "broken.zarr", bad_grid, bad)
    out = tmp_path / "ens.zarr"
    assert main(["ensemble", str(good), str(broken), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{broken}/crop1/mito" in err and "non-finite" in err
    assert ("1 NaN" if np.isnan(bad) else "1 infinite") in err
    assert not out.exists()  # nothing written


def test_a_coarser_member_still_pads_with_not_covered(tmp_path: Path) -> None:
    """NaN outside a member's own grid stays "not covered": the finer member alone is used there."""
    fine = Grid(translation_nm=(4.0, 4.0, 4.0), shape_vox=(4, 6, 8), voxel_size_nm=(8.0, 8.0, 8.0))
    a = member(tmp_path / "a.zarr", fine)
    b = member(tmp_path / "b.zarr", COARSE)  # covers x < 56 nm only
    out = tmp_path / "ens.zarr"
    assert main(["ensemble", str(a), str(b), "--out", str(out)]) == 0
    mito = PredictionStore.open(out).read("crop1", "mito")
    assert np.isfinite(mito).all()
    np.testing.assert_allclose(mito, 0.25, atol=2e-3)
