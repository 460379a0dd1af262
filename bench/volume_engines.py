"""The engines `bench/predict_volume.py` times on one volume, each from a `cellseg predict-volume` config: the
daisy run, the same blocks in one process, the ROI in one piece, MONAI's `sliding_window_inference`; and the
GPU's utilisation while one runs."""

from __future__ import annotations

import math
import shutil
import subprocess
import time
from typing import Any


def sig(x: float) -> float:
    """Four significant digits (rates span 10⁻³ on a loaded CPU to 10² on a GPU)."""
    return float(f"{x:.4g}")


def blockwise(config: Any) -> dict[str, Any]:
    """One daisy run, timed from the driver's start."""
    from cellseg.volume.driver import predict_volume

    start = time.perf_counter()
    result = predict_volume(config, progress=False)
    wall = time.perf_counter() - start
    from cellseg.volume.store import VolumeStore

    store = VolumeStore.open(config.out)
    voxels = math.prod(store.grid.shape_vox)
    if not result.ok:
        raise RuntimeError(f"{config.out}: the run failed: {result.failed} {result.errors}")
    timing = result.timing.get("predict", {})
    span = timing.get("span_s") or wall
    pyramid = sum(t["busy_s"] for name, t in result.timing.items() if name.startswith("pyramid-probabilities"))
    return {"wall_s": round(wall, 2), "voxels": voxels, "mvox_s": sig(voxels / wall / 1e6),
            "predict_span_s": round(span, 2), "startup_s": timing.get("startup_s"), "pyramid_s": round(pyramid, 2),
            "steady_mvox_s": sig(voxels / span / 1e6), "blocks": result.tasks["predict"]["total"],
            "tasks": result.tasks, "timing": result.timing}


def single_process(config: Any, *, one_piece: bool = False) -> dict[str, Any]:
    """The blockwise run's blocks one after the other in one process, no scheduler: models loaded, then each
    block through the same engine (`BlockPredictor.write`); `one_piece`: the whole ROI as one write box (no
    blocks, no halo), what the columns and cubes are measured against."""
    from cellseg.volume.driver import prepare
    from cellseg.volume.plan import block_boxes
    from cellseg.volume.predict import BlockPredictor

    start = time.perf_counter()
    store = prepare(config).store  # the checks and an empty store, as the blockwise run pays them
    predictor = BlockPredictor.of(store, config.infer.device)
    loaded = time.perf_counter()
    shape = tuple(store.grid.shape_vox)
    boxes = [((0, 0, 0), shape)] if one_piece else block_boxes(shape, store.block_vox)
    for box in boxes:
        predictor.write(box)
    end = time.perf_counter()
    voxels = math.prod(shape)
    return {"wall_s": round(end - start, 2), "startup_s": round(loaded - start, 2), "voxels": voxels,
            "blocks": len(boxes), "mvox_s": sig(voxels / (end - start) / 1e6),
            "predict_span_s": round(end - loaded, 2), "steady_mvox_s": sig(voxels / (end - loaded) / 1e6)}


def monai_sliding_window(config: Any) -> dict[str, Any]:
    """MONAI's `sliding_window_inference` over the same EM, model, patch, overlap, batch and Gaussian blending
    (σ = patch / 8, as cellseg's), through the same forward (uint8 → float, bf16 autocast, channels-last, sigmoid):
    the sliding-window engines compared with the model held equal. The EM is read whole onto the GPU; the
    output (every channel, float32) stays on the GPU when it fits beside the model's working memory, else in
    host memory (MONAI's `device="cpu"`, recorded). Nothing is written."""
    import torch
    from monai.inferers import sliding_window_inference

    from cellseg.infer.engine import _read_em, make_forward
    from cellseg.volume.driver import prepare
    from cellseg.volume.predict import BlockPredictor

    start = time.perf_counter()
    store = prepare(config).store
    predictor = BlockPredictor.of(store, config.infer.device)
    part = predictor.parts[0]
    window, model = part.member.window, part.member.run.model
    em = _read_em(predictor.em, store.grid, (0, 0, 0), window.pad_value)[None].to(window.device, torch.float32)
    forward = make_forward(model, device=window.device, precision=window.precision, keep=part.keep,
                           channels_last=window.channels_last and window.device.type == "cuda")
    out_bytes = 4 * len(part.keep) * math.prod(store.grid.shape_vox) * 2  # the sums and MONAI's blended copy
    on_gpu = window.device.type == "cuda" and out_bytes < torch.cuda.mem_get_info(window.device)[0] - 16 * 2**30
    output_device = window.device if on_gpu else torch.device("cpu")
    loaded = time.perf_counter()
    with torch.inference_mode():
        probs = sliding_window_inference(em, roi_size=window.patch_vox, sw_batch_size=window.batch_size,
                                         predictor=forward, overlap=window.overlap, mode="gaussian",
                                         sigma_scale=1 / 8, padding_mode="constant", cval=float(window.pad_value),
                                         sw_device=window.device, device=output_device)
    if window.device.type == "cuda":
        torch.cuda.synchronize(window.device)
    end = time.perf_counter()
    if not bool(torch.isfinite(probs).all()):
        raise RuntimeError("MONAI's sliding window returned NaN or infinite probabilities")
    del probs
    shutil.rmtree(config.out)  # the empty store `prepare` made
    voxels = math.prod(store.grid.shape_vox)
    return {"wall_s": round(end - start, 2), "startup_s": round(loaded - start, 2), "voxels": voxels, "blocks": 1,
            "mvox_s": sig(voxels / (end - start) / 1e6), "predict_span_s": round(end - loaded, 2),
            "steady_mvox_s": sig(voxels / (end - loaded) / 1e6), "output_on": output_device.type,
            "channels": len(part.keep)}


class GpuUtilisation:
    """The GPU's utilisation (%) sampled by nvidia-smi every `PERIOD_MS` while a measurement runs; the mean of
    the samples (None without nvidia-smi: the CPU)."""

    PERIOD_MS = 500

    def __enter__(self) -> GpuUtilisation:
        self.samples: list[float] = []
        self.process = None
        if shutil.which("nvidia-smi"):
            self.process = subprocess.Popen(
                ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-i", "0",
                 f"-lms={self.PERIOD_MS}"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process is not None:
            self.process.terminate()
            out, _ = self.process.communicate(timeout=10)
            self.samples = [float(v) for v in out.split() if v.replace(".", "", 1).isdigit()]

    @property
    def mean(self) -> float | None:
        return round(sum(self.samples) / len(self.samples), 1) if self.samples else None
