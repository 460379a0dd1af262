"""`import_volume`: a user's EM (and labels) → a data root in the CellMap layout, atomically.

Steps: open and check every input (nothing is written before all checks pass) → choose the uint8 window →
plan the crops (training | gap | validation along the split axis, plus an optional test box) → write, under
a hidden temporary sibling of `out`, the EM pyramid, the label crops, the manifests, `datasplit.csv`, the
configs and `import.json` → rename into place. An existing `out` is replaced only with `overwrite` and
only when its `import.json` says `cellseg import` wrote it; nothing else is ever deleted.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from cellseg import __version__
from cellseg.classes import tested_classes
from cellseg.data.crops import Geometry
from cellseg.data.write import IMPORTED_ROOT, atomic_dir
from cellseg.ingest import configs, imported_root
from cellseg.ingest.intensity import (
    DEFAULT_PERCENTILES,
    OUT_HIGH,
    OUT_LOW,
    Window,
    check_percentiles,
    choose_window,
)
from cellseg.ingest.labels import Labels, build_labels
from cellseg.ingest.pyramid import pyramid_sections
from cellseg.ingest.readers import AXES, Volume, check_axes, open_volume, split_spec
from cellseg.ingest.split import (
    PlannedCrop,
    em_geometry,
    label_geometry,
    parse_box,
    plan_crops,
    plan_test_crop,
)

log = logging.getLogger(__name__)
MARKER = "import.json"
GENERATOR = "cellseg import"
DEFAULT_GAP_VOX = 256  # EM voxels in-plane: one 2D patch of configs/data/imported_2d.yaml


@dataclass(frozen=True, kw_only=True)
class ImportOptions:
    """What to import and how (`cellseg import --help` explains each option; sizes in nm, z, y, x order).

    Attributes:
        em: the EM volume spec (`cellseg.ingest.readers`).
        out: the data root to create.
        voxel_size_nm: the EM's voxel size (z, y, x), whatever the input's axis order.
        name: dataset name; default from the EM's file name.
        axes: the input's axis order (a permutation of "zyx"), shared by every volume.
        labels: (class, volume spec) per-class inputs.
        label_volume, class_map: one integer label volume and its value → class mapping.
        labels_voxel_size_nm: the labels' voxel size; default the EM's.
        labels_offset_nm: the labels' lower corner relative to the EM's; None (not given): 0, and labels of
            the EM's grid must have its shape.
        split_axis, val_fraction, val_side, gap_nm, crop_nm: the split (`cellseg.ingest.split`); `gap_nm`
            and `crop_nm` default to `DEFAULT_GAP_VOX` in-plane EM voxels.
        test_box: `Z0:Z1,Y0:Y1,X0:X1` in EM voxels: a region outside the labels to predict as a test crop.
        percentiles, window: the uint8 conversion (`cellseg.ingest.intensity`).
        experiments: experiment configs to write train_*.yaml wrappers for; None: the checkout's defaults.
        overwrite: replace an existing root written by `cellseg import`.
    """

    em: str
    out: str | Path
    voxel_size_nm: tuple[float, ...]
    name: str | None = None
    axes: str = AXES
    labels: tuple[tuple[str, str], ...] = ()
    label_volume: str | None = None
    class_map: Mapping[int, str] | None = None
    labels_voxel_size_nm: tuple[float, ...] | None = None
    labels_offset_nm: tuple[float, ...] | None = None
    split_axis: str = "z"
    val_fraction: float = 0.15
    val_side: Literal["start", "end"] = "end"
    gap_nm: float | None = None
    crop_nm: float | None = None
    test_box: str | None = None
    percentiles: tuple[float, ...] = DEFAULT_PERCENTILES
    window: tuple[float, ...] | None = None
    experiments: tuple[str, ...] | None = None
    overwrite: bool = False

    def __post_init__(self) -> None:
        if len(self.voxel_size_nm) != 3 or min(self.voxel_size_nm) <= 0:
            raise ValueError(f"--voxel-size needs 3 positive values (z, y, x in nm), got {len(self.voxel_size_nm)}: "
                             f"{','.join(f'{v:g}' for v in self.voxel_size_nm)}")
        check_axes(self.axes)
        check_percentiles(tuple(self.percentiles))
        if self.window is not None and (len(self.window) != 2 or not self.window[0] < self.window[1]):
            raise ValueError(f"--window {','.join(map(str, self.window))}: needs two values MIN,MAX with MIN < MAX")
        if (self.label_volume is None) != (self.class_map is None):
            raise ValueError("--labels and --class-map go together: the integer volume and what its values mean")
        if self.name is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", self.name):
            raise ValueError(f"--name {self.name!r}: use letters, digits, '.', '_' and '-' (no '/')")

    @property
    def split_gap_nm(self) -> float:
        """`gap_nm`, default one 2D training patch (`DEFAULT_GAP_VOX` in-plane EM voxels)."""
        return DEFAULT_GAP_VOX * max(self.voxel_size_nm[1:]) if self.gap_nm is None else float(self.gap_nm)

    @property
    def split_crop_nm(self) -> float:
        """`crop_nm`, default `DEFAULT_GAP_VOX` in-plane EM voxels."""
        return DEFAULT_GAP_VOX * max(self.voxel_size_nm[1:]) if self.crop_nm is None else float(self.crop_nm)

    @property
    def dataset(self) -> str:
        """The dataset name: `name`, else the EM file's name without its suffix."""
        if self.name:
            return self.name
        path, _ = split_spec(self.em)
        stem = path.name.removesuffix(path.suffix) if path.suffix else path.name
        return re.sub(r"[^A-Za-z0-9._-]", "_", stem).strip("._-") or "imported"


