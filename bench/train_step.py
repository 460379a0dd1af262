"""Training-step speed of the eight architectures: a stock fp32 eager loop vs cellseg's trainer settings.

    python -m bench.train_step --out OUT [--names unet_3d,...] [--steps 10] [--compile auto|on|off]

For each architecture at its experiment preset (configs/experiments/<name>.yaml: batch, patch):
- `stock`: fp32 (TF32 off), eager, contiguous layout, `torch.optim.AdamW` (not fused), plain BCE — what a
  plain PyTorch/MONAI loop does out of the box;
- `cellseg`: the trainer's step — bf16 autocast, TF32, channels-last, `torch.compile` (decided like the
  trainer does with `--compile auto`), fused AdamW, the masked BCE + Dice loss.
Both on the same model, patch and batch, input already on the GPU; ms/step, Mvox/s, TFLOP/s, MFU against
a bf16 matmul peak measured in the same run, peak memory, and the speed-up. Writes OUT/train_step.json
and OUT/train_step.md. `--quick` runs tiny presets on the CPU to check the script.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import yaml

from bench.record import record_paths
from cellseg.losses import SegmentationLoss
from cellseg.models import build_model, list_models
from cellseg.models.summary import count_flops
from cellseg.train.perf import measure_matmul_peak

CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "experiments"
CHANNELS = 16  # output channels of the benchmark (the order of the tested classes' count)


def preset(name: str, quick: bool) -> tuple[int, tuple[int, ...], dict]:
    """(batch, spatial patch, model params) of an architecture's experiment config."""
    if quick:
        with torch.device("meta"):
            spec = build_model(name, 1, 2, preset="tiny").spec
        return 2, tuple(spec.default_patch_vox), {"preset": "tiny"}
    cfg = yaml.safe_load((CONFIGS / f"{name}.yaml").read_text())
    model_file = next(inc for inc in cfg["include"] if "/model/" in inc)
    model_cfg = yaml.safe_load((CONFIGS / model_file).read_text())["model"]
    patch = tuple(cfg["data"]["patch_shape_vox"])
    patch = patch[1:] if patch[0] == 1 and name.endswith("_2d") else patch
    return int(cfg["train"]["batch_size"]), patch, dict(model_cfg.get("params") or {})


def make_model(name: str, params: dict, device: torch.device) -> torch.nn.Module:
    """Build on `device` with a fixed seed (both settings start from the same weights)."""
    torch.manual_seed(0)
    p = dict(params)
    p_preset = p.pop("preset", "default")
    return build_model(name, 1, CHANNELS, preset=p_preset, **p).to(device)


def timed(step, steps: int, warmup: int, device: torch.device) -> tuple[float, float]:
    """(seconds per step, seconds of the first warm-up step)."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda *a: None)
    t0 = time.perf_counter()
    step()
    sync()
    first = time.perf_counter() - t0
    for _ in range(warmup - 1):
        step()
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    sync()
    return (time.perf_counter() - t0) / steps, first


def stock_step(model, image, target, device):
    """fp32 eager, contiguous, non-fused AdamW, plain BCE."""
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)

    def step():
        opt.zero_grad(set_to_none=True)
        out = model(image)
        out = out[0] if isinstance(out, list) else out
        F.binary_cross_entropy_with_logits(out, target).backward()
        opt.step()
    return step


def cellseg_step(model, image, target, known, device, compile_mode: str):
    """The trainer's settings; returns (step, compile record)."""
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    fmt = torch.channels_last_3d if image.ndim == 5 else torch.channels_last
    model = model.to(memory_format=fmt)
    image = image.contiguous(memory_format=fmt)
    loss_fn = SegmentationLoss()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    net, record = model, {"compiled": False}
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")

    def make(m):
        def step():
            opt.zero_grad(set_to_none=True)
            with autocast:
                loss = loss_fn(m(image), target, known)
            loss.backward()
            opt.step()
        return step

    if compile_mode != "off" and device.type == "cuda":
        compiled = torch.compile(model)
        t0 = time.perf_counter()
        t_c, _ = timed(make(compiled), 5, 2, device)
        record = {"compile_s": time.perf_counter() - t0, "compiled_step_ms": 1e3 * t_c}
        if compile_mode == "auto":
            t_e, _ = timed(make(model), 5, 2, device)
            record["eager_step_ms"] = 1e3 * t_e
            record["compiled"] = t_c < t_e
        else:
            record["compiled"] = True
        net = compiled if record["compiled"] else model
    return make(net), record


