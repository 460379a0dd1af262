"""`cellseg predict-volume --dry-run`: the plan of a whole-volume run, checked as the run checks it, with nothing
predicted or written.

It prints the ROI and its grid, the write blocks and the workers, the output's size (probabilities as uint8 and,
with `--instances`, labels, pyramids included; uncompressed, and over `volume.disk_compression`) against the free
disk where `--out` goes, and per member the EM it reads (each block's lattice box with its context: what the halo
costs) and its GPU time at the recorded rate of its architecture (`cellseg.infer.rates`), summed over the
members (they run in lockstep on one GPU) and divided among the GPUs given.
"""

from __future__ import annotations

import math
from typing import Any

from cellseg.data.grid import shape3
from cellseg.data.inspect import free_disk, human_bytes
from cellseg.infer import rates
from cellseg.infer.tiling import GPU_FUSED_FRACTION, context_margin
from cellseg.volume.driver import Decided, member_streams, plan_job
from cellseg.volume.plan import block_boxes, block_sums_bytes, estimate_bytes, lattice_box


def dry_run(job: Any, decided: Decided | None = None) -> str:
    """The plan of `job` (a `PredictVolumeJob`) as text; see the module docstring."""
    plan = plan_job(job, decided)
    opts, vol, grid = job.infer, job.volume, plan.grid
    instances = vol.instances is not None
    boxes = block_boxes(grid.shape_vox, plan.block_vox)
    shape, voxels = "×".join(map(str, grid.shape_vox)), math.prod(grid.shape_vox)
    kind = "columns" if plan.block_vox[0] >= grid.shape_vox[0] and vol.block_z_vox is not None else "blocks"
    on = f"GPUs {','.join(plan.workers.gpus)}" if plan.workers.gpus else "the CPU"
    lines = [f"dry run: {job.dataset} at {'×'.join(f'{v:g}' for v in grid.voxel_size_nm)} nm, {shape} voxels "
             f"({voxels:.3g}) from {tuple(round(t, 1) for t in grid.translation_nm)} nm into {job.out}; nothing is "
             "predicted or written",
             f"blocks: {len(boxes)} {kind} of {'×'.join(map(str, plan.block_vox))} voxels, "
             f"{plan.workers.predict} prediction worker(s) on {on}, {plan.workers.cpu} CPU worker(s)"]
    need = estimate_bytes(grid, plan.channels, plan.label_bytes(instances))
    (where, free), compressed = free_disk(job.out), need.total / max(vol.disk_compression, 1.0)
    lines.append(f"output: {len(plan.channels)} probability channels ({human_bytes(need.probabilities)})"
                 + (f" and {len(plan.classes)} label arrays ({human_bytes(need.labels)})" if instances else "")
                 + f" with pyramids, uncompressed; about {human_bytes(compressed)} at volume.disk_compression="
                 f"{vol.disk_compression:g}; {where}: {human_bytes(free)} free "
                 f"({'fits' if compressed <= free else 'does NOT fit: the run would be refused'})")
    sums = block_sums_bytes(plan.block_vox[1], member_streams(plan.members, plan.channels, opts.overlap))
    lines.append(f"GPU memory: the members' blending sums take {sums / 1e9:.2f} GB per block (blocks are made "
                 f"narrower when they would take more than {GPU_FUSED_FRACTION:.0%} of the GPU: "
                 "volume.gpu_memory_gb, else the driver's GPU)")
    table, time = rates.packaged(), rates.GpuTime()
    for run, tta in zip(plan.members.runs, plan.members.transforms(opts), strict=True):
        patch = shape3(run.cfg.data.patch_shape_vox)
        margin = context_margin(patch)
        reads = [[n + 2 * m for n, m in zip(lattice_box(b, patch, opts.overlap)[1], margin, strict=True)]
                 for b in boxes]
        gvox = sum(math.prod(r) for r in reads) / 1e9
        seconds = rates.gpu_seconds(run.cfg.model.name, reads, tta=tta, overlap=opts.overlap) \
            if run.cfg.model.preset == "default" else None
        estimate = time.add(run.run_dir.name, seconds)
        lines.append(f"member {run.run_dir.name} ({run.cfg.model.name}, TTA {tta}): reads {gvox:.3g} Gvoxels of EM "
                     f"with context ({gvox * 1e9 / voxels:.2f}× the ROI); {estimate}")
    if time.unknown:
        lines.append(time.missing())
    else:
        gpus = max(1, len(plan.workers.gpus))
        lines.append(f"GPU time: ≈ {rates.duration(time.total_s)} on one {table['device']} "
                     f"({voxels / time.total_s / 1e6:.3g} Mvox/s), ≈ {rates.duration(time.total_s / gpus)} on the "
                     f"{gpus} GPU(s) given, at the rates of {table['source']} ({table['date']}; a crop's rate: "
                     "start-up, the pyramid and writing come on top)")
    return "\n".join(lines)
