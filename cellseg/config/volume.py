"""The `volume` section of `cellseg predict-volume`: how a whole dataset is cut into blocks, how many workers run
them and where, and what is written (`cellseg.volume`). Same rules as the other sections
(`cellseg.config.inference`): frozen, keyword-only, `__post_init__` names the key that is wrong."""

from __future__ import annotations

from dataclasses import dataclass

from cellseg.config.fields import _check

CHUNK_VOX = 64  # the output's chunk edge (`cellseg.data.write.DEFAULT_CHUNK`)


@dataclass(frozen=True, kw_only=True)
class VolumeConfig:
    """How `cellseg predict-volume` blocks, schedules and writes a whole volume.

    Attributes:
        roi_nm: the region to predict, "z0:z1,y0:y1,x0:x1" in world nm (null: the whole EM volume at the
            members' voxel size).
        block_vox: edge of a write block in voxels, a multiple of `chunk_vox`: each block is one unit of work
            (read with its context, predicted, written), so larger blocks spend less on context and dispatch.
        block_z_vox: the write block's depth in z (null: `block_vox`, cubic blocks; 0: the ROI's whole depth,
            column blocks). The sliding window streams through a block in z, so a column predicts no tile twice
            along z and holds one tile depth on the GPU and one chunk depth on the host, however deep it is; a
            multiple of `chunk_vox`.
        chunk_vox: edge of the output's zarr chunks in voxels.
        workers: prediction workers (null: one per visible GPU times `workers_per_gpu`; 1 on CPU).
        workers_per_gpu: prediction workers sharing each GPU (with `workers` null).
        cpu_workers: workers of the CPU tasks (instances, pyramids).
        classes: the classes to predict (empty: every class of the members); their boundary channels come along.
        instances: "default" (the post-processing defaults) or a parameter file (JSON, as `cellseg postprocess
            --tune` writes) to decode masks and instance ids after the probabilities (null: probabilities only).
        resume: continue an existing output written with the same settings, skipping finished blocks.
        max_retries: attempts of a failing block after the first, before it is reported as failed.
        block_timeout_s: a block still running after this many seconds has its worker killed and is retried.
        launch: command prefix that starts each worker, e.g. "srun --ntasks=1 --gpus-per-task=1 --exclusive"
            inside a SLURM allocation (empty: a local process).
        host: the address workers connect back to (null: detected; set it on a multi-homed node).
        disk_compression: compression ratio assumed when checking free disk before starting (1: uncompressed).
        scale_nm: with a routed ensemble (`ensemble.routes`): the voxel-size scale (nm) whose band predicts the
            volume.
        gpu_memory_gb: the memory (GB) of the GPUs the workers run on, which a block's blending sums must fit
            (null: the driver's first visible GPU; none visible, e.g. a driver on a batch host: no plan). Blocks
            whose members' sums need more than half of it are made smaller in y and x, with a warning.
    """

    roi_nm: str | None = None
    block_vox: int = 256
    block_z_vox: int | None = None
    chunk_vox: int = CHUNK_VOX
    workers: int | None = None
    workers_per_gpu: int = 1
    cpu_workers: int = 2
    classes: tuple[str, ...] = ()
    instances: str | None = None
    resume: bool = False
    max_retries: int = 2
    block_timeout_s: float = 3600.0
    launch: str = ""
    host: str | None = None
    disk_compression: float = 2.0
    scale_nm: float | None = None
    gpu_memory_gb: float | None = None

    def block_shape(self, depth_vox: int, edge_vox: int | None = None) -> tuple[int, int, int]:
        """(z, y, x) voxels of a write block over an ROI `depth_vox` deep; `edge_vox` (a multiple of `chunk_vox`)
        replaces `block_vox` in y and x (and in z for cubic blocks)."""
        edge = edge_vox or self.block_vox
        if self.block_z_vox is None:
            return (edge,) * 3
        z = self.block_z_vox or max(self.chunk_vox, -(-depth_vox // self.chunk_vox) * self.chunk_vox)
        return z, edge, edge

    def __post_init__(self) -> None:
        _check(self.chunk_vox >= 1, f"volume.chunk_vox={self.chunk_vox}: must be at least 1")
        _check(self.block_vox >= 1 and self.block_vox % self.chunk_vox == 0,
               f"volume.block_vox={self.block_vox} (--block-vox): must be a positive multiple of volume.chunk_vox="
               f"{self.chunk_vox}, so that no two blocks write one chunk")
        _check(self.block_z_vox is None or (self.block_z_vox >= 0 and self.block_z_vox % self.chunk_vox == 0),
               f"volume.block_z_vox={self.block_z_vox} (--block-z-vox): 0 (the ROI's whole depth) or a positive "
               f"multiple of volume.chunk_vox={self.chunk_vox}")
        _check(self.workers is None or self.workers >= 1, f"volume.workers={self.workers} (--workers): at least 1")
        _check(self.workers_per_gpu >= 1, f"volume.workers_per_gpu={self.workers_per_gpu}: at least 1")
        _check(self.cpu_workers >= 1, f"volume.cpu_workers={self.cpu_workers}: at least 1")
        _check(self.max_retries >= 0, f"volume.max_retries={self.max_retries}: 0 or more")
        _check(self.block_timeout_s > 0, f"volume.block_timeout_s={self.block_timeout_s}: must be positive")
        _check(self.disk_compression >= 1, f"volume.disk_compression={self.disk_compression}: at least 1")
        _check(len(set(self.classes)) == len(self.classes), f"volume.classes {list(self.classes)}: listed twice")
        _check(self.gpu_memory_gb is None or self.gpu_memory_gb > 0,
               f"volume.gpu_memory_gb={self.gpu_memory_gb}: must be positive (or null: detected)")
