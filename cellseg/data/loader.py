"""From a `DataConfig` to the training batches, a validation list and the GPU augmentation.

The training batches come from resident blocks when `data.resident` and the budgets allow
(`cellseg.data.resident`: each crop read once, batches cut on the device), else from a DataLoader streaming
patches from zarr. Both yield the same batch dict, and both follow the same `EpochSampler`.

Workers are started with the "spawn" method by default: tensorstore (and zarr's blosc) keep thread pools
that must not be forked, and every worker re-opens its own array handles (they do not pickle) with a
chunk cache bounded in bytes, so host memory stays flat however long the run. Samples are a pure function
of (seed, rank, epoch, index) (`cellseg.data.sampling`), so the number of workers never changes them.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from cellseg.config.schema import AugmentConfig, DataConfig, LoaderConfig
from cellseg.data.augment import GpuAugment
from cellseg.data.boundary_cache import resolve_cache_dir
from cellseg.data.crops import Catalog
from cellseg.data.dataset import EpochSampler, PatchDataset, context_shape
from cellseg.data.resident import ResidentLoader, WindowSpecs, read_resident, spec_workers
from cellseg.data.sampling import PatchSampler, build_foreground_index
from cellseg.data.split import (
    SplitEntry,
    eligible,
    outside_root,
    read_datasplit,
    regroup,
    split_catalog,
    straddling_pairs,
    with_roles,
    write_datasplit,
)
from cellseg.data.targets import CropSource, NoRequestedClass, UnusableCrop
from cellseg.data.threads import read_threads
from cellseg.pool import map_bounded

log = logging.getLogger(__name__)
DATASPLIT_FILE = "datasplit.csv"  # a data root's own split (the official one, or a user's)
AXIS_INDEX = {"z": 0, "y": 1, "x": 2}


def make_split(cfg: DataConfig) -> list[SplitEntry]:
    """The run's split (`data.datasplit`: the data root's datasplit.csv, a given one, or the automatic split),
    every validation crop with its role (tuning or report); says which it is."""
    catalog = Catalog.from_dir(cfg.root)
    limit = cfg.max_annotation_voxel_size_nm or max(cfg.voxel_size_nm)
    root_file = Path(cfg.root) / DATASPLIT_FILE
    if cfg.datasplit == "auto" or (cfg.datasplit is None and not root_file.is_file()):
        why = "data.datasplit=auto" if cfg.datasplit == "auto" else f"no {DATASPLIT_FILE} in {cfg.root}"
        entries = split_catalog(catalog, cfg.classes, validation_fraction=cfg.validation_fraction,
                                seed=cfg.split_seed, max_voxel_size_nm=limit, margin_nm=cfg.split_margin,
                                report_fraction=cfg.report_fraction)
        log.info("%s: automatic split (seed %d, crops within %g nm kept together): %d training, %d validation "
                 "crops", why, cfg.split_seed, cfg.split_margin, *_counts(entries))
        return entries
    path = Path(cfg.datasplit or root_file)
    entries = read_datasplit(path, root=cfg.root)
    eligible_names = {c.name for c in catalog.train.values() if eligible(c, cfg.classes, limit)}
    known = {c.name for c in catalog.train.values()}
    dropped = [e.crop_name for e in entries if e.crop_name in known and e.crop_name not in eligible_names]
    entries = [e for e in entries if e.crop_name not in dropped]
    if dropped:
        log.info("%s: %d crops left out (annotated coarser than %g nm or none of the classes): %s", path,
                 len(dropped), limit, ", ".join(dropped))
    entries = checked_split(entries, catalog, cfg, path)
    entries = with_roles(entries, catalog, cfg.classes, margin_nm=cfg.split_margin,
                         report_fraction=cfg.report_fraction)
    log.info("using %s: %d training, %d validation crops", path, *_counts(entries))
    return entries


MAX_NAMED = 10  # crops or pairs a warning names; the count says how many more
# A given split is checked for boxes that share voxels (validation would score voxels whose labels trained), not
# for the automatic split's margin of one patch: crops merely close are the user's choice (the synthetic roots'
# own splits have some).
OVERLAP_MARGIN_NM = 0.0


def _named(items: Sequence[str]) -> str:
    return ", ".join(items[:MAX_NAMED]) + (f" and {len(items) - MAX_NAMED} more" if len(items) > MAX_NAMED else "")


def checked_split(entries: list[SplitEntry], catalog: Catalog, cfg: DataConfig, path: Path) -> list[SplitEntry]:
    """A given split checked: rows located outside the data root and training/validation crops whose boxes
    overlap are named in warnings; with `cfg.split_overlap` "train" or "validate" each spatial
    group straddling the split moves wholly to that side (`regroup`).

    Raises:
        ValueError: regrouping would leave no training or no validation crop.
    """
    if "://" not in str(cfg.root):
        outside = outside_root(entries, cfg.root)
        if outside:
            log.warning("%s: %d of %d rows locate their crop outside the data root %s (%s): a copy of the data root "
                        "would still read the originals; write their locations relative to the data root",
                        path, len(outside), len(entries), cfg.root, _named(outside))
    pairs = straddling_pairs(entries, catalog, OVERLAP_MARGIN_NM)
    if not pairs:
        return entries
    named = _named([f"{t}~{v}" for t, v in pairs])
    if cfg.split_overlap == "warn":
        log.warning("%s: %d training~validation pairs of crops overlap (validation would score voxels whose labels "
                    "trained): %s; set data.split_overlap=train (or validate) to move each overlapping group to one "
                    "side, or data.datasplit=auto", path, len(pairs), named)
        return entries
    regrouped = regroup(entries, catalog, OVERLAP_MARGIN_NM, to=cfg.split_overlap)
    moved = [e.crop_name for e, r in zip(entries, regrouped, strict=True) if e.split != r.split]
    log.warning("%s: %d training~validation pairs of crops overlap (%s): moved %d crops to %s "
                "(data.split_overlap): %s", path, len(pairs), named, len(moved), cfg.split_overlap, _named(moved))
    return regrouped


def _counts(entries: Sequence[SplitEntry]) -> tuple[int, int]:
    val = sum(e.split == "validate" for e in entries)
    return len(entries) - val, val


def open_crops(entries: list[SplitEntry], cfg: DataConfig, *, skipped: dict[str, str] | None = None
               ) -> list[CropSource]:
    """Open the crops of a split. Crops annotating none of the classes are skipped with a log line, crops that
    cannot give a sample (their box wholly outside their EM) with a warning; `skipped` receives crop → reason.

    Raises:
        ValueError: malformed data (an EM that is not uint8, a label group without `.zattrs`), naming the crop:
            skipping it would train on fewer crops than the user gave without saying so.
    """
    cache_dir = resolve_cache_dir(cfg.boundary_cache)

    def open_one(entry: SplitEntry) -> CropSource | str:
        try:
            return CropSource.open(entry, cfg.classes, backend=cfg.backend, cache_bytes=cfg.cache_bytes,
                                   boundaries=cfg.instance_boundaries, boundary_cache_dir=cache_dir)
        except NoRequestedClass as err:  # skipping is what users want here: a split lists crops of every class
            log.info("skipping %s: %s", entry.crop_name, err)
            return str(err)
        except UnusableCrop as err:
            log.warning("skipping %s: %s", entry.crop_name, err)
            return str(err)
        except ValueError as err:
            raise ValueError(f"{entry.crop_name} ({entry.split} crop of the split): {err}") from err

    opened = map_bounded(open_one, entries, read_threads())
    if skipped is not None:
        skipped.update({e.crop_name: r for e, r in zip(entries, opened, strict=True) if isinstance(r, str)})
    return [crop for crop in opened if not isinstance(crop, str)]


def skipped_record(skipped: dict[str, str]) -> dict[str, object]:
    """What meta.json and result.json record of the crops training skipped: their count and each one's reason."""
    return {"count": len(skipped), "crops": dict(sorted(skipped.items()))}


