"""A trained run, rebuilt from its directory for inference, and the settings that follow from it.

The run directory alone rebuilds the model (`load_run`: `config.yaml`, `meta.json`,
`checkpoints/<best|last>.pt`, EMA weights when the run validated with them). From the run and the inference
options follow the axes a 2D model is sliced across (`slice_axes`), its TTA transforms (`run_transforms`), its
sliding window (`run_window`) and what a prediction store records about it (`run_provenance`).
"""

from __future__ import annotations

import datetime
import json
import logging
import math
import pickle
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import cellseg
from cellseg import runtime
from cellseg.config import load_run_config
from cellseg.config.inference import InferConfig
from cellseg.config.schema import RunConfig
from cellseg.data.grid import shape3
from cellseg.infer import tta
from cellseg.infer.engine import Window, tta_fold
from cellseg.infer.packaged import GRAPH_FILES, PackagedNetwork, check_package_files, is_package
from cellseg.infer.selection import CropTarget
from cellseg.infer.tiling import count_tiles
from cellseg.models import build_model
from cellseg.runtime.checkpoint import check_checkpoint_channels, check_finite_weights
from cellseg.runtime.checkpoint import load as load_checkpoint
from cellseg.runtime.compile import CompiledModel

log = logging.getLogger(__name__)
ISOTROPY_RTOL = 0.01  # voxel sizes within 1% count as equal (slicing a 2D model across z, y and x)
# `compile: "auto"` compiles a model only for a job of at least this many Gvoxels of model input (tiles × TTA
# transforms × tile voxels, `job_gvox`), where compiling repays itself. Compiling a model for inference took
# 9-59 s per model with a cold cache (one H100, the quality benchmark's report: 34.8 s resnet_3d, 9.4 unet_3d,
# 58.7 swin_3d, 23.4 vit_3d, 45.8 swin_2d, 12.4 unet_2d, 16.4 resnet_2d, 27.5 vit_2d); the compiled forward saves
# 1.0-5.1 s per Gvoxel of input on the 2D models and swin_3d, 0.3 on vit_3d and nothing on the 3D CNNs (one H200,
# 256³ at TTA 8, docs/benchmarks.md "Inference vs MONAI"): compiling breaks even at 9-22 Gvoxels for the models it
# helps. A job below that (a few validation or test crops, as `cellseg report` predicts) runs eagerly.
AUTO_COMPILE_MIN_GVOX = 20.0


@dataclass
class LoadedRun:
    """A trained model rebuilt from its run directory, in eval mode on `device`."""

    run_dir: Path
    cfg: RunConfig
    meta: dict[str, Any]
    model: torch.nn.Module
    checkpoint: Path
    step: int
    weights: str  # "ema" or "model"
    device: torch.device
    backend: str = "torch"  # or an exported package's "torchscript" / "onnx" graph (`cellseg.infer.packaged`)

    @property
    def channels(self) -> tuple[str, ...]:
        """Output channels: the classes, then `<class>_boundary` channels (meta.json "channels")."""
        return tuple(self.meta["channels"])

    @property
    def spatial_dims(self) -> int:
        """2 or 3."""
        return 2 if self.cfg.data.is_2d else 3


def checkpoint_path(run_dir: Path, checkpoint: str) -> Path:
    """The checkpoint file of `checkpoint` ("best", "last" or a path); FileNotFoundError names those present."""
    if checkpoint not in ("best", "last"):
        path = Path(checkpoint)
        if not path.is_file():
            raise FileNotFoundError(f"--checkpoint {checkpoint}: no such checkpoint file")
        return path
    path = run_dir / "checkpoints" / f"{checkpoint}.pt"
    if not path.is_file():
        present = sorted(p.name for p in (run_dir / "checkpoints").glob("*.pt")) if path.parent.is_dir() else []
        hint = " (the run never validated: use --checkpoint last)" if checkpoint == "best" and present else ""
        raise FileNotFoundError(f"{run_dir}: no checkpoint {path.name} in {path.parent} "
                                f"(present: {', '.join(present) or 'none'}){hint}")
    return path


