"""Which crops `cellseg predict` predicts, where their EM is, and the box of each (world space, nm).

* "val": the validation crops of the run's `datasplit.csv`, opened as in training (`CropSource`), so their
  box is exactly the annotated box validation during training predicts and scores.
* "test": the test crops of the data root's `test_crop_manifest.csv` (the official catalogue for a real-data
  root without one); a test crop has no labels, only a box: the union of its labels' boxes.
* ids: a crop of the run's split, else a training crop of the data root's catalogue (its manifest box),
  else a test crop. An id found nowhere is an error that names it.

With another data root (`--data-root`), the run's crops are located through that root's manifests.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cellseg.config.schema import RunConfig
from cellseg.data.arrays import MultiscaleImage
from cellseg.data.crops import CURRENT_TEST_VERSION, TEST_MANIFESTS, Catalog, Crop, crop_id
from cellseg.data.loader import open_crops
from cellseg.data.split import SplitEntry, dataset_paths, read_datasplit
from cellseg.data.targets import CropSource

Vec3 = tuple[float, float, float]


@dataclass(frozen=True, kw_only=True)
class CropTarget:
    """A crop to predict: where its EM is and its box in world space (nm)."""

    name: str  # crop<N>
    dataset: str
    split: str  # "validate", "train" or "test"
    em_url: str
    start_nm: Vec3  # lower corner of the box
    stop_nm: Vec3
    backend: str = "tensorstore"
    cache_bytes: int = 256 * 2**20
    labels: tuple[str, ...] = ()  # a test crop's scored labels (either metric era); empty: every class

    def em(self) -> MultiscaleImage:
        """Open the dataset's EM (uint8).

        Raises:
            FileNotFoundError: naming the crop and the EM location.
        """
        try:
            return MultiscaleImage(self.em_url, backend=self.backend, expected_dtype="uint8",
                                   cache_bytes=self.cache_bytes)
        except (FileNotFoundError, OSError) as err:
            raise FileNotFoundError(f"{self.name} ({self.dataset}): cannot open its EM at {self.em_url}: "
                                    f"{err}") from None

    @property
    def volume_nm3(self) -> float:
        """The box's volume (to balance crops over ranks)."""
        return math.prod(b - a for a, b in zip(self.start_nm, self.stop_nm, strict=True))


def dataset_of(em_url: str) -> str:
    """`jrc_hela-2` from `.../jrc_hela-2/jrc_hela-2.zarr/recon-1/em/fibsem-uint8`."""
    zarr_parts = [p for p in em_url.replace("\\", "/").split("/") if p.endswith(".zarr")]
    return zarr_parts[-1].removesuffix(".zarr") if zarr_parts else ""


def _from_source(crop: CropSource, cfg: RunConfig) -> CropTarget:
    return CropTarget(name=crop.name, dataset=dataset_of(crop.entry.em_url), split=crop.entry.split,
                      em_url=crop.entry.em_url, start_nm=crop.start_nm, stop_nm=crop.stop_nm,
                      backend=cfg.data.backend, cache_bytes=cfg.data.cache_bytes)


def _from_manifest(crop: Crop, split: str, em_url: str, cfg: RunConfig, labels: Sequence[str] = ()) -> CropTarget:
    """The union of the boxes of the crop's labels (test crops have no arrays, only these boxes)."""
    geometries = list(crop.labels.values())
    start = tuple(float(min(g.start_nm[a] for g in geometries)) for a in range(3))
    stop = tuple(float(max(g.stop_nm[a] for g in geometries)) for a in range(3))
    return CropTarget(name=crop.name, dataset=crop.dataset, split=split, em_url=em_url, start_nm=start,  # type: ignore[arg-type]
                      stop_nm=stop, backend=cfg.data.backend, cache_bytes=cfg.data.cache_bytes,  # type: ignore[arg-type]
                      labels=tuple(labels))


def _crop_id(text: str) -> int:
    try:
        return crop_id(text)
    except ValueError as err:
        raise ValueError(f"--crops: {err}; use val, test or ids like 12,34") from None


