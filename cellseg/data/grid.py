"""A voxel grid in world space: where every array, prediction and score of cellseg lives.

Axes are (z, y, x); lengths are in nanometres. `translation_nm` is the centre of voxel (0, 0, 0), so voxel
`i` sits at `translation_nm + i * voxel_size_nm` and the grid covers the box
`[translation_nm - voxel_size_nm / 2, translation_nm + (shape_vox - 1/2) * voxel_size_nm)`.

Example:
    >>> g = Grid.of(translation_nm=(4, 4, 4), shape_vox=(10, 20, 30), voxel_size_nm=(8, 8, 8))
    >>> g.start_nm, g.stop_nm
    ((0.0, 0.0, 0.0), (80.0, 160.0, 240.0))
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

Vec3 = tuple[float, float, float]
Shape3 = tuple[int, int, int]


def vec3(values: Sequence[float]) -> Vec3:
    """Three plain floats (z, y, x) from any sequence (numpy arrays included)."""
    z, y, x = (float(v) for v in values)
    return z, y, x


def shape3(values: Sequence[int]) -> Shape3:
    """Three plain ints (z, y, x) from any sequence of whole numbers."""
    z, y, x = (int(v) for v in values)
    return z, y, x


@dataclass(frozen=True, kw_only=True)
class Grid:
    """An output grid in world space: centre of voxel 0, shape and voxel size (z, y, x; nm)."""

    translation_nm: Vec3
    shape_vox: Shape3
    voxel_size_nm: Vec3

    @classmethod
    def of(cls, *, translation_nm: Sequence[float], shape_vox: Sequence[int], voxel_size_nm: Sequence[float]
           ) -> Grid:
        """A grid from any sequences (numpy arrays included), converted to plain floats and ints."""
        return cls(translation_nm=vec3(translation_nm), shape_vox=shape3(shape_vox), voxel_size_nm=vec3(voxel_size_nm))

    @property
    def start_nm(self) -> Vec3:
        """Lower corner of the covered box (the edge of voxel 0, not its centre)."""
        return vec3([t - v / 2 for t, v in zip(self.translation_nm, self.voxel_size_nm, strict=True)])

    @property
    def stop_nm(self) -> Vec3:
        """Upper corner of the covered box."""
        return vec3([t + (n - 0.5) * v for t, n, v in zip(self.translation_nm, self.shape_vox, self.voxel_size_nm,
                                                          strict=True)])

    def read_kwargs(self) -> dict[str, object]:
        """Keyword arguments for `MultiscaleImage.read`."""
        return {"translation_nm": self.translation_nm, "shape_vox": self.shape_vox,
                "voxel_size_nm": self.voxel_size_nm}
