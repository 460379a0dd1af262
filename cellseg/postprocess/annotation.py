"""Where each (crop, label) of a prediction store is scored: its annotation grid (z, y, x; nm).

`cellseg postprocess` decodes every class on that grid (`cellseg.postprocess.native`) instead of the model's.
The geometry comes from where `cellseg submit` and the evaluators take it:

- a test crop (crop attribute `split` "test", or a crop only the test manifests list): its rows in the data
  root's test manifests (`Catalog.from_dir(root).test()`, the 2026 version first, then 2025; the packaged
  official ones for a real-data root without test manifests, as `cellseg predict` finds test crops), the
  geometry `cellseg submit` writes;
- a training or validation crop: the `s0` level of each label's array in the data root (the truth
  `cellseg evaluate` and the report score against), else the training manifest's row for the label;
- an explicit mapping of crops (e.g. a truth store's, `cellseg.eval.validate.crops_from_truth`) overrides both.

A label the crop does not annotate (a validation crop predicts every class) takes the crop's most common
annotation grid; a crop found nowhere keeps the model's grid (logged).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping, Sequence

from cellseg.data.arrays import MultiscaleImage
from cellseg.data.crops import TEST_VERSIONS_NEWEST_FIRST, Catalog, Crop, Geometry, crop_id, is_crop_name
from cellseg.data.grid import Grid
from cellseg.data.prediction_store import PredictionStore

log = logging.getLogger(__name__)


def to_grid(geometry: Geometry) -> Grid:
    """A manifest geometry as a `Grid`."""
    return Grid.of(translation_nm=geometry.translation_nm, shape_vox=geometry.shape_vox,
                   voxel_size_nm=geometry.voxel_size_nm)


def most_common(grids: Sequence[Grid]) -> Grid:
    """The grid most of `grids` share (the first of them on a tie)."""
    counts = Counter(grids)
    return max(grids, key=lambda g: counts[g])


class AnnotationGrids:
    """The annotation grids of a store's crops (module docstring), looked up once per crop.

    Example:
        >>> grids = AnnotationGrids(data_root="data/synth")
        >>> grids.of(store, "crop7", ["mito", "er"])  # doctest: +SKIP
        {'mito': Grid(...), 'er': Grid(...)}
    """

    def __init__(self, data_root: str | None = None, crops: Mapping[int, Crop] | None = None):
        self.data_root = data_root
        self.crops = dict(crops or {})
        self._catalog: Catalog | None = None

    def catalog(self) -> Catalog | None:
        """The data root's catalogue (None without a data root, or if it cannot be read)."""
        if self._catalog is None and self.data_root:
            try:
                self._catalog = Catalog.from_dir(self.data_root)
            except (FileNotFoundError, OSError, ValueError) as err:
                log.warning("%s: no crop catalogue (%s); crops keep the model's grid", self.data_root, err)
                self.data_root = None
        return self._catalog

    def tests(self) -> list[Mapping[int, Crop]]:
        """The data root's test manifests, 2026 first (the packaged official ones for a root without any; none
        without a data root)."""
        catalog = self.catalog()
        if catalog is None:
            return []
        tests = dict(catalog.tests) or {v: Catalog.official().test(v) for v in TEST_VERSIONS_NEWEST_FIRST}
        return [tests[v] for v in TEST_VERSIONS_NEWEST_FIRST if v in tests]

    def label_grids(self, store: PredictionStore, crop: str) -> dict[str, Grid]:
        """Label → annotation grid of every label the crop annotates (empty when the crop is unknown)."""
        if not is_crop_name(crop):
            return {}
        cid = crop_id(crop)
        if cid in self.crops:
            return {label: to_grid(g) for label, g in self.crops[cid].labels.items()}
        catalog = self.catalog()
        split = store.crop_attrs(crop).get("split")
        if split != "test" and catalog is not None and cid in catalog.train:
            return self._training(catalog, catalog.train[cid])
        grids: dict[str, Grid] = {}
        for manifest in reversed(self.tests()):  # 2026 rows win over 2025 ones
            if cid in manifest:
                grids.update({label: to_grid(g) for label, g in manifest[cid].labels.items()})
        return grids

    def _training(self, catalog: Catalog, crop: Crop) -> dict[str, Grid]:
        grids = {}
        for label, geometry in crop.labels.items():
            grids[label] = to_grid(geometry)
            try:
                level = MultiscaleImage(catalog.locate(crop.crop_url).join(label), backend="zarr").levels[0]
            except (FileNotFoundError, OSError, ValueError):
                continue  # a group given only by its atoms: the manifest's row
            grids[label] = Grid.of(translation_nm=level.translation_nm, shape_vox=level.shape_vox,
                                   voxel_size_nm=level.voxel_size_nm)
        return grids

    def of(self, store: PredictionStore, crop: str, classes: Sequence[str]) -> dict[str, Grid]:
        """Class → the grid to decode it on (module docstring)."""
        known = self.label_grids(store, crop)
        if not known:
            log.info("%s: no annotation geometry found (data root %s); decoded on the model's grid", crop,
                     self.data_root)
            return dict.fromkeys(classes, store.grid(crop))
        fallback = most_common([known[c] for c in classes if c in known] or list(known.values()))
        return {c: known.get(c, fallback) for c in classes}
