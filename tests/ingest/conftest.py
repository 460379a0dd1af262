"""Small volumes of every input format, written by the tests themselves, and a helper to import them.

`volume` is an anisotropic "SBEM" block, (z, y, x) = (24, 96, 96) at 40 × 5 × 5 nm, uint16, whose
intensity encodes the labels (mito dark, ER darker); `mito_ids` holds two mitochondria with ids 3 and 7
(ids the import must keep); `er` is a binary mask; `seg` is one integer volume with 1 = mito, 2 = er.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

SHAPE = (24, 96, 96)
VOXEL_NM = (40.0, 5.0, 5.0)


@pytest.fixture(scope="session")
def arrays() -> dict[str, np.ndarray]:
    """The (z, y, x) arrays the inputs are written from."""
    rng = np.random.default_rng(0)
    mito = np.zeros(SHAPE, np.uint16)
    mito[:, 20:40, 20:40] = 3
    mito[:, 60:80, 50:70] = 7
    er = np.zeros(SHAPE, np.uint8)
    er[:, 5:10, :] = 1
    em = rng.normal(1000, 100, SHAPE)
    em[mito > 0] -= 300
    em[er > 0] -= 500
    seg = np.where(mito > 0, 1, np.where(er > 0, 2, 0)).astype(np.uint8)
    return {"em": em.astype(np.uint16), "mito_ids": mito, "er": er, "seg": seg}


@pytest.fixture
def inputs(tmp_path: Path, arrays: dict[str, np.ndarray]) -> dict[str, str]:
    """Specs of the inputs: the EM as a TIFF folder, the labels as a multi-page TIFF, .npy files."""
    import tifffile

    folder = tmp_path / "sections"
    folder.mkdir()
    for z, section in enumerate(arrays["em"]):
        tifffile.imwrite(folder / f"sec{z}.tif", section)  # natural order: sec2 before sec10
    tifffile.imwrite(tmp_path / "mito.tif", arrays["mito_ids"])
    np.save(tmp_path / "er.npy", arrays["er"])
    np.save(tmp_path / "seg.npy", arrays["seg"])
    return {"em": str(folder), "mito": str(tmp_path / "mito.tif"), "er": str(tmp_path / "er.npy"),
            "seg": str(tmp_path / "seg.npy")}


SMOKE = Path(__file__).resolve().parents[2] / "configs" / "smoke" / "imported_unet_2d.yaml"


@pytest.fixture
def import_args(inputs: dict[str, str]) -> Callable[..., list[str]]:
    """`import_args(out, *extra)`: `cellseg import` arguments for the SBEM block with per-class labels (mito
    ids, er mask), a 2-section gap, 5-section crops and the smoke experiment."""

    def build(out: Path, *extra: str) -> list[str]:
        return ["import", inputs["em"], "--voxel-size", "40,5,5", "--out", str(out),
                "--label", f"mito={inputs['mito']}", "--label", f"er={inputs['er']}", "--gap-nm", "80",
                "--crop-nm", "200", "--experiments", str(SMOKE), *extra]

    return build