def warm_boundary_caches(crops: Sequence[CropSource], voxel_size_nm: Sequence[float]) -> None:
    """Build the missing boundary cache files of `crops` now (with a progress bar) rather than in the first
    batches of every worker."""
    from tqdm import tqdm

    todo = [c for c in crops if c.aux_classes and c.boundary_cache_dir]
    for crop in tqdm(todo, desc="boundary cache", unit="crop", disable=not todo, leave=False):
        crop.boundary_cache(voxel_size_nm)


@dataclass
class TrainData:
    """Everything the trainer needs from the data side.

    `loader` is any iterable of batch dicts that follows `sampler` (`sampler.set_epoch(...)`, then `iter(loader)`):
    a `ResidentLoader` or a streaming DataLoader.
    """

    loader: torch.utils.data.DataLoader | ResidentLoader
    dataset: PatchDataset
    sampler: EpochSampler
    augment: GpuAugment
    train_crops: list[CropSource]
    val_crops: list[CropSource]
    split: list[SplitEntry]
    skipped: dict[str, str]  # crop → why it was skipped (`open_crops`)

    @property
    def resident(self) -> str:
        """Where the training data lives: "gpu" or "host" (resident), or "off" (streamed from zarr)."""
        return self.loader.placement if isinstance(self.loader, ResidentLoader) else "off"

    def close(self) -> None:
        """End the loader's persistent workers now: torch ends them only once the DataLoader is garbage, so a
        notebook that trains again would otherwise keep every earlier run's workers."""
        loader = self.loader.windows if isinstance(self.loader, ResidentLoader) else self.loader
        workers = getattr(loader, "_iterator", None)  # where a persistent DataLoader keeps its workers' iterator
        if workers is not None and hasattr(workers, "_shutdown_workers"):
            workers._shutdown_workers()
            loader._iterator = None


