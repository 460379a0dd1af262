"""DDP scaling and MFU of the trainer's step on one host, with in-memory input (what the GPUs alone can do).

    torchrun --nproc-per-node N -m bench.ddp_scaling --out OUT [--model unet_3d] [--batch 8] [--channels 48]
    python -m bench.ddp_scaling --out OUT --batch 16 --compile-mode reduce-overhead --tag b16_ro   # one GPU
    python -m bench.ddp_scaling --out OUT --preset tiny --device cpu --profile    # CPU check of the script
    python -m bench.ddp_scaling --summarize OUT        # efficiency table from the runs of 1, 2, 4 GPUs
    python -m bench.ddp_scaling --mfu-report RUNS --out OUT   # OUT/mfu.md + mfu.json (bench/gpu/mfu.sh)

Every rank runs the trainer's settings on its own random batch (per-GPU batch `--batch`): bf16 autocast,
TF32, channels-last, `torch.compile` with static shapes before the DDP wrap (through
`cellseg.runtime.compile.compile_module`, as the trainer; `--compile-mode` is `train.compile_mode`, the loss keeps
"default"), DDP with gradient-as-bucket-view, fused AdamW, masked BCE + Dice — the pieces `cellseg train` uses
(cellseg/runtime/). Without torchrun it runs as one process. Timed steps end with a device synchronisation and a
barrier, so a step is as slow as the slowest rank. Scaling efficiency = samples/s on N GPUs / (N × samples/s on
1 GPU), per-GPU batch fixed (weak scaling, as in training).

`--ddp wrap-then-compile` compiles the DDP-wrapped model instead (dynamo's DDP optimizer splits the graph at
the gradient buckets so their all-reduce can overlap the backward; the trainer compiles first, so a compiled
backward makes every gradient ready at its end); `--broadcast-buffers off` stops DDP sending rank 0's BatchNorm
buffers before every forward. Both apply to N > 1 GPUs and are compared against the same 1-GPU run.

`--profile` then profiles 3 more steps (every rank steps, rank 0 writes) into OUT/profile_<name>.json + .md:
device time per step by kernel group (conv fwd / conv dgrad / conv wgrad / norm / elementwise / optimizer /
other) plus the idle time (timed step minus kernel time: launch and Python overhead, what CUDA graphs can
remove), and the 25 slowest kernels. On CPU the groups hold the aten ops' own CPU time (checks the machinery).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

from cellseg import runtime
from cellseg.config.schema import COMPILE_MODES
from cellseg.losses import SegmentationLoss
from cellseg.models import build_model
from cellseg.models.summary import count_flops
from cellseg.runtime.checkpoint import versions
from cellseg.runtime.compile import compile_module
from cellseg.train.perf import matmul_peak_tflops

PROFILE_STEPS = 3
GROUPS = ("conv fwd", "conv dgrad", "conv wgrad", "norm", "elementwise", "optimizer", "other")
# Lower-case substrings of kernel (CUDA) or op (CPU) names -> group; the first matching rule wins.
# cuDNN names convolution kernels after the pass (sm90_xmma_fprop_/dgrad_/wgrad_implicit_gemm...); split-K
# reductions belong to wgrad. A ConvTranspose3d (the decoder's up-sampling, 2x2x2 kernels, a few % of the
# FLOPs) runs its forward as a dgrad kernel and its input gradient as an fprop kernel. Triton kernels are
# named after the aten ops they fuse: "norm" when a normalisation is among them, else "elementwise".
NORM_KEYS = ("batch_norm", "batchnorm", "bn_fw", "bn_bw", "group_norm", "instance_norm", "layer_norm", "welford")
KERNEL_RULES = (
    ("norm", NORM_KEYS),
    ("optimizer", ("adam", "multi_tensor_apply")),
    ("conv wgrad", ("wgrad", "splitkreduce", "convolution_backward_weight")),
    ("conv dgrad", ("dgrad", "convolution_backward_input")),
    ("conv dgrad+wgrad (CPU: one op)", ("convolution_backward",)),
    ("conv fwd", ("fprop", "convolve", "convolution", "conv2d", "conv3d", "convnd", "implicit_gemm", "xmma",
                  "cutlass")),  # not bare "conv": layout kernels are called "convert..."
    ("elementwise", ("elementwise", "reduce_kernel", "leaky", "sigmoid", "binary_cross_entropy", "fill",
                     "aten::add", "aten::mul", "aten::sub", "aten::div", "aten::sum", "aten::mean")),
)


def kernel_group(name: str) -> str:
    """The group of a CUDA kernel (or, on CPU, an aten op) by its name."""
    low = name.lower()
    if low.startswith("triton"):  # fused kernels may also name the convolution whose output they read
        return "norm" if any(k in low for k in NORM_KEYS) else "elementwise"
    return next((group for group, keys in KERNEL_RULES if any(k in low for k in keys)), "other")


def profile_steps(step: Callable[[], None], device: torch.device, step_s: float) -> dict:
    """Device time per step by kernel group (ms and share of the timed step) over `PROFILE_STEPS` steps."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        for _ in range(PROFILE_STEPS):
            step()
        if cuda:
            torch.cuda.synchronize(device)
    kind = "CUDA" if cuda else "CPU"
    events = [e for e in prof.key_averages() if e.device_type.name == kind and not e.key.startswith("ProfilerStep")]
    own = "self_device_time_total" if cuda else "self_cpu_time_total"  # microseconds, children excluded
    kernels = sorted(({"name": e.key, "group": kernel_group(e.key),
                       "ms_per_step": getattr(e, own) / 1e3 / PROFILE_STEPS,
                       "calls_per_step": e.count / PROFILE_STEPS} for e in events), key=lambda k: -k["ms_per_step"])
    step_ms = 1e3 * step_s
    groups = {g: {"ms_per_step": 0.0, "calls_per_step": 0.0} for g in GROUPS}
    for k in kernels:
        g = groups.setdefault(k["group"], {"ms_per_step": 0.0, "calls_per_step": 0.0})
        g["ms_per_step"] += k["ms_per_step"]
        g["calls_per_step"] += k["calls_per_step"]
    busy_ms = sum(g["ms_per_step"] for g in groups.values())
    # kernels of one stream never overlap; idle is what the GPU waited for the CPU (clamped: DDP overlaps streams)
    groups["idle (no kernel running)"] = {"ms_per_step": max(0.0, step_ms - busy_ms), "calls_per_step": 0.0}
    for g in groups.values():
        g["share_of_step"] = g["ms_per_step"] / step_ms
    return {"device": kind, "steps_profiled": PROFILE_STEPS, "timed_step_ms": step_ms, "busy_ms_per_step": busy_ms,
            "groups": groups, "top_kernels": kernels[:25]}


