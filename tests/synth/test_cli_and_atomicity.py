"""`cellseg synth` refuses to clobber, writes atomically, and small building blocks behave."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cellseg.cli import main
from cellseg.synth import generate, noise, sdf
from cellseg.synth.presets import PRESETS, CropSpec, DatasetSpec, Preset, SceneStyle

MICRO = Preset(name="micro", style=SceneStyle(cell_diameter_u=60, organelle_scale=0.7), block_vox=48, datasets=(
    DatasetSpec(name="synth-micro", voxel_size_nm=(4.0, 4.0, 4.0), shape_vox=(48, 48, 48),
                crops=(CropSpec(role="train", scale=1, shape_vox=(16, 16, 16)),)),))


def test_refuses_a_non_empty_out(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "keep.txt").write_text("precious")
    assert main(["synth", "--out", str(tmp_path), "--preset", "tiny"]) == 2
    assert "not empty" in capsys.readouterr().err
    assert (tmp_path / "keep.txt").read_text() == "precious"


def test_the_command_offers_every_preset(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["synth", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "{" + ",".join(PRESETS) + "}" in text


def test_micro_preset_into_an_empty_dir_and_overwrite(tmp_path: Path) -> None:
    out = tmp_path / "root"
    out.mkdir()
    summary = generate(out, preset=MICRO, seed=3)
    assert (out / "datasplit.csv").is_file() and summary.crops == {"train": 1, "validate": 0, "test": 0}
    with pytest.raises(ValueError, match="not empty"):
        generate(out, preset=MICRO, seed=3)
    generate(out, preset=MICRO, seed=4, overwrite=True)
    assert '"seed": 4' in (out / "synth.json").read_text()


def test_interrupted_run_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from cellseg.synth import synthetic_root

    def boom(*args: object, **kwargs: object) -> None:
        raise RuntimeError("interrupted")

    monkeypatch.setattr(synthetic_root, "write_tables", boom)
    with pytest.raises(RuntimeError, match="interrupted"):
        generate(tmp_path / "root", preset=MICRO, seed=0)
    assert list(tmp_path.iterdir()) == []


def test_value_noise_is_the_same_on_grids_and_points() -> None:
    z, y, x = (np.arange(n, dtype=np.float32).reshape(s) * 3.5 for n, s in
               ((5, (5, 1, 1)), (6, (1, 6, 1)), (7, (1, 1, 7))))
    grid = noise.value_noise(z, y, x, spacing_nm=8.0, seed=7)
    zz, yy, xx = np.broadcast_arrays(z, y, x)
    points = noise.value_noise(zz.ravel(), yy.ravel(), xx.ravel(), spacing_nm=8.0, seed=7)
    np.testing.assert_allclose(grid.ravel(), points, atol=1e-5)
    assert np.abs(grid).max() <= 1


def test_layers_keep_membranes_at_least_one_voxel_thick() -> None:
    depth = -np.arange(0, 40, 8.0)  # a coarse 8 nm grid through a surface
    atoms = sdf.layers(depth - 0.5, ((3, 6.0), (4, None)), min_thick_nm=8.0)
    assert list(atoms) == [3, 4, 4, 4, 4]


def test_a_volume_holding_a_single_cell_still_places_its_crops(tmp_path: Path) -> None:
    # Cells far larger than the EM: one cell, so no cell-cell border to aim a crop at.
    one_cell = Preset(name="one-cell", style=SceneStyle(cell_diameter_u=2000, organelle_scale=0.7), block_vox=48,
                      datasets=(DatasetSpec(name="synth-one", voxel_size_nm=(4.0, 4.0, 4.0), shape_vox=(48, 48, 48),
                                            crops=tuple(CropSpec(role="train", scale=1, shape_vox=(16, 16, 16))
                                                        for _ in range(3))),))
    summary = generate(tmp_path / "root", preset=one_cell, seed=0)
    assert summary.crops["train"] + summary.crops["validate"] == 3
