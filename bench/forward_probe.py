"""Where inference time goes, per architecture: the model's forward alone, under several settings, vs the
engine's seconds per tile.

For each architecture (randomly initialised, ``configs/experiments/<name>.yaml``'s patch and batch, the
full challenge output channels of which ``--keep`` are kept), in bf16 autocast, channels-last, inference mode:

* ``eager``: one forward of a batch;
* ``compiled``: the same under ``torch.compile`` (static shapes), as ``cellseg predict --compile on``;
* ``frozen``: compiled with inductor's ``freezing`` (weights become constants: BatchNorm folded into the
  convolutions, constant folding; inference only), the config patched around the calls as ``CompiledModel``
  does; ``frozen_options``: the same flag passed as ``torch.compile(options=...)``, which has no effect (kept to
  show it);
* ``graphs``: frozen + CUDA graphs (inductor's ``triton.cudagraphs``);
* ``wide``: compiled at ``--wide`` × the batch (what folding the 8 TTA passes into one batch would give);
* ``encoder``: compiled encoder alone (ViT / Swin), to split encoder from decoder;
* ``engine``: ``predict_volume`` with TTA 8 over a ``--box`` volume (3D: box³, 2D: 32 × box²), compiled,
  reported per tile and per forward, to compare with 8 × ``compiled`` (the engine's own overhead);
  ``engine_nofreeze``: without inductor freezing; ``engine_eager_post``: the kept channels' sigmoid run
  eagerly after the compiled model (``engine.COMPILE_PROBABILITIES`` off), to compare with the compiled sigmoid;
* ``--profile``: the top CUDA kernels of one compiled forward (torch.profiler), grouped by kind.

Times are milliseconds per tile (one forward of one tile), median of ``--repeats`` timed calls after warm-up,
with TFLOP/s and MFU against a measured bf16 matmul peak. Writes ``--out`` (JSON) and prints a markdown table.

Usage (GPU):  python -m bench.forward_probe --models vit_2d swin_3d --out bench/out/probe.json
Smoke (CPU):  python -m bench.forward_probe --models unet_3d --quick --device cpu
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch

from bench.inference import default_out_channels, write_volume
from bench.models import load_preset, measure_matmul_peak
from bench.record import record_stem
from cellseg import runtime
from cellseg.infer import tta
from cellseg.infer.engine import Window, predict_volume
from cellseg.models import build_model, list_models
from cellseg.models.summary import count_flops
from cellseg.runtime.compile import CompiledModel, compile_backend

REPO = Path(__file__).resolve().parents[1]

ENGINE_OVERLAP = 0.25  # the test-set projection's policy (`cellseg predict --overlap 0.25`)
KERNEL_KINDS = {  # substring of a CUDA kernel name -> kind (first match wins)
    "flash": "attention", "fmha": "attention", "attention": "attention", "efficient": "attention",
    "conv": "conv", "dgrad": "conv", "wgrad": "conv", "implicit": "conv", "cudnn": "conv", "xmma": "conv",
    "gemm": "gemm", "sm90": "gemm", "cutlass": "gemm", "nvjet": "gemm",
    "triton": "triton (fused elementwise/norm)", "elementwise": "elementwise", "copy": "copy",
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list_models(), help="architectures (default: all eight)")
    parser.add_argument("--keep", type=int, default=25, help="output channels kept (default 25: crop 983's)")
    parser.add_argument("--wide", type=int, default=4, help="batch multiple of the 'wide' setting (default 4)")
    parser.add_argument("--box", type=int, default=256, help="engine box edge in voxels (default 256)")
    parser.add_argument("--repeats", type=int, default=10, help="timed forwards per setting (default 10)")
    parser.add_argument("--settings", nargs="+", default=["eager", "compiled", "frozen", "wide", "encoder", "engine"])
    parser.add_argument("--fold", type=int, default=None, help="engine TTA fold (default: as `cellseg predict`)")
    parser.add_argument("--profile", action="store_true", help="top CUDA kernels of one compiled forward")
    parser.add_argument("--profile-engine", action="store_true",
                        help="CPU and CUDA time of one engine run (torch.profiler): top ops of each")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help="tiny presets, batch 2 (CPU smoke run)")
    parser.add_argument("--out", type=Path, help="JSON output (default: bench/results/forward_probe_<hardware>.json)")
    return parser.parse_args(argv)


def median_ms(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    """Median milliseconds of `repeats` calls after two warm-up calls (compilation, autotuning)."""
    for _ in range(2):
        fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def compiled(module: torch.nn.Module, *, freezing: bool = False, graphs: bool = False,
             freezing_option: bool = False) -> Callable[[torch.Tensor], torch.Tensor]:
    """`module` under torch.compile (static shapes), optionally with inductor's freezing (config patched around
    every call, as `CompiledModel`; or, `freezing_option`, passed in `options`) and CUDA graphs."""
    import torch._inductor.config as inductor_config

    torch._dynamo.reset()  # architectures share code: keep one model's shapes from making another's dynamic
    options = {"freezing": freezing_option, "triton.cudagraphs": graphs}
    net = torch.compile(module, backend=compile_backend(), dynamic=False, options=options)

    def call(x: torch.Tensor) -> torch.Tensor:
        with inductor_config.patch(freezing=freezing):
            return net(x)

    return call


def kernel_table(fn: Callable[[], object], top: int = 12) -> dict:
    """CUDA time of one call by kernel kind, and its `top` kernels."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_type.name == "CUDA" and e.self_device_time_total > 0]
    total = sum(e.self_device_time_total for e in events)
    kinds: dict[str, float] = {}
    for e in events:
        name = e.key.lower()
        kind = next((k for s, k in KERNEL_KINDS.items() if s in name), "other")
        kinds[kind] = kinds.get(kind, 0.0) + e.self_device_time_total
    events.sort(key=lambda e: -e.self_device_time_total)
    return {"cuda_ms": total / 1e3, "by_kind_ms": {k: v / 1e3 for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])},
            "top": [{"kernel": e.key[:120], "ms": e.self_device_time_total / 1e3, "calls": e.count} for e in events[:top]]}


