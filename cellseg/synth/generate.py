"""`generate`: build a whole synthetic data root, in parallel, atomically.

Stages (each parallel over `workers` processes; `workers=1` runs everything in this process):
1. one scene per dataset (`scene.py`);
2. EM blocks (`render.py`) and crops (rasterised and written by the worker, `synthetic_root.py`);
3. EM pyramids, one dataset per worker;
4. validation choice (`splits.py`), manifests, datasplit and `synth.json`.

Everything is written under a hidden temporary sibling of the output directory that is renamed into
place at the end, so an interrupted run leaves nothing that looks like a finished root (and the next run
for the same output removes what a killed one left). `overwrite` replaces only a root `cellseg synth`
made (its `synth.json`) and holding nothing else.

Workers run in a `ProcessPoolExecutor`: a worker that dies or whose initializer fails ends the command
with that error (a `multiprocessing.Pool` would start replacements for ever).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import logging
import multiprocessing
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cellseg import __version__
from cellseg.data.inspect import disk_bytes, human_bytes
from cellseg.data.write import SYNTH_ROOT, atomic_dir, check_replaceable
from cellseg.synth import synthetic_root
from cellseg.synth.presets import Preset, get_preset
from cellseg.synth.render import blocks, render_block
from cellseg.synth.scene import Scene, build_scene
from cellseg.synth.splits import choose_validation

log = logging.getLogger(__name__)
_SCENES: list[Scene] = []  # the scenes tasks refer to by index (set in each worker by `_init_worker`)
_INIT_ERROR: list[BaseException] = []  # what `_init_worker` raised in this worker, re-raised by every task
# Top-level entries of a synthetic root besides its datasets (`synthetic_root.py`): what `overwrite` may remove.
_ROOT_FILES = {synthetic_root.GROUND_TRUTH, "manifest.csv", "train_crop_manifest.csv", "test_crop_manifest.csv",
               "datasplit.csv", "synth.json"}
_PRELOAD = ("cellseg.synth.generate", "scipy.ndimage", "cc3d", "zarr", "numcodecs.blosc")


@dataclass(frozen=True, kw_only=True)
class SynthSummary:
    """What `generate` made.

    Attributes:
        out: the data root.
        datasets: (name, EM voxel size nm, EM shape) per dataset.
        crops: number of crops per split ("train", "validate", "test").
        em_voxels: EM s0 voxels over all datasets.
        bytes_on_disk: size of the root.
        seconds: wall time.
    """

    out: Path
    preset: str
    seed: int
    datasets: tuple[tuple[str, tuple[float, ...], tuple[int, ...]], ...]
    crops: dict[str, int]
    em_voxels: int
    bytes_on_disk: int
    seconds: float

    def format(self) -> str:
        """A short human-readable summary."""
        lines = [f"synthetic CellMap root {self.out} (preset {self.preset}, seed {self.seed})"]
        for name, vs, shape in self.datasets:
            lines.append(f"  {name:<16} EM {'x'.join(map(str, shape))} voxels at {'x'.join(f'{v:g}' for v in vs)} nm")
        lines.append(f"  crops: {self.crops['train']} train, {self.crops['validate']} validate, "
                     f"{self.crops['test']} test")
        lines.append(f"  {self.em_voxels / 1e6:.1f} M EM voxels, {human_bytes(self.bytes_on_disk)} on disk, "
                     f"{self.seconds:.1f} s")
        return "\n".join(lines)


def _init_worker(scenes: list[Scene]) -> None:
    from numcodecs import blosc

    blosc.use_threads = False  # see `_deterministic_blosc`
    _SCENES[:] = scenes


def _guarded_init(initializer: Callable[[list[Scene]], None], scenes: list[Scene]) -> None:
    """Run a worker's initializer; its error is kept and raised by every task, so that it reaches the parent
    (an initializer that raises only makes the pool start another worker, which fails the same way)."""
    try:
        initializer(scenes)
    except BaseException as err:  # whatever it is, the parent must see it (`_task`)
        err.add_note("in the initializer of a `cellseg synth` worker process")
        _INIT_ERROR.append(err)


def _task(fn: Callable[[Any], Any], task: Any) -> Any:
    """Run one task in a worker, or raise its initializer's error."""
    if _INIT_ERROR:
        raise _INIT_ERROR[0]
    return fn(task)


