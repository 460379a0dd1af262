"""Training-step benchmark of the eight architectures at their training presets.

For every architecture (``configs/experiments/<name>.yaml``: batch per GPU, patch, model params)
this measures one optimizer step (forward + BCE loss + backward + fused AdamW) in four settings:
bf16 autocast vs fp32 (TF32 off), each with and without channels-last. It records step time
(CUDA events, after warm-ups), peak memory, FLOPs per step (``FlopCounterMode`` on the meta
device), TFLOP/s, MFU against a bf16 8192³ matmul peak measured in the same run, and whether the
seed's batch fits on an H100 80 GB (OOM is caught and recorded; then the batch is doubled or
halved a few times to bracket the largest one that fits).

Work is done in phases over all architectures (bf16 channels-last first, since that is how we
train), and ``OUT/models.json`` + ``OUT/models.md`` are rewritten after each phase, so a run cut
short by ``--time-budget-s`` still leaves the most important numbers. Eager mode only unless
``--compile`` (compiling took 17-83 s per architecture on one H200, docs/benchmarks.md).

Usage (GPU):  python -m bench.models --out bench/out
Smoke (CPU):  python -m bench.models --quick --out /tmp/bench
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import math
import platform
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

from bench.record import record_paths
from cellseg.models import build_model, list_models
from cellseg.models.summary import count_flops

REPO = Path(__file__).resolve().parents[1]

CONFIGS = {  # name -> (bf16 autocast, channels-last); the first is how we train
    "bf16-cl": (True, True),
    "bf16": (True, False),
    "fp32-cl": (False, True),
    "fp32": (False, False),
}
H100_USABLE_GIB = 78.0  # 80 GB card: 79.2 GiB visible, minus CUDA context and allocator slack
OUT_CHANNELS = 16


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options (see ``--help``)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n")[-1])
    parser.add_argument(
        "--out", type=Path, help="output folder for models.json and .md (default: bench/results/models_<hardware>.*)"
    )
    parser.add_argument("--names", help="comma-separated architectures (default: all registered)")
    parser.add_argument("--configs", default=",".join(CONFIGS), help=f"subset of {','.join(CONFIGS)}")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per setting (default: 2)")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per setting (default: 5)")
    parser.add_argument("--fit-search", type=int, default=2, help="max batch doublings/halvings (default: 2)")
    parser.add_argument(
        "--time-budget-s",
        type=float,
        default=300.0,
        help="skip remaining settings after this many seconds (default: 300)",
    )
    parser.add_argument("--compile", action="store_true", help="torch.compile the model (slow warm-up)")
    parser.add_argument("--quick", action="store_true", help="CPU smoke run: tiny presets, batch 2, 1 step")
    return parser.parse_args(argv)


def load_preset(name: str, *, quick: bool) -> dict:
    """Batch, patch and model params of ``configs/experiments/<name>.yaml`` (tiny in ``--quick``)."""
    import yaml  # a timm dependency, so present wherever timm is

    path = REPO / "configs" / "experiments" / f"{name}.yaml"
    config = yaml.safe_load(path.read_text())
    for include in config.get("include", []):
        config = _merge(yaml.safe_load((path.parent / include).read_text()), config)
    spatial_dims = 3 if name.endswith("3d") else 2
    preset = {
        "batch_size": int(config["train"]["batch_size"]),
        "patch_vox": tuple(config["data"]["patch_shape_vox"][-spatial_dims:]),
        "params": config["model"].get("params", {}),
        "preset": "default",
    }
    if quick:
        with torch.device("meta"):
            tiny = build_model(name, 1, OUT_CHANNELS, preset="tiny")
        preset.update(batch_size=2, patch_vox=tiny.spec.default_patch_vox, params={}, preset="tiny")
    return preset


def _merge(base: dict, override: dict) -> dict:
    merged = dict(base)
    for key, value in override.items():
        merged[key] = (
            _merge(merged[key], value)
            if isinstance(value, dict) and isinstance(merged.get(key), dict)
            else value
        )
    return merged


def set_tf32(enabled: bool) -> None:
    """TF32 on for the bf16 rows (as in training), off for the true-fp32 rows."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.backends.cuda.matmul.allow_tf32 = enabled
        torch.backends.cudnn.allow_tf32 = enabled