def probe_model(name: str, args: argparse.Namespace, device: torch.device, outputs: int, peak: float) -> dict:
    preset = load_preset(name, quick=args.quick)
    batch, patch = preset["batch_size"], tuple(preset["patch_vox"])
    model = build_model(name, 1, outputs, preset=preset["preset"], **preset["params"]).to(device).eval()
    with torch.device("meta"):  # count_flops moves the model it counts to the meta device
        flops = count_flops(build_model(name, 1, outputs, preset=preset["preset"], **preset["params"]), (1, 1, *patch))
    dims = model.spec.spatial_dims
    model.to(memory_format=runtime.memory_format(dims, device.type == "cuda"))
    precision = "bf16" if device.type == "cuda" else "fp32"
    keep = torch.arange(min(args.keep, outputs), device=device)
    row: dict = {"model": name, "batch": batch, "patch_vox": list(patch), "gflop_per_tile": flops / 1e9, "ms_per_tile": {}}

    def image(n: int) -> torch.Tensor:
        x = torch.rand(n, 1, *patch, device=device)
        return x.contiguous(memory_format=runtime.memory_format(dims, device.type == "cuda"))

    def timed(fn: Callable[[torch.Tensor], torch.Tensor], n: int) -> float:
        x = image(n)

        def call() -> object:
            with torch.inference_mode(), runtime.autocast(device, precision):
                return torch.sigmoid(fn(x).index_select(1, keep).float())

        return median_ms(call, device, args.repeats) / n

    settings = {
        "eager": lambda: timed(model, batch),
        "compiled": lambda: timed(compiled(model), batch),
        "frozen": lambda: timed(compiled(model, freezing=True), batch),
        "frozen_options": lambda: timed(compiled(model, freezing_option=True), batch),
        "wide": lambda: timed(compiled(model), batch * args.wide),
        "frozen_wide": lambda: timed(compiled(model, freezing=True), batch * args.wide),
        "graphs": lambda: timed(compiled(model, freezing=True, graphs=True), batch),
        "graphs_wide": lambda: timed(compiled(model, freezing=True, graphs=True), batch * args.wide),
    }
    for setting in args.settings:
        try:
            if setting in settings:
                row["ms_per_tile"][setting] = settings[setting]()
            elif setting == "encoder" and hasattr(model, "encoder"):
                enc, x = compiled(model.encoder), image(batch)
                with torch.inference_mode(), runtime.autocast(device, precision):
                    row["ms_per_tile"]["encoder"] = median_ms(partial(enc, x), device, args.repeats) / batch
            elif setting.startswith("engine_"):  # an engine variant: engine_nofreeze, engine_eager_post
                from cellseg.infer import engine as eng
                from cellseg.runtime import compile as rc

                saved = rc.FREEZE, eng.COMPILE_PROBABILITIES
                if setting == "engine_nofreeze":
                    rc.FREEZE = {}
                elif setting == "engine_eager_post":
                    eng.COMPILE_PROBABILITIES = False
                try:
                    torch._dynamo.reset()
                    result = engine(model, args, device, patch, outputs, batch, precision)
                finally:
                    rc.FREEZE, eng.COMPILE_PROBABILITIES = saved
                row["ms_per_tile"][setting] = result["ms_per_tile"] / result["tta"]
            elif setting == "engine":
                row["engine"] = engine(model, args, device, patch, outputs, batch, precision)
                row["ms_per_tile"]["engine_per_forward"] = row["engine"]["ms_per_tile"] / row["engine"]["tta"]
        except Exception as err:  # e.g. out of memory: recorded, the other settings still run
            row.setdefault("errors", {})[setting] = f"{type(err).__name__}: {str(err)[:300]}"
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if args.profile and device.type == "cuda":
        fn, x = compiled(model), image(batch)
        with torch.inference_mode(), runtime.autocast(device, precision):
            fn(x)
            row["profile"] = kernel_table(lambda: fn(x))
    for setting, ms in row["ms_per_tile"].items():
        if setting != "encoder":
            row.setdefault("tflops", {})[setting] = flops / (ms / 1e3) / 1e12
    row["mfu_compiled"] = row.get("tflops", {}).get("compiled", 0.0) / peak if peak else None
    return row


