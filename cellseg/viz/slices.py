"""What a slice figure draws, loaded: `CropSlice` (EM + truth) and `PredictionSlice` (+ a prediction store).

Every 2D array here is `(rows, cols)` of the slice's `Plane` (see `Plane.image_axes` for which world axes
those are); masks are bool, ids unsigned integers, probabilities float32 in [0, 1].

Example:
    >>> s = load_crop_slice("/tmp/synth", 1, classes=["mito", "er"], axis="z")
    >>> s.masks["mito"].shape, s.plane.describe()
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tqdm import tqdm

from cellseg.classes import all_classes, atoms_of, get_class
from cellseg.data.crops import crop_name
from cellseg.data.prediction_store import QUANTUM, PredictionStore
from cellseg.viz.sources import CropView, Plane, canonical_classes, make_plane, open_crop, parse_voxel_size

log = logging.getLogger(__name__)
MAX_DEFAULT_ROWS = 8  # prediction figures: at most this many classes unless asked for more


@dataclass(frozen=True, kw_only=True)
class CropSlice:
    """EM and class layers of one slice of a crop.

    Attributes:
        crop: `crop<N>`.
        dataset: the dataset the crop belongs to.
        plane: which slice, on which grid.
        em: EM (float32, NaN outside the imaged volume), or None when the root has no EM for it.
        masks: class → foreground.
        known: class → annotated (False outside the annotated box or where the class is unknown).
        ids: instance class → object ids, for instance classes stored as id arrays.
    """

    crop: str
    dataset: str
    plane: Plane
    em: np.ndarray | None
    masks: dict[str, np.ndarray]
    known: dict[str, np.ndarray]
    ids: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def classes(self) -> tuple[str, ...]:
        """The classes loaded, in the order asked for."""
        return tuple(self.masks)

    def subset(self, names: Sequence[str]) -> CropSlice:
        """The same slice with only `names` (which must be loaded)."""
        return dataclasses.replace(self, masks={n: self.masks[n] for n in names},
                                   known={n: self.known[n] for n in names},
                                   ids={n: self.ids[n] for n in names if n in self.ids})

    def title(self) -> str:
        """`crop1 (synth-iso4-1) · z=16 of 32 (at 176 nm) · 4×4×4 nm voxels`."""
        size = "×".join(f"{v:g}" for v in self.plane.volume.voxel_size_nm)
        return f"{self.crop} ({self.dataset}) · {self.plane.describe()} · {size} nm voxels"


def _slice_layers(view: CropView, plane: Plane, names: Sequence[str]
                  ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[str, np.ndarray]]:
    read = view.masks(plane.slab, names)
    masks = {n: plane.squeeze(m) for n, (m, _) in read.items()}
    known = {n: plane.squeeze(k) for n, (_, k) in read.items()}
    ids = {}
    for name in names:
        if get_class(name).instance:
            values = view.ids(plane.slab, name)
            if values is not None:
                ids[name] = plane.squeeze(values)
    return masks, known, ids


def load_crop_slice(root: str | os.PathLike[str] | CropView, crop: int | str | None = None, *,
                    classes: Sequence[str] | None = None, axis: str = "z", index: int | None = None,
                    voxel_size_nm: float | str | Sequence[float] | None = None) -> CropSlice:
    """Read one slice of a crop: EM and the masks (and object ids) of `classes`.

    Args:
        root: a data root (or a `CropView` already opened with `open_crop`).
        crop: crop number (234 or "crop234"); not needed with a `CropView`.
        classes: class names (default: every class the crop annotates, groups of annotated atoms included).
        axis, index: the slice; default the middle one along z. `index` counts voxels of the figure grid.
        voxel_size_nm: the figure grid's voxel size (one number or z, y, x); default the crop's finest
            annotation voxel size. EM and labels are read at this size from whichever level fits.

    Raises:
        ValueError: unknown crop or class, a class the crop does not annotate, an index out of range.
    """
    view = root if isinstance(root, CropView) else open_crop(root, crop if crop is not None else "")
    names = view.check_classes(classes) if classes else view.classes
    grid = view.grid(parse_voxel_size(voxel_size_nm))
    plane = make_plane(grid, axis, index, where=f"{view.name} ({view.dataset})")
    masks, known, ids = _slice_layers(view, plane, names)
    em = view.em(plane.slab)
    return CropSlice(crop=view.name, dataset=view.dataset, plane=plane, em=None if em is None else plane.squeeze(em),
                     masks=masks, known=known, ids=ids)


@dataclass(frozen=True, kw_only=True)
class PredictionSlice:
    """A slice of a prediction store, with the matching truth and EM when a data root is given.

    Attributes:
        store: the store's path.
        kind: "probabilities" or "segmentation".
        prediction: class → float32 probabilities, bool mask, or ids (instance channels of a segmentation).
        truth: the crop's slice on the same plane, or None without a data root.
        threshold: probabilities above it count as foreground in the error panel.
    """

    store: Path
    kind: str
    crop: str
    plane: Plane
    prediction: dict[str, np.ndarray]
    truth: CropSlice | None
    threshold: float = 0.5

    @property
    def classes(self) -> tuple[str, ...]:
        """The classes shown, one figure row each."""
        return tuple(self.prediction)

    def foreground(self, name: str) -> np.ndarray:
        """The predicted mask of `name`: probability above `threshold`, or a non-zero label."""
        values = self.prediction[name]
        if self.kind == "probabilities":
            return values > self.threshold
        return values != 0

    def has_ids(self, name: str) -> bool:
        """True for an instance channel of a segmentation store (uint32 ids; semantic masks are uint8)."""
        return self.kind == "segmentation" and self.prediction[name].dtype != np.uint8

    def title(self) -> str:
        """Store, crop and plane, for the figure's title."""
        size = "×".join(f"{v:g}" for v in self.plane.volume.voxel_size_nm)
        return f"{self.store.name} · {self.crop} · {self.plane.describe()} · {size} nm voxels"