def profile_markdown(title: str, prof: dict) -> str:
    """The kernel-group table and the slowest kernels (their groups show what each group holds)."""
    busy = "GPU time in kernels" if prof["device"] == "CUDA" else "CPU time in aten ops (with profiler overhead)"
    lines = [f"### {title}", "", f"Timed step {prof['timed_step_ms']:.1f} ms; {busy} {prof['busy_ms_per_step']:.1f} "
             f"ms/step (profiled over {prof['steps_profiled']} steps). ConvTranspose3d (decoder up-sampling) "
             "runs forward as dgrad and backward as fprop kernels.", "",
             "| group | ms/step | % of step | kernels/step |", "|---|---|---|---|"]
    for name, g in prof["groups"].items():
        lines.append(f"| {name} | {g['ms_per_step']:.2f} | {g['share_of_step']:.1%} | {g['calls_per_step']:.0f} |")
    lines += ["", "| ms/step | calls/step | group | kernel |", "|---|---|---|---|"]
    lines += [f"| {k['ms_per_step']:.2f} | {k['calls_per_step']:.0f} | {k['group']} | `{k['name'][:120]}` |"
              for k in prof["top_kernels"]]
    return "\n".join(lines) + "\n"


def run_name(args: argparse.Namespace, world_size: int) -> str:
    """File stem of a run: `--tag`, else its settings."""
    ddp = ("" if args.ddp == "compile-then-wrap" else "_wrapfirst") + \
        ("" if args.broadcast_buffers == "on" else "_nobcast")
    return args.tag or (f"{args.model}_w{world_size}_b{args.batch}_c{args.channels}_loss{args.compile_loss}"
                        f"_{args.compile_mode}{ddp}")


def cudagraph_counters() -> dict[str, int]:
    """Inductor's CUDA-graph counters (`cudagraph_skips` > 0: reduce-overhead fell back to plain launches)."""
    from torch._dynamo.utils import counters

    return {k: int(v) for k, v in counters["inductor"].items() if "cudagraph" in k}