def bench_one(name: str, args, device: torch.device, peak: float | None) -> dict:
    """Both settings for one architecture."""
    batch, patch, params = preset(name, args.quick)
    voxels = batch * math.prod(patch)
    with torch.device("meta"):
        p = dict(params)
        meta_model = build_model(name, 1, CHANNELS, preset=p.pop("preset", "default"), **p)
    flops = count_flops(meta_model, (batch, 1, *patch), backward=True)
    row = {"name": name, "batch": batch, "patch": list(patch), "gflop_per_step": flops / 1e9}
    g = torch.Generator(device=device).manual_seed(0)
    image = torch.rand((batch, 1, *patch), device=device, generator=g)
    target = (torch.rand((batch, CHANNELS, *patch), device=device, generator=g) > 0.9).float()
    known = torch.ones_like(target, dtype=torch.bool)
    for setting in ("stock", "cellseg"):
        model = make_model(name, params, device)
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        try:
            if setting == "stock":
                step, rec = stock_step(model, image.contiguous(), target, device), {}
            else:
                step, rec = cellseg_step(model, image, target.bool(), known, device, args.compile)
            sec, first = timed(step, args.steps, args.warmup, device)
            r = {"step_ms": 1e3 * sec, "mvox_per_s": voxels / sec / 1e6, "tflops": flops / sec / 1e12,
                 "first_step_s": first, **rec}
            if peak:
                r["mfu"] = r["tflops"] / peak
            if device.type == "cuda":
                r["peak_gb"] = torch.cuda.max_memory_allocated(device) / 1e9
        except torch.OutOfMemoryError:
            r = {"status": "OOM"}
        row[setting] = r
        del model
    if "step_ms" in row["stock"] and "step_ms" in row["cellseg"]:
        row["speedup"] = row["stock"]["step_ms"] / row["cellseg"]["step_ms"]
    return row


def markdown(env: dict, rows: list[dict]) -> str:
    """The table for docs/benchmarks.md."""
    lines = [f"{env['gpu']}, torch {env['torch']}, cuDNN {env['cudnn']}, {env['date']}; bf16 matmul peak "
             f"{env['peak_tflops']:.0f} TFLOP/s (MFU is against it).", "",
             "| model | batch × patch | stock fp32 eager ms | cellseg ms | speed-up | cellseg Mvox/s | cellseg TFLOP/s | "
             "cellseg MFU | compiled | peak GB (stock / cellseg) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        s, c = r["stock"], r["cellseg"]
        fmt = lambda d, k, f: format(d[k], f) if k in d else d.get("status", "-")  # noqa: E731
        lines.append(f"| {r['name']} | {r['batch']} × {'×'.join(map(str, r['patch']))} | {fmt(s, 'step_ms', '.1f')} | "
                     f"{fmt(c, 'step_ms', '.1f')} | {r.get('speedup', 0):.2f}× | {fmt(c, 'mvox_per_s', '.0f')} | "
                     f"{fmt(c, 'tflops', '.0f')} | {100 * c.get('mfu', 0):.1f}% | {c.get('compiled', '-')} | "
                     f"{fmt(s, 'peak_gb', '.1f')} / {fmt(c, 'peak_gb', '.1f')} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="folder for train_step.json and .md (default: bench/results/train_step_<hardware>.*)")
    parser.add_argument("--names", default=",".join(list_models()))
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--compile", choices=["auto", "on", "off"], default="auto")
    parser.add_argument("--quick", action="store_true", help="tiny presets on the CPU (checks the script)")
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() and not args.quick else "cpu")
    torch.backends.cudnn.benchmark = True
    peak = measure_matmul_peak(device) if device.type == "cuda" else None
    env = {"gpu": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "torch": torch.__version__,
           "cudnn": torch.backends.cudnn.version(), "date": datetime.date.today().isoformat(),
           "peak_tflops": peak or 0.0}
    json_path, md_path = record_paths(args.out, "train_step")
    rows = []
    for name in args.names.split(","):
        rows.append(bench_one(name, args, device, peak))
        print(json.dumps(rows[-1]), flush=True)
        json_path.write_text(json.dumps({"env": env, "rows": rows}, indent=1))
        md_path.write_text(markdown(env, rows))
    print(markdown(env, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
