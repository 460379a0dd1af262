"""DDP scaling of the trainer's step on one host, with in-memory input (what the GPUs alone can do).

    torchrun --nproc-per-node N bench/ddp_scaling.py --out OUT [--model unet_3d] [--batch 8] [--channels 48]
    python bench/ddp_scaling.py --summarize OUT        # efficiency table from the runs of 1, 2, 4 GPUs

Every rank runs the trainer's settings on its own random batch (per-GPU batch `--batch`): bf16 autocast,
TF32, channels-last, `torch.compile` before the DDP wrap, DDP with gradient-as-bucket-view, fused AdamW,
masked BCE + Dice — the same pieces `cellseg train` uses (cellseg/train/runtime.py). Timed steps end with a
device synchronisation and a barrier, so a step is as slow as the slowest rank. Scaling efficiency =
samples/s on N GPUs / (N × samples/s on 1 GPU), per-GPU batch fixed (weak scaling, as in training).
`--profile` also writes the top CUDA kernels of 3 steps (the MFU investigation) to OUT/profile_<model>.txt.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

from cellseg.losses import SegmentationLoss
from cellseg.models import build_model
from cellseg.models.summary import count_flops
from cellseg.train import runtime
from cellseg.train.checkpoint import versions
from cellseg.train.perf import matmul_peak_tflops

KERNEL_GROUPS = (  # substrings of CUDA kernel names → what the time is spent on (first match wins)
    ("convolution (cuDNN/CUTLASS)", ("conv", "cutlass", "sm90_xmma", "implicit", "wgrad", "dgrad", "fprop", "nhwc")),
    ("batch norm", ("batch_norm", "bn_", "batchnorm")),
    ("fused elementwise (Triton)", ("triton",)),
    ("optimizer", ("adam", "multi_tensor")),
    ("NCCL", ("nccl",)),
    ("copies / layout", ("copy", "transpose", "memcpy", "memset", "cat")),
)


def _kernel_group(name: str) -> str:
    low = name.lower()
    return next((group for group, keys in KERNEL_GROUPS if any(k in low for k in keys)), "other")


def profile_steps(step, out: Path, name: str) -> dict[str, float]:
    """CUDA time of 3 steps by kernel group, and the 25 slowest kernels (written to `out`)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            step()
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
    total = sum(e.self_device_time_total for e in events) or 1.0
    groups: dict[str, float] = {}
    for e in events:
        g = _kernel_group(e.key)
        groups[g] = groups.get(g, 0.0) + e.self_device_time_total / total
    top = sorted(events, key=lambda e: -e.self_device_time_total)[:25]
    lines = [f"{name}: CUDA time of 3 steps = {total / 1e3:.1f} ms", "", "share  ms/step  calls  kernel"]
    lines += [f"{e.self_device_time_total / total:6.1%} {e.self_device_time_total / 3e3:7.2f} {e.count // 3:6d}  "
              f"{e.key[:140]}" for e in top]
    lines += ["", "by group:"] + [f"{v:6.1%}  {k}" for k, v in sorted(groups.items(), key=lambda kv: -kv[1])]
    out.write_text("\n".join(lines) + "\n")
    return groups