def _read_channel(store: PredictionStore, crop: str, channel: str, plane: Plane) -> np.ndarray:
    region = [slice(None)] * 3
    a = "zyx".index(plane.axis)
    region[a] = slice(plane.index, plane.index + 1)
    data = plane.squeeze(store.image(crop, channel).read_level("s0", tuple(region)))
    if store.kind != "probabilities":
        return data
    if data.dtype == np.uint8:  # quantised: round(255 p)
        return data.astype(np.float32) / QUANTUM
    return data.astype(np.float32)


def _default_rows(prediction: dict[str, np.ndarray], truth: CropSlice | None, *, kind: str,
                  threshold: float) -> tuple[str, ...]:
    """Classes predicted or true in view, the `MAX_DEFAULT_ROWS` with most such pixels, in store order;
    the first `MAX_DEFAULT_ROWS` classes when nothing is in view."""
    sizes = {}
    for name, values in prediction.items():
        predicted = values > threshold if kind == "probabilities" else values != 0
        sizes[name] = int(predicted.sum()) + (int(truth.masks[name].sum()) if truth is not None else 0)
    in_view = [n for n in prediction if sizes[n] > 0]
    if not in_view:
        log.info("nothing predicted or true in view; showing the first %d classes", MAX_DEFAULT_ROWS)
        return tuple(prediction)[:MAX_DEFAULT_ROWS]
    keep = set(sorted(in_view, key=lambda n: -sizes[n])[:MAX_DEFAULT_ROWS])
    if len(in_view) > len(keep):
        log.info("showing the %d classes with most foreground in view; left out: %s (use --classes)",
                 MAX_DEFAULT_ROWS, ", ".join(n for n in in_view if n not in keep))
    return tuple(n for n in in_view if n in keep)


