"""The tasks of a whole-volume run and what a worker does with one block of each, given only the store.

In order (each block of a task waits for the blocks of the tasks before it that it reads):

| task | block | does |
|---|---|---|
| `predict` | a write block | the ensemble's probabilities (`cellseg.volume.predict.BlockPredictor`) |
| `pyramid-probabilities-<L>` | a block of level L | s<L> of every probability channel from s<L-1> |
| `decode` | a write block (+ halo) | masks / provisional ids (`cellseg.volume.instances.decode_store_block`) |
| `merge` | the whole ROI, once | the ids linked over block faces (`merge_store`) |
| `relabel` | a write block | final ids (`relabel_store_block`) |
| `pyramid-labels-<L>` | a block of level L | s<L> of every label class from s<L-1> |

Blocks are boxes in s0 voxels of the ROI (`cellseg.volume.plan.Box`); a level-L block is the write block halved
L times and rounded up to whole chunks of level L (`cellseg.volume.store.level_block_vox`), so each level is built
in as many blocks as s0 until its chunks are larger than that, and no two blocks write one chunk.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cellseg.volume.plan import Box
from cellseg.volume.store import LABELS, PROBABILITIES, VolumeStore, level_block_vox

PREDICT, DECODE, MERGE, RELABEL = "predict", "decode", "merge", "relabel"
PYRAMID = "pyramid"


def pyramid_task(group: str, level: int) -> str:
    """The task id of level `level` of `group` ("probabilities" or "labels")."""
    return f"{PYRAMID}-{group}-{level}"


def parse_pyramid(task: str) -> tuple[str, int]:
    """(group, level) of a pyramid task id."""
    _, group, level = task.split("-")
    return group, int(level)


def instance_params(store: VolumeStore) -> Any:
    """The post-processing parameters the store records ("default": every class's defaults)."""
    from cellseg.postprocess.params import ParamSet

    source = store.attrs["settings"].get("instances")
    return ParamSet() if source in (None, "default") else ParamSet.load(source)


def handler(store: VolumeStore, task: str, device: str = "auto") -> Callable[[Box], None]:
    """What a worker of `task` does with one block (built once per worker: models and lookups are loaded here).

    Raises:
        ValueError: an unknown task.
    """
    block = store.block_vox
    if task == PREDICT:
        from cellseg.volume.predict import BlockPredictor

        return BlockPredictor.of(store, device).write
    if task.startswith(PYRAMID + "-"):
        from cellseg.volume.pyramid import downsample_store_block

        group, level = parse_pyramid(task)
        names = store.channels if group == PROBABILITIES else store.classes
        own = level_block_vox(block, store.chunk_vox, level)

        def downsample(box: Box) -> None:
            offset = [o >> level for o in box[0]]  # s0 voxels → voxels of the level (a multiple of its block)
            for name in names:
                downsample_store_block(store.path / group / name, level, offset, block_vox=own)

        return downsample
    if task in (DECODE, MERGE, RELABEL):
        from cellseg.volume import instances

        params = instance_params(store)
        voxel = store.grid.voxel_size_nm
        if task == DECODE:
            def decode(box: Box) -> None:
                for name in store.classes:
                    instances.decode_store_block(store.path, name, box[0], block_vox=block, params=params,
                                                 voxel_size_nm=voxel)
            return decode
        if task == MERGE:
            def merge(box: Box) -> None:
                for name in store.instance_classes:
                    instances.merge_store(store.path, name, block_vox=block, params=params, voxel_size_nm=voxel)
            return merge
        lookups: dict[str, Any] = {}

        def relabel(box: Box) -> None:
            for name in store.instance_classes:
                if name not in lookups:  # read once per worker, after the merge wrote it
                    lookups[name] = instances.load_lookup(instances.face_record_dir(store.path, name))
                instances.relabel_store_block(store.path, name, box[0], block_vox=block, lookup=lookups[name])
        return relabel
    raise ValueError(f"{store.path}: unknown task {task!r}")


def label_groups(store: VolumeStore) -> list[str]:
    """The groups whose pyramids the run builds: probabilities, and labels when the store has them."""
    return [PROBABILITIES, *([LABELS] if store.has_labels else [])]