def engine(model: torch.nn.Module, args: argparse.Namespace, device: torch.device, patch: tuple[int, ...],
           outputs: int, batch: int, precision: str) -> dict:
    """`predict_volume` with TTA 8, compiled, over one box: ms per tile."""
    from cellseg.data.grid import Grid

    spec = model.spec
    tfms = tta.transforms(spec.spatial_dims, spec.tta_axes, 8, transpose_axes=spec.tta_transpose_axes)
    with tempfile.TemporaryDirectory() as tmp:
        size = args.box
        em, _, grid = write_volume(Path(tmp), size)
        if spec.spatial_dims == 2:  # 32 slices of box²: the 2D steady-state probe of bench.studies.test_set
            grid = Grid(translation_nm=grid.translation_nm, shape_vox=(32, size, size), voxel_size_nm=grid.voxel_size_nm)
        tiles = [0]
        from cellseg.infer.engine import tta_fold

        net = CompiledModel(model)
        fold = tta_fold(batch, patch, len(tfms), device) if args.fold is None else args.fold
        patch3 = (1, *patch) if spec.spatial_dims == 2 else patch

        def run() -> object:
            window = Window(patch_vox=tuple(patch3), device=device, precision=precision, overlap=ENGINE_OVERLAP,
                            batch_size=batch, transforms=tuple(tfms), channels_last=True, compiled=net, tta_fold=fold)
            return predict_volume(model, em, grid, window, num_outputs=outputs, dtype=torch.float16,
                                  keep=list(range(args.keep)), on_tiles=lambda n: tiles.__setitem__(0, tiles[0] + n))

        run()  # warm-up: compilation and autotuning
        tiles[0] = 0
        start = time.perf_counter()
        run()
        seconds = time.perf_counter() - start
        result = {"ms_per_tile": seconds * 1e3 / tiles[0], "tiles": tiles[0], "tta": len(tfms), "seconds": seconds,
                  "tta_fold": fold, "overlap": ENGINE_OVERLAP}
        if args.profile_engine and device.type == "cuda":
            result["profile"] = engine_profile(run)
    return result