@dataclass(frozen=True)
class TrainCrops:
    """The set-up's reading, before it knows where the batches come from: the split, the open training and
    validation crops, and the dataset (its sampling rule over the crops' foreground index). `read_train_crops`
    touches no GPU and writes nothing in a run directory, so `cellseg.train.setup` runs it beside the GPU probe."""

    split: list[SplitEntry]
    train: list[CropSource]
    val: list[CropSource]
    dataset: PatchDataset
    skipped: dict[str, str]  # crop → why it was skipped (`open_crops`)


def read_train_crops(data: DataConfig, loader: LoaderConfig, augment: AugmentConfig, *, seed: int,
                     warm_caches: bool = False) -> TrainCrops:
    """Split, open the crops, index their foreground; `warm_caches` also builds their missing boundary caches
    (one process of a run does: the others then read them).

    Raises:
        ValueError: when no training crop annotates any requested class.
    """
    split = make_split(data)
    skipped: dict[str, str] = {}
    train = open_crops([e for e in split if e.split == "train"], data, skipped=skipped)
    val = open_crops([e for e in split if e.split == "validate"], data, skipped=skipped)
    if not train:
        raise ValueError(f"no training crop annotates any of {list(data.classes)} (data root {data.root})")
    log.info("%d training and %d validation crops for %d classes%s", len(train), len(val), len(data.classes),
             f" ({len(skipped)} skipped: meta.json lists them)" if skipped else "")
    if warm_caches and data.instance_boundaries and data.boundary_cache:
        warm_boundary_caches(train, data.voxel_size_nm)  # before any worker starts
    index = build_foreground_index(train, data.voxel_size_nm, seed=seed)
    extent = [n * v for n, v in zip(data.patch_shape_vox, data.voxel_size_nm, strict=True)]
    sampler = PatchSampler(train, index, patch_extent_nm=extent, mode=data.sampler,
                           slice_axes=[AXIS_INDEX[a] for a in data.slice_axes] if data.is_2d else (0,),
                           seed=seed)
    read_shape = context_shape(data.patch_shape_vox, augment.context_factor if augment.enabled else 1.0,
                               is_2d=data.is_2d)
    dataset = PatchDataset(train, sampler, voxel_size_nm=data.voxel_size_nm, read_shape_vox=read_shape,
                           num_samples=loader.samples_per_epoch, em_pad_value=data.em_pad_value,
                           padding_mask=data.padding_mask, padding_mask_by_dataset=data.padding_mask_by_dataset,
                           patch_shape_vox=data.patch_shape_vox,
                           rotate_p=augment.rotate_p if augment.enabled else 0.0)
    return TrainCrops(split=split, train=train, val=val, dataset=dataset, skipped=skipped)


