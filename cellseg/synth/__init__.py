"""Synthetic FIB-SEM data in the exact CellMap challenge layout (`cellseg synth`).

A *scene* of cells, nuclei and organelles is built from analytic shapes in world coordinates (nm) for
each dataset; the EM is rendered from it on the EM grid (membranes dark, textured lumens, PSF blur, shot
noise, drift, black regions) and the labels are rasterised from it on each crop's grid, so EM and
labels agree at every voxel size. Module map:

- `presets.py`: tiny / small / medium (datasets, EM grids, crops, annotated class sets);
- `scene.py`, `populate.py`, `kinds.py`, `shapes.py`, `organelles.py`, `sdf.py`, `noise.py`: geometry;
- `rasterize.py`: labels on any grid; `render.py`: EM appearance;
- `synthetic_root.py`, `splits.py`: zarr groups, manifests, datasplit, `ground_truth.zarr`;
- `generate.py`: the parallel, atomic driver.

Example:
    >>> from cellseg.synth import generate
    >>> summary = generate("/tmp/synth", preset="tiny", seed=0)  # doctest: +SKIP
"""

from cellseg.synth.generate import SynthSummary, generate
from cellseg.synth.presets import PRESETS, get_preset

__all__ = ["PRESETS", "SynthSummary", "generate", "get_preset"]