def load_run(run_dir: str | Path, checkpoint: str = "best", *, device: torch.device | str = "cpu",
             data_root: str | None = None, backend: str = "torch") -> LoadedRun:
    """Rebuild a run's model from `config.yaml` + `meta.json` + a checkpoint.

    Args:
        run_dir: a `cellseg train` run directory, or a member package `cellseg export` wrote (it holds the same
            files, with the chosen weights alone as checkpoints/best.pt).
        checkpoint: "best", "last" or the path of a checkpoint file.
        device: where the model goes (channels-last on CUDA).
        data_root: replaces the run's `data.root`.
        backend: "torch" (cellseg's model code and the weights) or, for a package, its "torchscript" or "onnx"
            graph (`cellseg.infer.packaged.PackagedNetwork`).

    Raises:
        FileNotFoundError: no config.yaml/meta.json, or no such checkpoint (the present ones are named).
        ValueError: meta.json disagrees with the config or the checkpoint with the architecture.
    """
    run_dir, device = Path(run_dir), torch.device(device)
    for name in ("config.yaml", "meta.json"):
        if not (run_dir / name).is_file():
            raise FileNotFoundError(f"{run_dir / name}: missing (is {run_dir} a `cellseg train` run directory?)")
    cfg = load_run_config(run_dir / "config.yaml", [f"data.root={data_root}"] if data_root else [])
    meta = json.loads((run_dir / "meta.json").read_text())
    if len(meta.get("channels", ())) != cfg.data.num_target_channels:
        raise ValueError(f"{run_dir / 'meta.json'}: channels {meta.get('channels')} do not match the config's "
                         f"{cfg.data.num_target_channels} output channels")
    path = checkpoint_path(run_dir, checkpoint)
    if is_package(run_dir):  # an exported package: its files as `cellseg export` wrote them
        if not path.resolve().is_relative_to(run_dir.resolve()):
            raise ValueError(f"--checkpoint {checkpoint}: {run_dir} is an exported package; it holds one set of "
                             "weights (--checkpoint best)")
        graph = [GRAPH_FILES[backend]] if backend in GRAPH_FILES else []
        check_package_files(run_dir, ["config.yaml", "meta.json", path.resolve().relative_to(run_dir.resolve())
                                      .as_posix(), *graph])
    try:
        ckpt = load_checkpoint(path)
    except (RuntimeError, ValueError, EOFError, pickle.UnpicklingError) as err:  # truncated or not a torch file
        raise ValueError(f"{path}: not a readable checkpoint ({err})") from None
    if "model" not in ckpt or "step" not in ckpt:
        raise ValueError(f"{path}: not a cellseg checkpoint (no 'model' weights or 'step')")
    model = build_model(cfg.model.name, 1, cfg.data.num_target_channels, preset=cfg.model.preset, **cfg.model.params)
    check_checkpoint_channels(ckpt, meta["channels"], source=str(path))  # same count, other order: refused
    # Validation during training used the EMA weights when the run kept them (`Setup.eval_model`): so do we.
    weights = "ema" if ckpt.get("ema") is not None else "model"
    state = ckpt["ema"] if weights == "ema" else ckpt["model"]
    weights = ckpt.get("weights", weights)  # a package's checkpoint holds the chosen weights alone and says which
    check_finite_weights(state, source=f"{path} ({weights} weights)")
    own = model.state_dict()
    try:
        model.load_state_dict({k: v.to(own[k].dtype) if k in own else v for k, v in state.items()})
    except RuntimeError as err:
        raise ValueError(f"{path}: weights do not fit {cfg.model.name} ({cfg.model.preset}): {err}") from None
    fmt = runtime.memory_format(2 if cfg.data.is_2d else 3, device.type == "cuda")
    if backend != "torch":
        model = PackagedNetwork(run_dir, backend, device, spec=getattr(model, "spec", None))
    model = model.to(device=device, memory_format=fmt).eval()
    log.info("loaded %s (%s weights, step %d, %s) from %s", cfg.model.name, weights, ckpt["step"], backend, path)
    return LoadedRun(run_dir=run_dir, cfg=cfg, meta=meta, model=model, checkpoint=path, step=int(ckpt["step"]),
                     weights=weights, device=device, backend=backend)


# ----------------------------------------------------------------------------------- settings of a run


def slice_axes(run: LoadedRun, axes_2d: str) -> tuple[str, ...]:
    """The axes a run's slices are cut across: ("z",) for a 3D model or `--axes-2d z`, else ("z", "y", "x").

    Raises:
        ValueError: `--axes-2d zyx` on a run with anisotropic voxels.
    """
    if run.spatial_dims == 3 or axes_2d == "z":
        return ("z",)
    vs = run.cfg.data.voxel_size_nm
    if max(vs) > min(vs) * (1 + ISOTROPY_RTOL):
        raise ValueError(f"--axes-2d zyx needs isotropic voxels; {run.run_dir} predicts at {list(vs)} nm")
    if set(run.cfg.data.slice_axes) != {"z", "y", "x"}:
        log.warning("%s trained on slices across %s only; predicting across z, y and x anyway", run.run_dir,
                    list(run.cfg.data.slice_axes))
    return ("z", "y", "x")