def engine_profile(run: Callable[[], object], top: int = 15) -> dict:
    """Wall, CUDA kernel and CPU-op time of one engine run, and the top CUDA kernels and CPU ops (self time)."""
    from torch.profiler import ProfilerActivity, profile

    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    wall = time.perf_counter() - start
    events = list(prof.key_averages())
    cuda = sorted((e for e in events if e.self_device_time_total > 0), key=lambda e: -e.self_device_time_total)
    cpu = sorted((e for e in events if e.self_cpu_time_total > 0), key=lambda e: -e.self_cpu_time_total)
    return {"wall_ms": wall * 1e3, "cuda_ms": sum(e.self_device_time_total for e in cuda) / 1e3,
            "top_cuda": [{"name": e.key[:100], "ms": e.self_device_time_total / 1e3, "calls": e.count} for e in cuda[:top]],
            "top_cpu": [{"name": e.key[:100], "ms": e.self_cpu_time_total / 1e3, "calls": e.count} for e in cpu[:top]]}


def markdown(report: dict) -> str:
    settings = ["eager", "compiled", "frozen", "frozen_options", "wide", "frozen_wide", "graphs", "graphs_wide", "encoder",
                "engine_per_forward", "engine_nofreeze", "engine_eager_post"]
    lines = [f"Forward probe: {report['environment']['device']}, torch {report['environment']['torch']}, "
             f"{report['environment']['date']}; bf16 matmul peak {report['peak_tflops']:.0f} TFLOP/s.", "",
             "| model | batch | GFLOP/tile | " + " | ".join(f"{s} ms/tile" for s in settings) + " | MFU compiled |",
             "|---|---|---|" + "---|" * (len(settings) + 1)]
    for row in report["rows"]:
        ms = row["ms_per_tile"]
        cells = [f"{ms[s]:.3f}" if s in ms else "-" for s in settings]
        mfu = f"{100 * row['mfu_compiled']:.1f}%" if row.get("mfu_compiled") else "-"
        lines.append(f"| {row['model']} | {row['batch']} | {row['gflop_per_tile']:.1f} | " + " | ".join(cells) + f" | {mfu} |")
    for row in report["rows"]:
        if "profile" in row:
            kinds = ", ".join(f"{k} {v:.2f}" for k, v in row["profile"]["by_kind_ms"].items())
            lines.append(f"\n{row['model']} compiled forward, CUDA ms by kernel kind (batch {row['batch']}): {kinds}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    runtime.configure_backends(tf32=True, cudnn_benchmark=True)
    outputs = default_out_channels()
    peak = measure_matmul_peak(device, quick=args.quick) if device.type == "cuda" else 0.0
    env = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", "torch": torch.__version__,
           "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
    report = {"benchmark": "forward_probe", "environment": env, "peak_tflops": peak, "args": {
        k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}, "rows": []}
    for name in args.models:
        print(f"probing {name} ...", flush=True)
        report["rows"].append(probe_model(name, args, device, outputs, peak))
        args.out = args.out or record_stem("forward_probe").with_suffix(".json")
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1))
        print(json.dumps({k: v for k, v in report["rows"][-1].items() if k != "profile"}), flush=True)
    print(markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