def sync(device: torch.device) -> None:
    """Wait for queued GPU work (no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_matmul_peak(device: torch.device, *, quick: bool) -> float:
    """Dense bf16 matmul TFLOP/s on random data (8192³ on GPU; 1024³ on CPU)."""
    size = 1024 if quick or device.type != "cuda" else 8192
    a, b = (torch.randn(size, size, device=device, dtype=torch.bfloat16) for _ in range(2))
    repeats = 2 if quick else 50
    for _ in range(3 if not quick else 1):
        a @ b
    elapsed = timed(lambda: a @ b, device=device, repeats=repeats)
    return 2 * size**3 * repeats / elapsed / 1e12


def timed(fn, *, device: torch.device, repeats: int) -> float:
    """Seconds for ``repeats`` calls of ``fn`` (CUDA events on GPU, perf_counter on CPU)."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeats):
            fn()
        end.record()
        torch.cuda.synchronize(device)
        return start.elapsed_time(end) / 1e3
    begin = time.perf_counter()
    for _ in range(repeats):
        fn()
    return time.perf_counter() - begin


def make_step(
    name: str, preset: dict, *, batch_size: int, bf16: bool, channels_last: bool, device, compile_: bool
):
    """A closure running one training step of ``name`` at ``batch_size`` on ``device``."""
    torch.manual_seed(0)
    with device:
        model = build_model(name, 1, OUT_CHANNELS, preset=preset["preset"], **preset["params"])
    image = torch.randn(batch_size, 1, *preset["patch_vox"], device=device)
    target = (torch.rand(batch_size, OUT_CHANNELS, *preset["patch_vox"], device=device) > 0.5).float()
    if channels_last:
        memory_format = torch.channels_last_3d if image.ndim == 5 else torch.channels_last
        model, image = model.to(memory_format=memory_format), image.contiguous(memory_format=memory_format)
    net = torch.compile(model) if compile_ else model
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = F.binary_cross_entropy_with_logits(net(image), target)
        loss.backward()
        optimizer.step()

    return step


def run_setting(name: str, preset: dict, *, setting: str, batch_size: int, args, device) -> dict:
    """Warm up, time ``args.steps`` steps, and report ms/step and peak memory (or OOM)."""
    bf16, channels_last = CONFIGS[setting]
    set_tf32(bf16)
    try:
        step = make_step(
            name,
            preset,
            batch_size=batch_size,
            bf16=bf16,
            channels_last=channels_last,
            device=device,
            compile_=args.compile,
        )
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        for _ in range(args.warmup):
            step()
        sync(device)
        seconds = timed(step, device=device, repeats=args.steps)
        result = {"status": "ok", "step_ms": 1e3 * seconds / args.steps, **memory_stats(device)}
    except torch.OutOfMemoryError:
        result = {"status": "OOM"}
    except Exception as err:  # cuDNN reports some allocation failures as plain RuntimeErrors
        text = f"{type(err).__name__}: {err}"
        result = {
            "status": "OOM" if "out of memory" in text or "ALLOC_FAILED" in text else f"error: {text[:200]}"
        }
    finally:
        step = None  # drop the closure (model, optimizer, batch) before freeing the cache
        release(device)
    return result


def memory_stats(device: torch.device) -> dict:
    """Peak allocated / reserved GiB since the last reset (None on CPU)."""
    if device.type != "cuda":
        return {"peak_gib": None, "reserved_gib": None}
    return {
        "peak_gib": torch.cuda.max_memory_allocated(device) / 2**30,
        "reserved_gib": torch.cuda.max_memory_reserved(device) / 2**30,
    }