def run(args: argparse.Namespace) -> None:
    """Time (and optionally profile) the training step on every rank; rank 0 writes OUT/ddp_<name>.json."""
    d = runtime.init_distributed(args.device)
    runtime.configure_backends(tf32=True, cudnn_benchmark=True)
    if args.cudnn_benchmark_limit is not None:
        torch.backends.cudnn.benchmark_limit = args.cudnn_benchmark_limit  # 0: cuDNN tries every algorithm
    device = d.device
    params = {"norm": args.norm} if args.norm else {}
    torch.manual_seed(0)  # same initial weights on every rank (DDP also broadcasts them)
    model = build_model(args.model, 1, args.channels, preset=args.preset, **params).to(device)
    spatial = tuple(args.patch) if args.patch else tuple(model.spec.default_patch_vox)
    fmt = runtime.memory_format(len(spatial), device.type == "cuda")
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    model = model.to(memory_format=fmt)
    g = torch.Generator(device=device).manual_seed(1000 + d.rank)  # each rank its own batch
    image = torch.rand((args.batch, 1, *spatial), device=device, generator=g).contiguous(memory_format=fmt)
    target = torch.rand((args.batch, args.channels, *spatial), device=device, generator=g) > 0.9
    known = torch.ones_like(target)
    def compiled(m: torch.nn.Module) -> torch.nn.Module:
        return compile_module(m, mode=args.compile_mode) if args.compile == "on" else m

    def wrapped(m: torch.nn.Module) -> torch.nn.Module:
        return runtime.wrap_ddp(m, d, broadcast_buffers=args.broadcast_buffers == "on")

    # the trainer's order compiles the model and wraps the result; "wrap-then-compile" lets dynamo's DDP optimizer
    # split the graph at the gradient buckets, so their all-reduce can overlap the backward
    net = wrapped(compiled(model)) if args.ddp == "compile-then-wrap" else compiled(wrapped(model))
    loss_fn = SegmentationLoss().to(device)
    loss_fn = compile_module(loss_fn) if args.compile_loss == "on" else loss_fn
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    precision = "bf16" if device.type == "cuda" else "fp32"

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with runtime.autocast(device, precision):
            loss = loss_fn(net(image), target, known)
        loss.backward()
        opt.step()

    t0 = time.perf_counter()
    for _ in range(args.warmup):
        step()
    sync()
    runtime.barrier(d)
    warmup_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    sync()
    runtime.barrier(d)
    sec = (time.perf_counter() - t0) / args.steps
    with torch.device("meta"):
        flops = count_flops(build_model(args.model, 1, args.channels, preset=args.preset, **params),
                            (args.batch, 1, *spatial), backward=True)
    peak = matmul_peak_tflops(device)
    name = run_name(args, d.world_size)
    args.out.mkdir(parents=True, exist_ok=True)
    prof = profile_steps(step, device, sec) if args.profile else None  # every rank steps (DDP all-reduces)
    if prof and d.is_main:
        (args.out / f"profile_{name}.json").write_text(json.dumps(prof, indent=1))
        (args.out / f"profile_{name}.md").write_text(profile_markdown(name, prof))
    if d.is_main:
        samples = args.batch * d.world_size / sec
        cuda = device.type == "cuda"
        row = {"name": name, "model": args.model, "preset": args.preset, "norm": args.norm or "model default",
               "world_size": d.world_size, "batch_per_gpu": args.batch, "patch": list(spatial),
               "channels": args.channels, "compile": args.compile, "compile_mode": args.compile_mode,
               "compile_loss": args.compile_loss, "cudnn_benchmark_limit": torch.backends.cudnn.benchmark_limit,
               "ddp": args.ddp, "broadcast_buffers": args.broadcast_buffers,
               "step_ms": 1e3 * sec, "samples_per_s": samples, "mvox_per_s": samples * math.prod(spatial) / 1e6,
               "warmup_s": warmup_s, "gflop_per_step": flops / 1e9,
               "mfu_per_gpu": flops / sec / 1e12 / peak if peak else None, "matmul_peak_tflops": peak,
               "peak_gb": torch.cuda.max_memory_allocated(device) / 1e9 if cuda else None,
               "reserved_gb": torch.cuda.max_memory_reserved(device) / 1e9 if cuda else None,
               "cudagraph_counters": cudagraph_counters(),
               "kernel_groups": {k: v["ms_per_step"] for k, v in prof["groups"].items()} if prof else None,
               "gpu": torch.cuda.get_device_name(device) if cuda else "cpu", "versions": versions(),
               "date": datetime.date.today().isoformat()}
        (args.out / f"ddp_{name}.json").write_text(json.dumps(row, indent=1))
        print(json.dumps({k: row[k] for k in ("name", "world_size", "batch_per_gpu", "compile_mode", "step_ms",
                                               "samples_per_s", "mfu_per_gpu", "peak_gb")}), flush=True)
    if dist.is_initialized():
        dist.destroy_process_group()