@contextlib.contextmanager
def _deterministic_blosc() -> Iterator[None]:
    """Compress without blosc threads in this process too.

    numcodecs uses blosc threads only in the main process, and threaded blosc writes different (equally
    valid) bytes for the same chunk; without this, outputs would depend on the number of workers.
    """
    from numcodecs import blosc

    previous, blosc.use_threads = blosc.use_threads, False
    try:
        yield
    finally:
        blosc.use_threads = previous


def _build(args: tuple[Preset, int, int, list[int]]) -> Scene:
    preset, seed, index, crop_ids = args
    return build_scene(preset.datasets[index], preset.style, seed=seed, index=index, crop_ids=crop_ids)


def _work(task: tuple[Any, ...]) -> tuple[Any, ...]:
    kind = task[0]
    if kind == "block":
        _, scene_index, block_index, start, shape = task
        return kind, scene_index, start, shape, render_block(_SCENES[scene_index], start, shape, block_index)
    if kind == "crop":
        _, scene_index, crop_number, root = task
        scene = _SCENES[scene_index]
        crop = scene.crops[crop_number]
        write = synthetic_root.write_test_crop if crop.role == "test" else synthetic_root.write_train_crop
        return kind, crop.id, crop.role, write(Path(root), scene, crop)
    _, scene_index, root, em = task
    synthetic_root.write_em(Path(root), _SCENES[scene_index], em)
    return (kind,)


def _run(fn: Callable[[Any], Any], tasks: list[Any], *, workers: int, scenes: list[Scene], desc: str) -> Iterator[Any]:
    from tqdm import tqdm

    bar = tqdm(total=len(tasks), desc=desc, unit="task", disable=None, leave=False)
    if workers <= 1 or len(tasks) <= 1:
        _SCENES[:] = scenes
        for task in tasks:
            yield fn(task)
            bar.update()
        _SCENES.clear()
    else:
        yield from _run_pool(fn, tasks, workers=workers, scenes=scenes, bar=bar)
    bar.close()


def _run_pool(fn: Callable[[Any], Any], tasks: list[Any], *, workers: int, scenes: list[Scene], bar: Any
              ) -> Iterator[Any]:
    """Results of `fn` over `tasks` from worker processes, in completion order; the first error ends it all."""
    # forkserver: workers never inherit threads (blosc, tqdm) from this process; the server imports
    # the heavy modules once so that each worker starts in milliseconds.
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(_PRELOAD))
    pool = concurrent.futures.ProcessPoolExecutor(min(workers, len(tasks)), mp_context=context,
                                                  initializer=_guarded_init, initargs=(_init_worker, scenes))
    try:
        futures = [pool.submit(_task, fn, task) for task in tasks]
        for future in concurrent.futures.as_completed(futures):
            yield future.result()  # a worker's exception, or BrokenProcessPool when one died
            bar.update()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)  # workers exit normally (blosc releases its semaphore)


def _crop_ids(preset: Preset) -> list[list[int]]:
    """Training crops are numbered 1, 2, ... and test crops 501, 502, ... across all datasets."""
    next_id = {"train": 1, "test": 501}
    ids = []
    for spec in preset.datasets:
        ids.append([])
        for crop in spec.crops:
            ids[-1].append(next_id[crop.role])
            next_id[crop.role] += 1
    return ids