def run_transforms(run: LoadedRun, n: int) -> list[tta.Transform]:
    """The first `n` TTA transforms the run allows (meta.json "model", else the model's own spec)."""
    spec = run.meta.get("model", {})
    model_spec = getattr(run.model, "spec", None)
    flip = spec.get("tta_axes", model_spec.tta_axes if model_spec else ())
    swap = spec.get("tta_transpose_axes", model_spec.tta_transpose_axes if model_spec else ())
    return tta.transforms(run.spatial_dims, flip, n, transpose_axes=swap)


def job_gvox(run: LoadedRun, targets: Sequence[CropTarget], *, overlap: float, transforms: int,
             axes: Sequence[str] = ("z",)) -> float:
    """Gvoxels of model input that predicting `targets` takes: tiles (context margin included, `count_tiles`)
    × TTA transforms × tile voxels. The crops' shapes come from their boxes in nm at the run's voxel size."""
    patch = shape3(run.cfg.data.patch_shape_vox)
    voxel_nm = run.cfg.data.voxel_size_nm
    shapes = [[max(1, round((b - a) / v)) for a, b, v in zip(t.start_nm, t.stop_nm, voxel_nm, strict=True)]
              for t in targets]
    tiles = sum(count_tiles(shape, patch, overlap, axes) for shape in shapes)
    return tiles * transforms * math.prod(patch) / 1e9


def compile_decision(run: LoadedRun, opts: InferConfig, *, gvox: float | None) -> bool:
    """Whether the run's model is compiled: `opts.compile` "on"/"off" as given; "auto": on CUDA, for a job of
    at least `AUTO_COMPILE_MIN_GVOX` Gvoxels of model input (`gvox`; None: size unknown, compiled)."""
    if run.backend != "torch":  # an exported graph runs as it is
        return False
    if opts.compile != "auto":
        return opts.compile == "on"
    if run.device.type != "cuda":
        return False
    if gvox is None or gvox >= AUTO_COMPILE_MIN_GVOX:
        return True
    log.info("%s: predicting eagerly (compile auto): %.1f Gvoxels of model input, under the %g that repay compiling",
             run.cfg.model.name, gvox, AUTO_COMPILE_MIN_GVOX)
    return False


def run_window(run: LoadedRun, opts: InferConfig, *, precision: runtime.Precision,
               transforms: Sequence[tta.Transform], gvox: float | None = None) -> Window:
    """The sliding window a run predicts with: its patch and EM pad value, `opts`' overlap and blend, tiles per
    batch (`opts.batch_size`, else the run's own), the model under torch.compile (`compile_decision`: "auto"
    compiles on CUDA for a job of `gvox` ≥ `AUTO_COMPILE_MIN_GVOX` Gvoxels of model input) and TTA passes per
    forward (`opts.tta_fold`, else `engine.tta_fold`).

    Build it once per run: the compiled model it holds keeps its graphs across crops.
    """
    batch = opts.batch_size or int(run.meta.get("batch_size") or run.cfg.val.batch_size)
    compiled = CompiledModel(run.model) if compile_decision(run, opts, gvox=gvox) else None
    patch = run.cfg.data.patch_shape_vox
    fold = opts.tta_fold or tta_fold(batch, patch, len(transforms), run.device)
    return Window(patch_vox=shape3(patch), device=run.device, precision=precision, overlap=opts.overlap,
                  batch_size=batch, blend=opts.blend, transforms=tuple(transforms),
                  channels_last=True, pad_value=run.cfg.data.em_pad_value, compiled=compiled, tta_fold=fold)


def run_provenance(run: LoadedRun, opts: InferConfig, tfms: Sequence[tta.Transform], axes: Sequence[str],
                   precision: str) -> dict[str, Any]:
    """What a prediction store records about the run and settings it came from (`cellseg predict`)."""
    return {"run_dir": str(run.run_dir.resolve()), "checkpoint": str(run.checkpoint.resolve()),
            "checkpoint_step": run.step, "weights": run.weights, "model": run.cfg.model.name,
            "preset": run.cfg.model.preset, "voxel_size_nm": list(run.cfg.data.voxel_size_nm),
            "patch_shape_vox": list(run.cfg.data.patch_shape_vox), "tta": len(tfms),
            "tta_transforms": [t.name for t in tfms], "overlap": opts.overlap, "blend": opts.blend,
            "axes_2d": "".join(axes) if run.spatial_dims == 2 else None, "precision": precision,
            "dtype": "uint8" if opts.uint8 else "float16", "channels": opts.channels, "compile": opts.compile,
            "backend": run.backend,
            "cellseg_version": cellseg.__version__,
            "git_commit": run.meta.get("git_commit"), "data_root": opts.data_root or run.cfg.data.root,
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