def _setting(r: dict) -> tuple:
    """What must match for two runs to be compared as 1 vs N GPUs (the DDP settings do not apply to one GPU)."""
    return (r["model"], r["batch_per_gpu"], r["channels"], r.get("compile_loss", "off"),
            r.get("compile_mode", "default"), r.get("norm", "model default"), r.get("cudnn_benchmark_limit"))


DEFAULT_DDP = "compile-then-wrap, buffers on"  # the trainer's


def _ddp(r: dict) -> str:
    return f"{r.get('ddp', 'compile-then-wrap')}, buffers {r.get('broadcast_buffers', 'on')}"


def _pct(x: float | None) -> str:
    return f"{x:.1%}" if x else "n/a"


def _num(row: dict, key: str, spec: str) -> str:
    return format(row[key], spec) if row.get(key) is not None else "-"


def summarize(folder: Path) -> str:
    """Markdown table of every `ddp_*.json` in `folder`, efficiency relative to the 1-GPU run of the same setting
    (whatever its DDP options: one process runs no DDP)."""
    rows = [json.loads(p.read_text()) for p in sorted(folder.glob("ddp_*.json"))]
    base: dict[tuple, float] = {}
    for r in rows:  # the 1-GPU run of each setting; of several, the one with DDP's default options
        if r["world_size"] == 1 and (_setting(r) not in base or _ddp(r) == DEFAULT_DDP):
            base[_setting(r)] = r["samples_per_s"]
    out = ["| model | channels | loss compiled | compile mode | norm | DDP | GPUs | batch/GPU | ms/step | samples/s | "
           "MFU/GPU | scaling efficiency |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (*map(str, _setting(r)), r["world_size"], _ddp(r))):
        one = base.get(_setting(r))
        eff = _pct(r["samples_per_s"] / (r["world_size"] * one)) if one else "n/a"
        out.append(f"| {r['model']} | {r['channels']} | {r.get('compile_loss', 'off')} | "
                   f"{r.get('compile_mode', 'default')} | {r.get('norm', 'model default')} | "
                   f"{_ddp(r) if r['world_size'] > 1 else '-'} | {r['world_size']} | "
                   f"{r['batch_per_gpu']} | {r['step_ms']:.1f} | {r['samples_per_s']:.1f} | "
                   f"{_pct(r.get('mfu_per_gpu'))} | {eff} |")
    return "\n".join(out)


def mfu_report(runs: Path, out: Path) -> dict:
    """OUT/mfu.md + OUT/mfu.json from the runs of bench/gpu/mfu.sh (RUNS/status.tsv: name, exit code, seconds,
    limit, flags — one line per run in run order), with the baseline's kernel-group profile."""
    status = [line.split("\t") for line in (runs / "status.tsv").read_text().splitlines() if line.strip()]
    rows = []
    for name, rc, seconds, limit, flags in status:
        path = runs / f"ddp_{name}.json"
        state = {"0": "ok", "124": "timed out", "137": "killed (timeout)", "skip": "skipped: no time left"}
        row = {"name": name, "flags": flags, "status": state.get(rc, f"failed (exit {rc})"),
               "wall_s": float(seconds), "limit_s": float(limit)}
        if path.is_file():
            row.update({k: v for k, v in json.loads(path.read_text()).items() if k != "name"})
            if rc != "0":  # the result was written before the limit hit (teardown)
                row["status"] += ", after writing its result"
        rows.append(row)
    done = [r for r in rows if "step_ms" in r]
    lines = ["# MFU matrix (bench/gpu/mfu.sh)", ""]
    if done:
        r0 = done[0]
        peak = f"{r0['matmul_peak_tflops']:.0f} TFLOP/s" if r0["matmul_peak_tflops"] else "n/a (no GPU)"
        lines += [f"{r0['model']} ({r0['preset']}), patch {'×'.join(map(str, r0['patch']))}, {r0['channels']} output "
                  f"channels, compiled loss; {r0['gpu']}, torch {r0['versions'].get('torch')}, cuDNN "
                  f"{r0['versions'].get('cudnn')}, {r0['date']}. MFU: model FLOPs (forward + backward) per second "
                  f"against the bf16 matmul peak measured on this GPU, {peak}. CUDA-graph skips > 0: "
                  "the graphs were not used (the reason is in the row's log).", ""]
    lines += ["| run | flags | status | ms/step | samples/s | MFU | peak GB | warm-up s (compile) | wall s | "
              "CUDA-graph skips |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        graphs = "step_ms" in r and r.get("compile_mode") in ("reduce-overhead", "max-autotune")
        skips = r.get("cudagraph_counters", {}).get("cudagraph_skips", 0) if graphs else "-"
        lines.append(f"| {r['name']} | `{r['flags']}` | {r['status']} | {_num(r, 'step_ms', '.1f')} | "
                     f"{_num(r, 'samples_per_s', '.1f')} | {_pct(r.get('mfu_per_gpu'))} | {_num(r, 'peak_gb', '.1f')} | "
                     f"{_num(r, 'warmup_s', '.0f')} | {r['wall_s']:.0f} / {r['limit_s']:.0f} | {skips} |")
    profiles = sorted(runs.glob("profile_*.json"))
    report = {"rows": rows, "profiles": {p.stem: json.loads(p.read_text()) for p in profiles}}
    for p in profiles:
        lines += ["", p.with_suffix(".md").read_text()]
    out.mkdir(parents=True, exist_ok=True)
    (out / "mfu.md").write_text("\n".join(lines) + "\n")
    (out / "mfu.json").write_text(json.dumps(report, indent=1))
    return report


def main() -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("bench_out"))
    parser.add_argument("--tag", default=None, help="name of the run's files (default: from its settings)")
    parser.add_argument("--model", default="unet_3d")
    parser.add_argument("--preset", default="default", help="model size preset (tiny: a CPU check of the script)")
    parser.add_argument("--norm", choices=["batch", "instance", "group"], default=None,
                        help="model.params.norm for an experiment (default: the model's, batch for unet_3d)")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--batch", type=int, default=8, help="per-GPU batch (the experiment preset's)")
    parser.add_argument("--patch", type=int, nargs="+", default=None, help="spatial patch (default: the model's)")
    parser.add_argument("--channels", type=int, default=48, help="output channels (48 = the tested classes)")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=8, help="untimed steps (compile and cuDNN autotuning)")
    parser.add_argument("--compile", choices=["on", "off"], default="on")
    parser.add_argument("--compile-mode", choices=COMPILE_MODES, default="default",
                        help="torch.compile mode of the model (train.compile_mode); the loss keeps 'default'")
    parser.add_argument("--compile-loss", choices=["on", "off"], default="on", help="torch.compile the loss too")
    parser.add_argument("--cudnn-benchmark-limit", type=int, default=None,
                        help="cuDNN algorithms tried per convolution (torch's default 10; 0 = all)")
    parser.add_argument("--ddp", choices=["compile-then-wrap", "wrap-then-compile"], default="compile-then-wrap",
                        help="the trainer's order (compiled model in DDP), or torch.compile of the DDP-wrapped model")
    parser.add_argument("--broadcast-buffers", choices=["on", "off"], default="on",
                        help="DDP sends rank 0's BatchNorm buffers to every rank before each forward (torch's default)")
    parser.add_argument("--profile", action="store_true", help="also profile 3 steps on rank 0 (kernel groups)")
    parser.add_argument("--summarize", type=Path, default=None, metavar="DIR", help="print the table of DIR and exit")
    parser.add_argument("--mfu-report", type=Path, default=None, metavar="RUNS",
                        help="write OUT/mfu.md + mfu.json from the runs of bench/gpu/mfu.sh and exit")
    args = parser.parse_args()
    if args.summarize:
        print(summarize(args.summarize))
        return
    if args.mfu_report:
        mfu_report(args.mfu_report, args.out)
        print((args.out / "mfu.md").read_text())
        return
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    run(args)


if __name__ == "__main__":
    main()