def build_train_data(data: DataConfig, loader: LoaderConfig, augment: AugmentConfig, *, batch_size: int, seed: int,
                     rank: int = 0, world_size: int = 1, run_dir: str | Path | None = None,
                     mp_context: str = "spawn", device: torch.device | None = None,
                     gpu_room_bytes: int | None = None, crops: TrainCrops | None = None) -> TrainData:
    """Split, open crops, index foreground, and build the training batches (resident or streamed, see
    `data.resident`) and the GPU augmentation.

    `device` is where training runs (default: CUDA when there is one); `gpu_room_bytes` what the model and its
    training step leave free there (default: what is free now); `crops` what `read_train_crops` read already
    (with `warm_caches` where `run_dir` is given), default: read now. `run_dir` receives the split
    (datasplit.csv).

    Raises:
        ValueError: when no training crop annotates any requested class.
    """
    if crops is None:
        crops = read_train_crops(data, loader, augment, seed=seed, warm_caches=run_dir is not None)
    if run_dir is not None:
        write_datasplit(crops.split, Path(run_dir) / "datasplit.csv")
    dataset = crops.dataset
    epochs = EpochSampler(loader.samples_per_epoch, batch_size=batch_size, rank=rank, world_size=world_size)
    device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    resident = read_resident(dataset, data, device=device, gpu_room_bytes=gpu_room_bytes, progress=run_dir is not None)
    batches: torch.utils.data.DataLoader | ResidentLoader
    if resident is None:
        batches = _worker_loader(dataset, epochs, loader, batch_size=batch_size, mp_context=mp_context)
    else:  # workers compute the samples' windows only; the training process cuts them from the blocks
        windows = _worker_loader(WindowSpecs(dataset, resident.grids), epochs, loader, batch_size=batch_size,
                                 mp_context=mp_context, num_workers=spec_workers(loader.num_workers, batch_size))
        batches = ResidentLoader(resident, windows, device=device)
    gpu_augment = GpuAugment(augment, num_classes=data.num_target_channels, num_boundaries=len(data.boundary_classes),
                             patch_shape_vox=data.patch_shape_vox,
                             voxel_size_nm=data.voxel_size_nm, seed=seed, rank=rank)
    return TrainData(loader=batches, dataset=dataset, sampler=epochs, augment=gpu_augment, train_crops=crops.train,
                     val_crops=crops.val, split=crops.split, skipped=crops.skipped)


def _worker_loader(dataset: torch.utils.data.Dataset, epochs: EpochSampler, cfg: LoaderConfig, *, batch_size: int,
                   mp_context: str, num_workers: int | None = None) -> torch.utils.data.DataLoader:
    """A DataLoader of `dataset` over `epochs` in `cfg.num_workers` (or `num_workers`) worker processes."""
    workers = cfg.num_workers if num_workers is None else num_workers
    return torch.utils.data.DataLoader(
        dataset, batch_size=batch_size, sampler=epochs, num_workers=workers, drop_last=True,
        pin_memory=cfg.pin_memory and torch.cuda.is_available(),
        persistent_workers=cfg.persistent_workers and workers > 0,
        prefetch_factor=cfg.prefetch_factor if workers > 0 else None,
        multiprocessing_context=mp_context if workers > 0 else None,
    )
