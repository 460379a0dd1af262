"""Helpers shared by the scoring tests: tiny label volumes and truth/submission stores in `tmp_path`."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

from cellseg.data.write import write_array

VS8 = (8.0, 8.0, 8.0)


def balls(shape, specs, dtype=np.uint16):
    """A label volume with ball `i + 1` at centre `c` with radius `r` for each `(c, r)` in `specs`."""
    z, y, x = np.ogrid[: shape[0], : shape[1], : shape[2]]
    out = np.zeros(shape, dtype=dtype)
    for i, (c, r) in enumerate(specs, start=1):
        out[(z - c[0]) ** 2 + (y - c[1]) ** 2 + (x - c[2]) ** 2 <= r * r] = i
    return out


THREE_BALLS = [((12, 12, 12), 5), ((30, 30, 14), 6), ((14, 34, 34), 5)]


class Stores:
    """Write truth and submission stores for one test."""

    def __init__(self, root: Path):
        self.root = root
        self.count = 0

    def attrs(self, shape, voxel_size=VS8, translation=(0.0, 0.0, 0.0)):
        return {"voxel_size": list(voxel_size), "translation": list(translation), "shape": list(shape)}

    def truth(self, crops, *, voxel_size=VS8, translation=(0.0, 0.0, 0.0), name="truth.zarr"):
        """`crops`: {crop: {label: array}}; every array gets voxel_size/translation/shape attrs."""
        path = self.root / name
        for crop, labels in crops.items():
            for label, data in labels.items():
                write_array(path / crop / label, data, attrs=self.attrs(data.shape, voxel_size, translation))
        return path

    def submission(self, crops, *, attrs=None, voxel_size=VS8, translation=(0.0, 0.0, 0.0), name=None):
        """`crops`: {crop: {label: array}}; `attrs` (dict, or None for the default grid; {} for none)."""
        self.count += 1
        path = self.root / (name or f"sub{self.count}.zarr")
        for crop, labels in crops.items():
            for label, data in labels.items():
                a = self.attrs(data.shape, voxel_size, translation) if attrs is None else attrs
                write_array(path / crop / label, data, attrs=a)
        return path

    def zip(self, directory, *, prefix="", name=None):
        """Zip a directory's files, member names `prefix + relative path`."""
        out = self.root / (name or f"{Path(directory).name}.zip")
        with zipfile.ZipFile(out, "w") as archive:
            for file in sorted(Path(directory).rglob("*")):
                if file.is_file():
                    archive.write(file, prefix + file.relative_to(directory).as_posix())
        return out
