"""Where a training step's time goes: phase by phase, then kernel group by kernel group.

    python -m bench.train_profile --root DATA_ROOT --out OUT [--names unet_3d,unet_2d] [--steps 10] [key=value ...]
    python -m bench.train_profile --quick --root TINY_ROOT --out OUT      # CPU, smoke configs (checks the script)

Per architecture the trainer is built from `configs/experiments/<name>.yaml` as `cellseg train` builds it (data
root, default targets with the boundary channels, resident data, compiled model and loss; compiled before the first
step, `train.background_compile=false`), one batch from its loader is put on the device, and then, each timed over
`--steps` steps after warm-up:

- **step**: the trainer's whole optimizer step on that batch (augmentation, forward, loss, backward, clipping,
  update): the in-memory rate of `bench/train_e2e.py`;
- **augment**: the batched augmentation and target decoding alone;
- **forward + loss + backward** on one augmented batch;
- **clip + update**: gradient clipping and the optimizer step;

then `torch.profiler` over 3 steps of the first two, kernels grouped as in `bench/ddp_scaling.py` (convolution
forward / input gradient / weight gradient, normalisation, elementwise, optimizer, other, idle). MFU: model FLOPs
per second against the bf16 matmul peak the trainer measured. Writes OUT/train_profile.json and .md.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import torch

from bench.ddp_scaling import profile_markdown, profile_steps
from bench.record import record_paths
from bench.train_e2e import QUIET as E2E_QUIET
from bench.train_e2e import run_arguments, run_environment
from bench.train_step import timed as timed_steps
from cellseg import runtime
from cellseg.config import load_run_config
from cellseg.train.stop import StopRequest
from cellseg.train.trainer import Trainer

REPO = Path(__file__).resolve().parents[1]
NAMES = ("unet_3d", "unet_2d")
QUIET = (*E2E_QUIET, "train.background_compile=false")
PHASES = ("step", "augment", "forward + loss + backward", "clip + update")


def profile_one(name: str, root: Path, run_dir: Path, *, steps: int, warmup: int, overrides: list[str],
                quick: bool) -> dict:
    """The phase times, MFU and kernel-group profiles of one architecture (module docstring)."""
    config = REPO / "configs" / ("smoke" if quick else "experiments") / f"{name}.yaml"
    cfg = load_run_config(config, [f"data.root={root}", f"run_dir={run_dir}", "train.max_steps=1000000", *QUIET,
                                   *overrides])
    stop = StopRequest()
    trainer = Trainer(cfg, stop=stop)
    try:
        s = trainer.s
        device = s.dist.device
        timed = lambda fn: timed_steps(fn, steps, warmup, device)[0]  # noqa: E731 - seconds per call
        batch = trainer._to_device(next(trainer.batch_stream(stop)))
        step = lambda: trainer.train_step([batch])  # noqa: E731
        augment = lambda: s.data.augment(batch, 0)  # noqa: E731
        image, target, known = augment()
        image = image.contiguous(memory_format=s.memory_format)

        def forward_backward() -> None:
            with runtime.autocast(device, s.precision):
                loss = s.criterion(s.net(image), target, known)
            loss.backward()

        def update() -> None:
            torch.nn.utils.clip_grad_norm_([p for p in s.net.parameters() if p.grad is not None],
                                           cfg.optim.grad_clip_norm or float("inf"))
            s.optimizer.step()

        ms = {"step": timed(step), "augment": timed(augment), "forward + loss + backward": timed(forward_backward)}
        ms["clip + update"] = timed(update)  # on the gradients the last forward + backward left
        s.optimizer.zero_grad(set_to_none=True)
        row = {"name": name, "config": str(config.relative_to(REPO)), "batch": s.batch_size,
               "patch_shape_vox": list(cfg.data.patch_shape_vox), "channels": cfg.data.num_target_channels,
               "precision": s.precision, "compiled": bool(s.meta.get("compile", {}).get("compiled")),
               "ms": {k: 1e3 * v for k, v in ms.items()},
               "samples_per_s": s.batch_size / ms["step"],
               "profile": {"step": profile_steps(step, device, ms["step"]),
                           "augment": profile_steps(augment, device, ms["augment"])}}
        if s.peak_tflops:
            row.update(peak_tflops=s.peak_tflops, mfu=s.flops_per_sample * row["samples_per_s"] / 1e12 / s.peak_tflops,
                       gpu_peak_gib=torch.cuda.max_memory_allocated(device) / 2**30)
        return row
    finally:
        trainer.close()
        stop.restore()


def markdown(env: dict, rows: list[dict]) -> str:
    """The phase table, then each architecture's kernel groups."""
    lines = [f"# Training step by phase ({env['gpu']}, torch {env['torch']}, {env['date']})", "",
             f"Data root: `{env['root']}`; {env['steps']} timed steps after {env['warmup']}; overrides: "
             f"{' '.join(env['overrides']) or 'none'}. Milliseconds per step (batch as configured).", "",
             "| arch | batch | channels | " + " | ".join(PHASES) + " | samples/s | MFU |",
             "|---|---|---|" + "---|" * len(PHASES) + "---|---|"]
    for r in rows:
        mfu = f"{r['mfu']:.1%}" if "mfu" in r else "n/a"
        lines.append(f"| {r['name']} | {r['batch']} | {r['channels']} | "
                     + " | ".join(f"{r['ms'][p]:.1f}" for p in PHASES) + f" | {r['samples_per_s']:.1f} | {mfu} |")
    lines.append("")
    for r in rows:
        lines += [profile_markdown(f"{r['name']}: step", r["profile"]["step"]),
                  profile_markdown(f"{r['name']}: augment", r["profile"]["augment"])]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = run_arguments(__doc__, stem="train_profile", names=NAMES, steps=10, warmup=3,
                           steps_help="timed steps per phase")
    args = parser.parse_args(argv)
    json_path, md_path = record_paths(args.out, "train_profile")
    runs = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="train_profile_"))  # the trainers' run folders
    env = run_environment(args)
    rows = []
    for name in args.names.split(","):
        print(f"{name}: building the trainer and timing its phases", flush=True)
        rows.append(profile_one(name, args.root.resolve(), runs / f"run_{name}", steps=args.steps,
                                warmup=args.warmup, overrides=args.overrides, quick=args.quick))
        torch._dynamo.reset()  # the next architecture compiles from a clean slate
        print(f"{name}: " + ", ".join(f"{k} {v:.1f} ms" for k, v in rows[-1]["ms"].items()), flush=True)
        json_path.write_text(json.dumps({"env": env, "rows": rows}, indent=1))
        md_path.write_text(markdown(env, rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