class _Sources:
    """Where crops come from: the run's datasplit.csv and the data root's catalogue (read once)."""

    def __init__(self, run_dir: Path, root: str, *, relocate: bool):
        self.run_dir, self.root, self.relocate = run_dir, root, relocate
        self._catalog: Catalog | None = None

    def catalog(self) -> Catalog:
        if self._catalog is None:
            self._catalog = Catalog.from_dir(self.root)
        return self._catalog

    def split(self) -> dict[int, SplitEntry]:
        """The rows of the run's datasplit.csv by crop id."""
        path = self.run_dir / "datasplit.csv"
        if not path.is_file():
            raise FileNotFoundError(f"{path}: missing (it lists the run's validation crops)")
        return {_crop_id(e.crop_name): e for e in read_datasplit(path, root=self.root)}

    def locate(self, entry: SplitEntry) -> SplitEntry:
        """The row as it is, or with another data root (`relocate`) the same crop located in that root."""
        if not self.relocate:
            return entry
        catalog = self.catalog()
        crop = catalog.train.get(_crop_id(entry.crop_name))
        if crop is None:
            raise ValueError(f"{entry.crop_name} of {self.run_dir / 'datasplit.csv'} is not in the training "
                             f"manifest of {self.root}")
        return SplitEntry(split=entry.split, em_url=str(catalog.locate(crop.em_url)),
                          crop_url=str(catalog.locate(crop.crop_url)), classes=entry.classes)

    def tests(self) -> dict[int, Crop]:
        """The data root's test crops, or the official ones for a real-data root without a test manifest."""
        tests = self.catalog().tests
        if tests:
            return dict(tests[CURRENT_TEST_VERSION] if CURRENT_TEST_VERSION in tests else next(iter(tests.values())))
        return dict(Catalog.official().test(CURRENT_TEST_VERSION))

    def scored_labels(self, crop_id: int) -> tuple[str, ...]:
        """The labels a test crop is scored on in any metric era (the union of the test manifests)."""
        tests = self.catalog().tests or {v: Catalog.official().test(v) for v in TEST_MANIFESTS}
        return tuple(sorted({label for crops in tests.values() if crop_id in crops for label in crops[crop_id].labels}))

    def em_of(self, dataset: str) -> str:
        """The EM of a dataset: as a training crop of it lists it, else the standard layout under the root."""
        catalog = self.catalog()
        for crop in catalog.crops_of(dataset):
            if crop.em_url:
                return str(catalog.locate(crop.em_url))
        return dataset_paths(self.root, dataset)[0]


def select_targets(spec: str, cfg: RunConfig, run_dir: str | Path, *, data_root: str | None = None
                   ) -> list[CropTarget]:
    """The crops of `--crops`: "val" (the run's validation crops), "test" (the data root's test crops) or
    comma-separated ids (training crops of the datasplit or the catalogue, or test crops).

    Args:
        spec: "val", "test" or ids ("12,34" or "crop12,crop34").
        cfg: the run's config (its `data.root` is where crops are found, unless `data_root`).
        run_dir: the run directory (its datasplit.csv).
        data_root: another data root; the run's crops are then located through its manifests.

    Raises:
        ValueError: a crop id found nowhere (named), or no crop selected.
        FileNotFoundError: no datasplit.csv in the run directory.
    """
    run_dir = Path(run_dir)
    sources = _Sources(run_dir, data_root or cfg.data.root, relocate=data_root is not None)
    if spec == "val":
        rows = [sources.locate(e) for e in sources.split().values() if e.split == "validate"]
        targets = [_from_source(c, cfg) for c in open_crops(rows, cfg.data)]
        if not targets:
            raise ValueError(f"{run_dir / 'datasplit.csv'}: no validation crop annotates the run's classes")
        return targets
    if spec == "test":
        return [_from_manifest(c, "test", sources.em_of(c.dataset), cfg, sources.scored_labels(cid))
                for cid, c in sources.tests().items()]
    wanted = list(dict.fromkeys(_crop_id(t) for t in spec.split(",") if t.strip()))  # in order, once each
    if not wanted:
        raise ValueError("--crops: no crop given (use val, test or ids like 12,34)")
    split = sources.split()
    targets = []
    for cid in wanted:
        opened = open_crops([sources.locate(split[cid])], cfg.data) if cid in split else []
        if opened:  # a crop of the run's split that annotates its classes: the box validation uses
            targets.append(_from_source(opened[0], cfg))
            continue
        if cid in sources.catalog().train:
            crop = sources.catalog().train[cid]
            targets.append(_from_manifest(crop, "train", str(sources.catalog().locate(crop.em_url)), cfg))
        elif cid in sources.tests():
            crop = sources.tests()[cid]
            targets.append(_from_manifest(crop, "test", sources.em_of(crop.dataset), cfg, sources.scored_labels(cid)))
        else:
            raise ValueError(f"crop {cid} is in neither the run's datasplit.csv nor the training or test manifest "
                             f"of {sources.root}")
    return targets