def release(device: torch.device) -> None:
    """Free everything the last setting held, so the next one starts clean."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def fits_on_h100(result: dict) -> bool | None:
    """Whether a setting fits on an 80 GB H100: its OOM on one, or its reserved peak elsewhere."""
    if result.get("status") == "OOM":
        return False  # did not fit on this GPU, so not on a smaller-or-equal H100 either
    if result.get("reserved_gib") is None:
        return None
    return result["reserved_gib"] <= H100_USABLE_GIB


def fit_search(name: str, preset: dict, *, seed_fits: bool, args, device) -> dict:
    """Double (if the seed batch fits) or halve (if not) up to ``--fit-search`` times, one step each."""
    batch, ok_batches, oom_batches = preset["batch_size"], [], []
    factor = 2.0 if seed_fits else 0.5
    torch.backends.cudnn.benchmark = False  # no autotuning per new shape: memory is what we want here
    probe = argparse.Namespace(**{**vars(args), "warmup": 0, "steps": 1})
    for _ in range(args.fit_search):
        batch = int(batch * factor)
        if batch < 1:
            break
        result = run_setting(name, preset, setting="bf16-cl", batch_size=batch, args=probe, device=device)
        fits = result["status"] == "ok" and fits_on_h100(result) is not False
        (ok_batches if fits else oom_batches).append(batch)
        if fits != seed_fits:
            break
    torch.backends.cudnn.benchmark = True
    return {"fits": sorted(ok_batches), "too_big": sorted(oom_batches)}


def device_memory_gib(device: torch.device) -> float:
    """Total memory of the GPU in GiB (0 on CPU)."""
    return torch.cuda.get_device_properties(device).total_memory / 2**30 if device.type == "cuda" else 0.0


def environment(device: torch.device, *, peak_tflops: float) -> dict:
    """Versions, device and date for the report header."""
    import monai
    import timm

    return {
        "device": torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else platform.processor() or "cpu",
        "device_memory_gib": round(device_memory_gib(device), 1),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "timm": timm.__version__,
        "monai": monai.__version__,
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "matmul_bf16_tflops": round(peak_tflops, 1),
    }


def derive(row: dict, setting: str, *, peak_tflops: float) -> None:
    """Add TFLOP/s, MFU and Mvox/s to a measured setting of ``row``."""
    result = row["settings"][setting]
    if result.get("status") != "ok":
        return
    seconds = result["step_ms"] / 1e3
    result["tflops"] = row["train_gflop_per_step"] / 1e3 / seconds
    result["mfu"] = result["tflops"] / peak_tflops
    result["mvox_per_s"] = row["batch_size"] * math.prod(row["patch_vox"]) / seconds / 1e6


def write_reports(out: Path | None, env: dict, rows: list[dict]) -> tuple[Path, Path]:
    """Write ``models.json`` and ``models.md`` into `out` (default: this hardware's record in bench/results)."""
    json_path, md_path = record_paths(out, "models")
    json_path.write_text(json.dumps({"environment": env, "models": rows}, indent=2) + "\n")
    md_path.write_text(markdown(env, rows))
    return json_path, md_path


def markdown(env: dict, rows: list[dict]) -> str:
    """The report as a markdown table (one line per architecture × setting)."""
    lines = [
        "# Architecture training-step benchmark",
        "",
        f"{env['device']} ({env['device_memory_gib']} GiB); torch {env['torch']}, CUDA {env['cuda']}, "
        f"cuDNN {env['cudnn']}, timm {env['timm']}, MONAI {env['monai']}, Python {env['python']}; {env['date']}.",
        f"Measured bf16 matmul peak: {env['matmul_bf16_tflops']} TFLOP/s (MFU is against it). Step = forward + "
        f"BCE over {OUT_CHANNELS} channels + backward + fused AdamW, {env['mode']}; fp32 rows have TF32 off, "
        "bf16 rows TF32 on. "
        f"'fits H100' = no OOM and reserved peak <= {H100_USABLE_GIB} GiB.",
        "",
        "| model | batch x patch | setting | step ms | Mvox/s | TFLOP/s | MFU | peak GiB | reserved GiB | fits H100 |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        for setting, result in row["settings"].items():
            lines.append(_markdown_line(row, setting, result))
    lines += [
        "",
        "| model | GFLOP/step (fwd+bwd) | params M | seed batch | fits H100 (bf16-cl) | "
        "batches tried (bf16-cl, 1 step): fit / too big |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        search = row.get("fit_search")
        tried = f"{search['fits'] or '-'} / {search['too_big'] or '-'}" if search else "not run"
        lines.append(
            f"| {row['name']} | {row['train_gflop_per_step']:.4g} | {row['params_m']:.1f} | "
            f"{row['batch_size']} | {_yes_no(row.get('seed_batch_fits_h100'))} | {tried} |"
        )
    return "\n".join(lines) + "\n"


def _yes_no(value: bool | None) -> str:
    return "-" if value is None else ("yes" if value else "no")


def _markdown_line(row: dict, setting: str, result: dict) -> str:
    shape = f"{row['batch_size']} x {'x'.join(map(str, row['patch_vox']))}"
    if result.get("status") != "ok":
        return f"| {row['name']} | {shape} | {setting} | {result.get('status')} | | | | | | {_yes_no(result.get('fits_h100'))} |"

    def fmt(key: str, spec: str) -> str:
        return "-" if result.get(key) is None else format(result[key], spec)

    return (
        f"| {row['name']} | {shape} | {setting} | {fmt('step_ms', '.1f')} | {fmt('mvox_per_s', '.1f')} | "
        f"{fmt('tflops', '.1f')} | {fmt('mfu', '.1%')} | {fmt('peak_gib', '.1f')} | "
        f"{fmt('reserved_gib', '.1f')} | {_yes_no(result.get('fits_h100'))} |"
    )


def new_row(name: str, preset: dict) -> dict:
    """Static facts of one architecture: preset, parameters, FLOPs per training step."""
    shape = (preset["batch_size"], 1, *preset["patch_vox"])
    with torch.device("meta"):
        model = build_model(name, 1, OUT_CHANNELS, preset=preset["preset"], **preset["params"])
    params_m = sum(param.numel() for param in model.parameters()) / 1e6
    return {
        "name": name,
        "batch_size": preset["batch_size"],
        "patch_vox": list(preset["patch_vox"]),
        "params_m": params_m,
        "train_gflop_per_step": count_flops(model, shape, backward=True) / 1e9,
        "settings": {},
    }


def main(argv: list[str] | None = None) -> int:
    """Run the phases, rewriting the reports after each."""
    args = parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() and not args.quick else "cpu")
    if args.quick:
        args.warmup, args.steps, args.fit_search = 1, 1, 0
    torch.backends.cudnn.benchmark = True
    started = time.monotonic()
    names = args.names.split(",") if args.names else list_models()
    settings = [item for item in args.configs.split(",") if item]
    unknown = sorted(set(settings) - set(CONFIGS)) + sorted(set(names) - set(list_models()))
    if unknown:
        raise SystemExit(f"unknown settings/models {unknown}; valid: {list(CONFIGS)} / {list_models()}")
    peak = measure_matmul_peak(device, quick=args.quick)
    env = environment(device, peak_tflops=peak)
    env["mode"] = "torch.compile" if args.compile else "eager"
    env["warmup_steps"], env["timed_steps"] = args.warmup, args.steps
    print(f"{env['device']}: bf16 matmul {peak:.0f} TFLOP/s", flush=True)
    presets = {name: load_preset(name, quick=args.quick) for name in names}
    rows = [new_row(name, presets[name]) for name in names]
    for setting in settings:
        for row in rows:
            if time.monotonic() - started > args.time_budget_s:
                row["settings"][setting] = {"status": "skipped (time budget)"}
                continue
            result = run_setting(
                row["name"],
                presets[row["name"]],
                setting=setting,
                batch_size=row["batch_size"],
                args=args,
                device=device,
            )
            result["fits_h100"] = fits_on_h100(result)
            row["settings"][setting] = result
            derive(row, setting, peak_tflops=peak)
            print(_markdown_line(row, setting, result), flush=True)
        write_reports(args.out, env, rows)
    for row in rows:
        verdict = row["settings"].get("bf16-cl", {}).get("fits_h100")
        row["seed_batch_fits_h100"] = verdict
        if args.fit_search and verdict is not None and time.monotonic() - started < args.time_budget_s:
            row["fit_search"] = fit_search(
                row["name"], presets[row["name"]], seed_fits=verdict, args=args, device=device
            )
    json_path, md_path = write_reports(args.out, env, rows)
    print(
        f"wrote {json_path} and {md_path} in {time.monotonic() - started:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