def _prepare_out(out: Path, overwrite: bool) -> None:
    """Check `out` before any work: absent, empty, or (with `overwrite`) a root this command made."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()):
        if not overwrite:
            raise ValueError(f"--out {out} is not empty; pass --overwrite to replace it")
        check_replaceable(out, overwrite=True, kind=SYNTH_ROOT)
        made = json.loads((out / "synth.json").read_text())
        expected = _ROOT_FILES | {d["name"] for d in made.get("datasets", [])}
        foreign = sorted(p.name for p in out.iterdir() if p.name not in expected)
        if foreign:
            raise FileExistsError(f"--out {out} is a synthetic data root that also holds what `cellseg synth` did "
                                  f"not write ({', '.join(foreign[:5])}); --overwrite would delete it: move it out "
                                  "first or choose another --out")
    elif out.is_dir():
        out.rmdir()  # an empty directory is simply replaced


def _render_and_write(root: Path, scenes: list[Scene], preset: Preset, workers: int) -> dict[int, tuple[str, dict]]:
    tasks: list[tuple[Any, ...]] = [("crop", i, k, str(root)) for i, s in enumerate(scenes) for k in range(len(s.crops))]
    tasks += [("block", i, b, start, shape) for i, s in enumerate(scenes)
              for b, (start, shape) in enumerate(blocks(s.em.shape_vox, preset.block_vox))]
    volumes = [np.zeros(s.em.shape_vox, dtype=np.uint8) for s in scenes]
    crops: dict[int, tuple[str, dict]] = {}
    for result in _run(_work, tasks, workers=workers, scenes=scenes, desc="render"):
        if result[0] == "block":
            _, i, start, shape, data = result
            volumes[i][tuple(slice(s, s + n) for s, n in zip(start, shape, strict=True))] = data
        else:
            crops[result[1]] = (result[2], result[3])
    log.info("rendered %d EM blocks and wrote %d crops", len(tasks) - len(crops), len(crops))
    em_tasks = [("em", i, str(root), volumes[i]) for i in range(len(scenes))]
    for _ in _run(_work, em_tasks, workers=workers, scenes=scenes, desc="write EM"):
        pass
    log.info("wrote %d EM pyramids", len(scenes))
    return crops


def generate(out: str | Path, *, preset: str | Preset = "tiny", seed: int = 0, workers: int = 1,
             overwrite: bool = False) -> SynthSummary:
    """Generate a synthetic CellMap-layout data root at `out` (module docstring).

    Args:
        out: the data root to create.
        preset: "tiny", "small", "medium" (see `presets.py`) or a `Preset`.
        seed: the same seed and preset give byte-identical arrays, whatever `workers`.
        workers: processes for rendering and writing.
        overwrite: replace a non-empty `out`.

    Raises:
        ValueError: unknown preset, or `out` is a file or a non-empty directory without `overwrite`.
        FileExistsError: `overwrite` of something other than a synthetic root this command made (or one
            holding other files too).
    """
    start_time = time.perf_counter()
    spec, out = (preset if isinstance(preset, Preset) else get_preset(preset)), Path(out).resolve()
    _prepare_out(out, overwrite)
    ids = _crop_ids(spec)
    build_tasks = [(spec, seed, i, ids[i]) for i in range(len(spec.datasets))]
    scenes = sorted(_run(_build, build_tasks, workers=workers, scenes=[], desc="scenes"), key=lambda s: s.index)
    log.info("built %d scenes (%d shapes)", len(scenes), sum(len(s.shapes) for s in scenes))
    with atomic_dir(out, overwrite=overwrite, kind=SYNTH_ROOT) as root, _deterministic_blosc():
        root.mkdir(parents=True)
        crops = _render_and_write(root, scenes, spec, workers)
        present = {cid: {c for c, n in counts.items() if n} for cid, (role, counts) in crops.items() if role == "train"}
        validate = choose_validation(present, fraction=spec.validation_fraction, seed=seed)
        _warn_uncovered(present, validate)
        meta = {"generator": "cellseg synth", "cellseg_version": __version__, "preset": spec.name, "seed": seed}
        synthetic_root.write_tables(root, final_root=out, scenes=scenes, validate=validate, meta=meta)
    num = {"train": len(present) - len(validate), "validate": len(validate),
           "test": sum(1 for role, _ in crops.values() if role == "test")}
    return SynthSummary(out=out, preset=spec.name, seed=seed, crops=num, em_voxels=spec.num_em_voxels,
                        datasets=tuple((s.name, s.em.voxel_size_nm, s.em.shape_vox) for s in scenes),
                        bytes_on_disk=disk_bytes(out), seconds=time.perf_counter() - start_time)


def _warn_uncovered(present: dict[int, set[str]], validate: Iterable[int]) -> None:
    validate = set(validate)
    everywhere = set().union(*present.values()) if present else set()
    in_val = set().union(*(present[c] for c in validate)) if validate else set()
    in_train = set().union(*(present[c] for c in present if c not in validate))
    for where, classes in (("validation", everywhere - in_val), ("training", everywhere - in_train)):
        if classes:
            log.warning("classes present in no %s crop: %s", where, ", ".join(sorted(classes)))