def run(args: argparse.Namespace) -> None:
    d = runtime.init_distributed(args.device)
    runtime.configure_backends(tf32=True, cudnn_benchmark=True)
    device = d.device
    torch.manual_seed(0)  # same initial weights on every rank (DDP also broadcasts them)
    model = build_model(args.model, 1, args.channels, preset=args.preset).to(device)
    spatial = tuple(args.patch) if args.patch else tuple(model.spec.default_patch_vox)
    fmt = runtime.memory_format(len(spatial), device.type == "cuda")
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    model = model.to(memory_format=fmt)
    g = torch.Generator(device=device).manual_seed(1000 + d.rank)  # each rank its own batch
    image = torch.rand((args.batch, 1, *spatial), device=device, generator=g).contiguous(memory_format=fmt)
    target = torch.rand((args.batch, args.channels, *spatial), device=device, generator=g) > 0.9
    known = torch.ones_like(target)
    net = torch.compile(model) if args.compile == "on" else model
    net = runtime.wrap_ddp(net, d)
    loss_fn = SegmentationLoss().to(device)
    loss_fn = torch.compile(loss_fn) if args.compile_loss == "on" else loss_fn
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
        flops = count_flops(build_model(args.model, 1, args.channels, preset=args.preset), (args.batch, 1, *spatial),
                            backward=True)
    peak = matmul_peak_tflops(device)
    groups = None
    if args.profile and d.is_main and device.type == "cuda":
        args.out.mkdir(parents=True, exist_ok=True)
        groups = profile_steps(step, args.out / f"profile_{args.model}_b{args.batch}_loss{args.compile_loss}.txt",
                               args.model)
    if d.is_main:
        samples = args.batch * d.world_size / sec
        row = {"model": args.model, "world_size": d.world_size, "batch_per_gpu": args.batch, "patch": list(spatial),
               "channels": args.channels, "compile": args.compile, "compile_loss": args.compile_loss, "step_ms": 1e3 * sec, "samples_per_s": samples,
               "mvox_per_s": samples * math.prod(spatial) / 1e6, "warmup_s": warmup_s,
               "mfu_per_gpu": flops / sec / 1e12 / peak if peak else None, "matmul_peak_tflops": peak,
               "peak_gb": torch.cuda.max_memory_allocated(device) / 1e9 if device.type == "cuda" else None,
               "kernel_groups": groups, "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", "versions": versions(),
               "date": datetime.date.today().isoformat()}
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / f"ddp_{args.model}_w{d.world_size}_b{args.batch}_c{args.channels}_loss{args.compile_loss}.json"
        path.write_text(json.dumps(row, indent=1))
        print(json.dumps({k: row[k] for k in ("world_size", "batch_per_gpu", "step_ms", "samples_per_s",
                                               "mfu_per_gpu", "peak_gb")}))
    if dist.is_initialized():
        dist.destroy_process_group()


def summarize(folder: Path) -> str:
    """Markdown table of every `ddp_*.json` in `folder`, efficiency relative to the 1-GPU run of the same setting."""
    rows = [json.loads(p.read_text()) for p in sorted(folder.glob("ddp_*.json"))]
    key = lambda r: (r["model"], r["batch_per_gpu"], r["channels"], r.get("compile_loss", "off"))  # noqa: E731
    base = {key(r): r["samples_per_s"] for r in rows if r["world_size"] == 1}
    out = ["| model | channels | loss compiled | GPUs | batch/GPU | ms/step | samples/s | MFU/GPU | scaling efficiency |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (*key(r), r["world_size"])):
        one = base.get(key(r))
        eff = f"{r['samples_per_s'] / (r['world_size'] * one):.1%}" if one else "n/a"
        mfu = f"{r['mfu_per_gpu']:.1%}" if r.get("mfu_per_gpu") else "n/a"
        out.append(f"| {r['model']} | {r['channels']} | {r.get('compile_loss', 'off')} | {r['world_size']} | {r['batch_per_gpu']} | {r['step_ms']:.1f} | "
                   f"{r['samples_per_s']:.1f} | {mfu} | {eff} |")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("bench_out"))
    parser.add_argument("--model", default="unet_3d")
    parser.add_argument("--preset", default="default", help="model size preset (tiny: a CPU check of the script)")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--batch", type=int, default=8, help="per-GPU batch (the experiment preset's)")
    parser.add_argument("--patch", type=int, nargs="+", default=None, help="spatial patch (default: the model's)")
    parser.add_argument("--channels", type=int, default=48, help="output channels (48 = the tested classes)")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=8, help="untimed steps (compile and cuDNN autotuning)")
    parser.add_argument("--compile", choices=["on", "off"], default="on")
    parser.add_argument("--compile-loss", choices=["on", "off"], default="on", help="torch.compile the loss too")
    parser.add_argument("--profile", action="store_true", help="also profile 3 steps on rank 0")
    parser.add_argument("--summarize", type=Path, default=None, metavar="DIR", help="print the table of DIR and exit")
    args = parser.parse_args()
    if args.summarize:
        print(summarize(args.summarize))
        return
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    run(args)


if __name__ == "__main__":
    main()