@dataclass(frozen=True, kw_only=True)
class ImportSummary:
    """What `import_volume` wrote."""

    out: Path
    dataset: str
    em_shape: tuple[int, int, int]
    levels_nm: tuple[tuple[float, ...], ...]
    window: str
    crops: dict[str, int]
    gap_nm: float | None
    configs: tuple[Path, ...]
    seconds: float
    warnings: tuple[str, ...] = field(default=())

    def format(self) -> str:
        """A short human-readable summary with the next commands."""
        lines = [f"imported {self.dataset} into {self.out} in {self.seconds:.1f} s",
                 f"  EM {'x'.join(map(str, self.em_shape))} voxels, levels (nm): "
                 + ", ".join("x".join(f"{x:g}" for x in v) for v in self.levels_nm), f"  {self.window}",
                 f"  crops: {self.crops['train']} train, {self.crops['validate']} validate, "
                 f"{self.crops['test']} test" + (f"; gap {self.gap_nm:g} nm" if self.gap_nm is not None else "")]
        lines += [f"  warning: {w}" for w in self.warnings]
        lines += [f"  train: cellseg train {self.out / c}" for c in self.configs]
        return "\n".join(lines)


def _check_out(out: Path, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"--out {out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()):
        if not overwrite:
            raise FileExistsError(f"--out {out} already exists; pass --overwrite to replace a root that "
                                  f"`cellseg import` wrote")
        try:
            generator = json.loads((out / MARKER).read_text()).get("generator")
        except (OSError, ValueError, AttributeError):
            generator = None
        if generator != GENERATOR:
            raise FileExistsError(f"--out {out} was not written by `cellseg import` (no {MARKER} of it); not "
                                  f"replacing it: choose another --out or remove it yourself")
    elif out.is_dir():
        out.rmdir()  # an empty directory holds nothing to lose


def _labels(opts: ImportOptions, em_grid: Geometry) -> Labels | None:
    per_class = [(name, open_volume(spec, axes=opts.axes)) for name, spec in opts.labels]
    mapped = None
    if opts.label_volume and opts.class_map is not None:
        mapped = (open_volume(opts.label_volume, axes=opts.axes), opts.class_map)
    volumes = [v for _, v in per_class] + ([mapped[0]] if mapped else [])
    if not volumes:
        return None
    grid = label_geometry(em_grid, volumes[0].shape, voxel_size_nm=opts.labels_voxel_size_nm,
                          offset_nm=opts.labels_offset_nm, source=volumes[0].source)
    return build_labels(per_class, mapped, grid)


@dataclass(frozen=True, kw_only=True, eq=False)
class ImportPlan:
    """The checked inputs and the crops to write (`plan`)."""

    em: Volume
    window: Window
    labels: Labels | None
    crops: list[PlannedCrop]

    @property
    def classes(self) -> tuple[str, ...]:
        """The annotated classes (none for an EM-only import)."""
        return self.labels.classes if self.labels else ()


def plan(opts: ImportOptions) -> ImportPlan:
    """Open and check every input and plan the crops; writes nothing."""
    em = open_volume(opts.em, axes=opts.axes)
    em_grid = em_geometry(em.shape, opts.voxel_size_nm)
    window = choose_window(em, percentiles=check_percentiles(tuple(opts.percentiles)),
                           window=(float(opts.window[0]), float(opts.window[1])) if opts.window else None)
    labels = _labels(opts, em_grid)
    crops = []
    if labels is not None:
        crops = plan_crops(labels.geometry, axis=opts.split_axis, val_fraction=opts.val_fraction,
                           gap_nm=opts.split_gap_nm, crop_nm=opts.split_crop_nm, val_side=opts.val_side)
    if opts.test_box:
        crops.append(plan_test_crop(em_grid, parse_box(opts.test_box), labels.geometry if labels else None,
                                    len(crops) + 1))
    return ImportPlan(em=em, window=window, labels=labels, crops=crops)


def import_volume(opts: ImportOptions, *, progress: bool = True) -> ImportSummary:
    """Import (module docstring); returns what was written.

    Raises:
        FileNotFoundError: a missing input; FileExistsError: `out` exists (see `_check_out`);
        ValueError: any invalid input or option, naming the file or option.
    """
    from tqdm import tqdm

    start = time.perf_counter()
    out = Path(opts.out).resolve()
    _check_out(out, opts.overwrite)
    p = plan(opts)
    warnings = []
    with atomic_dir(out, overwrite=opts.overwrite, kind=IMPORTED_ROOT) as root:
        root.mkdir()
        with tqdm(total=pyramid_sections(opts.voxel_size_nm, p.em.shape), desc="EM", unit="section",
                  disable=not progress, leave=False) as bar:
            factors, zeros = imported_root.write_em(root, opts.dataset, p.em, p.window, voxel_size_nm=opts.voxel_size_nm,
                                             progress=bar.update)
        if zeros and p.window.identity:
            share = zeros / (p.em.shape[0] * p.em.shape[1] * p.em.shape[2])
            warnings.append(f"{share:.2%} of the EM voxels are 0, the padding value (data.em_pad_value): training "
                            "ignores the 0-valued regions connected to the volume's edge (data.padding_mask=edge) "
                            "and keeps dark regions inside it as data")
        counts = {}
        labelled = [c for c in p.crops if c.role != "test"]
        for crop in tqdm(labelled, desc="crops", unit="crop", disable=not (progress and labelled), leave=False):
            assert p.labels is not None  # labelled crops exist only with labels
            counts[crop.id] = imported_root.write_crop(root, opts.dataset, crop, p.labels)
        imported_root.write_tables(root, final_root=out, dataset=opts.dataset, crops=p.crops, classes=p.classes,
                            test_classes=p.classes or tested_classes())
        written = configs.write_configs(root, final_root=out, dataset=opts.dataset, classes=p.classes,
                                        voxel_size_nm=opts.voxel_size_nm, experiments=opts.experiments) \
            if p.classes else []
        levels = [tuple(float(v) for v in opts.voxel_size_nm)]
        for step in factors:
            levels.append(tuple(v * k for v, k in zip(levels[-1], step, strict=True)))
        _write_record(root / MARKER, opts, p, counts, levels)
    for w in warnings:
        log.warning("%s", w)
    roles = [c.role for c in p.crops]
    return ImportSummary(out=out, dataset=opts.dataset, em_shape=p.em.shape, levels_nm=tuple(levels),
                         window=p.window.describe(), crops={r: roles.count(r) for r in ("train", "validate", "test")},
                         gap_nm=opts.split_gap_nm if p.labels else None, configs=tuple(written),
                         seconds=time.perf_counter() - start, warnings=tuple(warnings))


def _write_record(path: Path, opts: ImportOptions, p: ImportPlan, counts: dict[int, dict[str, int]],
                  levels: list[tuple[float, ...]]) -> None:
    """`import.json`: the inputs, the conversion, the split and every crop (also the marker for --overwrite)."""
    record = {
        "generator": GENERATOR, "cellseg_version": __version__, "dataset": opts.dataset, "em": opts.em,
        "axes": opts.axes, "voxel_size_nm": list(opts.voxel_size_nm), "em_levels_nm": [list(v) for v in levels],
        "uint8": {"low": p.window.low, "high": p.window.high, "percentiles": p.window.percentiles,
                  "dtype": p.window.dtype, "maps_to": [OUT_LOW, OUT_HIGH], "no_data": 0},
        "labels": p.labels.sources if p.labels else {},
        "class_map": {str(k): v for k, v in (opts.class_map or {}).items()},
        "split": {"axis": opts.split_axis, "val_fraction": opts.val_fraction, "val_side": opts.val_side,
                  "gap_nm": opts.split_gap_nm, "crop_nm": opts.split_crop_nm} if p.labels else None,
        "crops": [{"id": c.id, "split": c.role, "voxel_size_nm": list(c.geometry.voxel_size_nm),
                   "translation_nm": list(c.geometry.translation_nm), "shape_vox": list(c.geometry.shape_vox),
                   "class_counts": counts.get(c.id, {})} for c in p.crops],
    }
    path.write_text(json.dumps(record, indent=2) + "\n")