def load_prediction_slice(store_path: str | os.PathLike[str], crop: int | str, *,
                          truth_root: str | os.PathLike[str] | None = None, classes: Sequence[str] | None = None,
                          axis: str = "z", index: int | None = None, threshold: float = 0.5,
                          progress: bool = False) -> PredictionSlice:
    """Read one slice of a prediction store's crop on the store's own grid, and the truth on that plane.

    Args:
        store_path: a prediction or segmentation store (`cellseg.data.prediction_store.PredictionStore`).
        crop: crop number or name present in the store.
        truth_root: data root holding the crop (training crop, or test crop with `ground_truth.zarr`).
        classes: default: the store's classes (also annotated in the truth when given) predicted or true
            in view, at most `MAX_DEFAULT_ROWS`.
        threshold: probability threshold for the error panel (the evaluator's 0.5 by default).
        progress: show a progress bar while reading the store's channels.

    Raises:
        ValueError: unknown crop, class or index out of range (messages name the store and the crop).
    """
    if not 0.0 <= threshold < 1.0:
        raise ValueError(f"threshold {threshold} must be in [0, 1)")
    store = PredictionStore.open(store_path)
    name = crop_name(crop)
    if name not in store:
        raise ValueError(f"{store.path}: no crop {name} (crops: {', '.join(store.completed()) or 'none'})")
    plane = make_plane(store.grid(name), axis, index, where=f"{store.path}/{name}")
    view = open_crop(truth_root, name) if truth_root is not None else None
    held = [c for c in store.classes if c in store.crop_channels(name)]  # a test crop: the classes it is scored on
    available = [c for c in held if view is None or c in view.classes]
    if classes:
        names = canonical_classes(classes)
        missing = [c for c in names if c not in held]
        if missing:
            raise ValueError(f"{store.path}/{name}: no channel for {', '.join(missing)} (classes: {', '.join(held)})")
        if view is not None:
            view.check_classes(names)
    candidates = names if classes else tuple(available)
    prediction = {c: _read_channel(store, name, c, plane)
                  for c in tqdm(candidates, desc=f"read {name}", unit="class", disable=not progress)}
    truth = None
    if view is not None:
        masks, known, ids = _slice_layers(view, plane, candidates)
        em = view.em(plane.slab)
        truth = CropSlice(crop=view.name, dataset=view.dataset, plane=plane,
                          em=None if em is None else plane.squeeze(em), masks=masks, known=known, ids=ids)
    if not classes:
        names = _default_rows(prediction, truth, kind=store.kind, threshold=threshold)
        prediction = {c: prediction[c] for c in names}
        truth = truth.subset(names) if truth is not None else None
    return PredictionSlice(store=store.path, kind=store.kind, crop=name, plane=plane, prediction=prediction,
                           truth=truth, threshold=threshold)


def load_group_slice(root: str | os.PathLike[str] | CropView, crop: int | str | None = None, group: str = "", *,
                     axis: str = "z", index: int | None = None,
                     voxel_size_nm: float | str | Sequence[float] | None = None) -> CropSlice:
    """A slice with a group class (e.g. `mito`) and those of its atoms the crop annotates, group first.

    Raises:
        ValueError: `group` is not a group class, or the crop annotates none of its atoms.
    """
    view = root if isinstance(root, CropView) else open_crop(root, crop if crop is not None else "")
    cls = get_class(group)
    if not cls.is_group:
        groups = ", ".join(c.name for c in all_classes() if c.is_group and c.tested)
        raise ValueError(f"{cls.name!r} is an atom, not a group class; groups: {groups}")
    atoms = [a for a in atoms_of(cls.name) if a in view.classes]
    if not atoms:
        raise ValueError(f"{view.name} ({view.dataset}) annotates none of the atoms of {cls.name} "
                         f"({', '.join(atoms_of(cls.name))}); only the group itself")
    return load_crop_slice(view, classes=[cls.name, *atoms], axis=axis, index=index, voxel_size_nm=voxel_size_nm)
