"""Training as users run it vs the same step on a batch already on the GPU, per architecture.

    python -m bench.train_e2e --root DATA_ROOT --out OUT [--names unet_3d,...] [--steps 60] [--repeats 2]
                              [--gpus 1,2] [--cores-per-gpu 16] [key=value ...]

For each architecture, in a process of its own (a fresh compile, a fresh CUDA context), the trainer is built
from `configs/experiments/<name>.yaml` exactly as `cellseg train` builds it (data root, default targets with
the boundary channels, the resident-data choice, compile decision, loader workers), with `key=value`
overrides applied to every architecture, then:

- **time to first step**: from the process's start to the end of the first optimizer step (imports, data
  set-up, compilation and the first batch included), with a cold compile cache (`$CELLSEG_CACHE` empty) and
  again with the cache the first run left (`--repeats 2`: warm);
- **compiled from**: when the model is compiled in the background (`train.background_compile`, a cold cache),
  the first steps are eager: the time from the process's start until training runs compiled, and the eager
  steps made meanwhile;
- **end to end**: optimizer steps per second over `--steps` steps after `--warmup` steps, batches from the
  trainer's own loader, GPU augmentation included;
- **in memory**: the same trainer's step repeated on one batch already on the GPU (augmentation included,
  no loader): the ceiling the loader can reach; timed over `--steps` steps before and again after the end-to-end
  steps, and their mean is the reference: the two differ when the step itself drifts (GPU clocks, other
  processes), which a single timing would read as a loader gap or surplus (`in-memory drift`);
- samples/s of both, their ratio, MFU of both against the bf16 matmul peak measured by the trainer, host
  memory (RSS) at the start and the end of the timed steps, and the GPU's peak memory.

`--gpus 1,2` runs every architecture on 1 and on 2 GPUs (DDP through torchrun, per-GPU batch fixed, as in
training) and adds the DDP scaling efficiency end to end: samples/s on N GPUs / (N x samples/s on 1 GPU) of the
same run. `--cores-per-gpu K` pins a job on N GPUs to the first N x K cores, so each GPU has the cores it would
have on its own share of the host. Samples/s count all GPUs; MFU is per GPU; host memory is rank 0's process
tree (its loader workers included).

Writes OUT/train_e2e.json and OUT/train_e2e.md. `--quick` checks the script on the CPU with the smoke configs.
"""

from __future__ import annotations

import time

PROCESS_START = time.time()  # before the heavy imports: time to first step counts them, as a user's job does

import argparse  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from pathlib import Path  # noqa: E402

from bench.record import record_paths  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
EXPERIMENTS = REPO / "configs" / "experiments"
SMOKE = REPO / "configs" / "smoke"
NAMES = ("unet_3d", "resnet_3d", "swin_3d", "vit_3d", "unet_2d", "resnet_2d", "swin_2d", "vit_2d")
QUIET = ("train.val_every=1000000", "train.checkpoint_every=1000000", "train.log_every=1000000")


def _rss_gib() -> float:
    """Resident host memory of this process and its children (DataLoader workers), GiB (this process alone
    without psutil)."""
    try:
        import psutil
    except ImportError:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30
    me = psutil.Process()
    return sum(p.memory_info().rss for p in [me, *me.children(recursive=True)]) / 2**30


def _graphs_compiled() -> int:
    """Graphs torch.compile has compiled in this process so far (dynamo's counter)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_one(name: str, root: Path, run_dir: Path, steps: int, warmup: int, overrides: list[str],
                quick: bool) -> dict:
    """The measurements of one architecture in this process, one rank of a DDP job under torchrun (module
    docstring)."""
    import torch

    from cellseg.config import load_run_config
    from cellseg.train.stop import StopRequest
    from cellseg.train.trainer import Trainer

    config = (SMOKE if quick else EXPERIMENTS) / f"{name}.yaml"
    cfg = load_run_config(config, [f"data.root={root}", f"run_dir={run_dir}", f"train.max_steps={warmup + steps + 1}",
                                   *QUIET, *overrides])
    imports_s = time.time() - PROCESS_START  # the interpreter, torch and cellseg, the config
    stop = StopRequest()
    trainer = Trainer(cfg, stop=stop)  # as `cellseg train`: the loader's workers start before compilation
    s = trainer.s
    device = s.dist.device
    batches = trainer.batch_stream(stop)
    fetch_start = time.perf_counter()
    first = next(batches)
    graphs = _graphs_compiled()
    step_start = time.perf_counter()
    trainer.train_step([first])
    _sync(device)
    first_step_s = time.time() - PROCESS_START
    graphs_at_first_step = _graphs_compiled() - graphs  # > 0: set-up's compile did not cover what training runs
    startup = {"imports": round(imports_s, 2), **s.startup_s, "first batch": round(step_start - fetch_start, 2),
               "first step": round(time.perf_counter() - step_start, 2)}  # the rest: run files, checks
    eager_steps, background = 0, s.background is not None
    while s.background is not None and not s.background.done():  # trains eagerly while the model compiles
        trainer.train_step([next(batches)])
        eager_steps += 1
    if background:
        trainer.finish_compile()
    _sync(device)
    compiled_s = time.time() - PROCESS_START  # from here on the model is the one training keeps

    def seconds_per_step(batch: dict | None, n: int) -> float:
        """Mean seconds of `n` steps on `batch` again and again, or on the loader's batches (None)."""
        _sync(device)
        start = time.perf_counter()
        for _ in range(n):
            trainer.train_step([batch if batch is not None else next(batches)])
        _sync(device)
        return (time.perf_counter() - start) / max(n, 1)  # n = 0: --warmup 0

    batch = trainer._to_device(next(batches))  # one batch on the GPU, stepped on again and again
    seconds_per_step(batch, min(warmup, 3))
    mem_before_s = seconds_per_step(batch, steps)  # in memory before and after the end-to-end steps: a drift of
    seconds_per_step(None, warmup)  # the step itself between them (clocks, other processes) shows as their spread
    rss_start = _rss_gib()
    e2e_s = seconds_per_step(None, steps)
    rss_end = _rss_gib()
    mem_after_s = seconds_per_step(batch, steps)
    mem_s = (mem_before_s + mem_after_s) / 2
    world = s.dist.world_size
    samples = s.batch_size * cfg.train.grad_accum_steps * world  # all GPUs' samples per optimizer step
    row = {"name": name, "gpus": world, "config": str(config.relative_to(REPO)), "batch": s.batch_size,
           "patch_shape_vox": list(cfg.data.patch_shape_vox), "channels": cfg.data.num_target_channels,
           "precision": s.precision, "compiled": bool(s.meta.get("compile", {}).get("compiled")),
           "resident": s.meta.get("resident_data", cfg.data.resident),
           "loader_workers": cfg.loader.num_workers, "first_step_s": first_step_s, "startup_s": startup,
           "startup_record_reused": bool(s.meta.get("compile", {}).get("reused")),
           "graphs_compiled_at_first_step": graphs_at_first_step, "background_compile": background,
           "compiled_from_s": compiled_s, "eager_steps_while_compiling": eager_steps,
           "background_s": s.meta["compile"].get("background_s"), "switch_s": s.meta["compile"].get("switch_s"),
           "background_note": s.meta.get("background_compile"),
           "e2e_samples_per_s": samples / e2e_s, "in_memory_samples_per_s": samples / mem_s,
           "in_memory_before_samples_per_s": samples / mem_before_s,
           "in_memory_after_samples_per_s": samples / mem_after_s,
           "ratio": mem_s / e2e_s, "rss_gib_start": rss_start, "rss_gib_end": rss_end, "steps": steps}
    if s.peak_tflops:
        per = s.flops_per_sample / 1e12 / s.peak_tflops / world  # MFU per GPU
        row.update(peak_tflops=s.peak_tflops, mfu_e2e=row["e2e_samples_per_s"] * per,
                   mfu_in_memory=row["in_memory_samples_per_s"] * per,
                   gpu_peak_gib=torch.cuda.max_memory_allocated(device) / 2**30)
    trainer.close()
    return row


def _label(row: dict) -> str:
    gpus = row.get("gpus", 1)
    return row["name"] if gpus == 1 else f"{row['name']} on {gpus} GPUs"


def _drift(row: dict) -> str:
    """In memory after the end-to-end steps relative to before them (rows of runs that timed it once: "-")."""
    before, after = row.get("in_memory_before_samples_per_s"), row.get("in_memory_after_samples_per_s")
    return "-" if before is None else f"{100 * (after - before) / row['in_memory_samples_per_s']:+.1f} %"


def markdown(env: dict, rows: list[dict]) -> str:
    """The table of docs/benchmarks.md."""
    lines = [f"# Training end to end vs in memory ({env['gpu']}, torch {env['torch']}, {env['date']})", "",
             f"Data root: `{env['root']}`; {env['steps']} timed steps after {env['warmup']} warm-up steps; overrides: "
             f"{' '.join(env['overrides']) or 'none'}; cores per GPU: {env.get('cores_per_gpu', 'all')}.", "",
             "| arch | GPUs | batch/GPU | resident | e2e samples/s | in-memory samples/s | e2e / in-memory | "
             "in-memory drift | MFU e2e | first step cold (s) | compiled from, cold (s) | eager steps meanwhile | "
             "first step warm (s) | host GiB start → end |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        warm, mfu = r.get("first_step_warm_s"), r.get("mfu_e2e")
        lines.append(f"| {r['name']} | {r.get('gpus', 1)} | {r['batch']} | {r['resident']} | "
                     f"{r['e2e_samples_per_s']:.1f} | {r['in_memory_samples_per_s']:.1f} | {100 * r['ratio']:.1f} % | "
                     f"{_drift(r)} | {'-' if mfu is None else f'{100 * mfu:.1f} %'} | {r['first_step_s']:.1f} | "
                     f"{r['compiled_from_s']:.1f} | {r['eager_steps_while_compiling']} | "
                     f"{'-' if warm is None else f'{warm:.1f}'} | {r['rss_gib_start']:.2f} → {r['rss_gib_end']:.2f} |")
    lines += ["", "Time to the first step, cold, by phase (s; `cellseg.train.setup.Phases`, then the first batch and the "
              "first step, where torch.compile compiles):", ""]
    for r in rows:
        parts = ", ".join(f"{k} {v:.1f}" for k, v in r.get("startup_s", {}).items())
        lines.append(f"- {_label(r)}: {r['first_step_s']:.1f} = {parts or 'not recorded'}; graphs compiled at the "
                     f"first step: {r.get('graphs_compiled_at_first_step', '-')}" + (
                         f"; compiled in the background in {r['background_s']:.1f} s, loaded in {r['switch_s']:.1f} s"
                         if r.get("background_compile") else ""))
    scaling = ddp_efficiency(rows)
    if scaling:
        lines += ["", "DDP scaling efficiency, samples/s on N GPUs / (N x samples/s on 1 GPU), same run:", "",
                  "| arch | GPUs | end to end | in memory |", "|---|---|---|---|"]
        lines += [f"| {e['name']} | {e['gpus']} | {100 * e['e2e']:.1f} % | {100 * e['in_memory']:.1f} % |"
                  for e in scaling]
    warm = [r for r in rows if r.get("startup_warm_s")]
    if warm:
        lines += ["", "Warm (the compile cache and the start-up record the cold run left), by phase (s):", ""]
        for r in warm:
            parts = ", ".join(f"{k} {v:.1f}" for k, v in r["startup_warm_s"].items())
            lines.append(f"- {_label(r)}: {r['first_step_warm_s']:.1f} = {parts}; start-up record reused: "
                         f"{r['warm_reused_startup_record']}; graphs compiled at the first step: "
                         f"{r['warm_graphs_compiled_at_first_step']}")
    return "\n".join(lines) + "\n"


def ddp_efficiency(rows: list[dict]) -> list[dict]:
    """Per architecture and GPU count N > 1: samples/s on N GPUs / (N x samples/s on 1 GPU), end to end and in
    memory, from the rows of one run."""
    one = {r["name"]: r for r in rows if r.get("gpus", 1) == 1}
    return [{"name": r["name"], "gpus": r["gpus"],
             **{key: r[f"{key}_samples_per_s"] / (r["gpus"] * one[r["name"]][f"{key}_samples_per_s"])
                for key in ("e2e", "in_memory")}}
            for r in rows if r.get("gpus", 1) > 1 and r["name"] in one]


def _child(args: argparse.Namespace, name: str, gpus: int, cache: Path, out: Path) -> dict | None:
    """One architecture in a process of its own (torchrun's `gpus` processes for DDP), pinned to its cores."""
    env = {**os.environ, "CELLSEG_CACHE": str(cache), "PYTHONPATH": os.pathsep.join(
        filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)  # the cache under test is $CELLSEG_CACHE/inductor
    launch = [sys.executable] if gpus == 1 else [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                                 f"--nproc-per-node={gpus}"]
    command = [*launch, "-m", "bench.train_e2e", "--one", name, "--root", str(args.root), "--out", str(out),
               "--run-dir", str(out.with_suffix(".run")), "--steps", str(args.steps), "--warmup", str(args.warmup),
               *(["--quick"] if args.quick else []), *args.overrides]
    cores = None
    if args.cores_per_gpu:
        available = sorted(os.sched_getaffinity(0))
        if len(available) < gpus * args.cores_per_gpu:
            raise SystemExit(f"--cores-per-gpu {args.cores_per_gpu} x {gpus} GPUs: only {len(available)} cores here")
        cores = available[:gpus * args.cores_per_gpu]
    done = subprocess.run(command, env=env, capture_output=True, text=True,
                          preexec_fn=None if cores is None else lambda: os.sched_setaffinity(0, cores))
    if done.returncode != 0:
        print(f"{name} on {gpus} GPU(s): failed (exit {done.returncode})\n{done.stderr[-3000:]}", file=sys.stderr)
        return None
    return json.loads(out.read_text())


def run_arguments(doc: str, *, stem: str, names: Sequence[str], steps: int, warmup: int,
                  steps_help: str) -> argparse.ArgumentParser:
    """The arguments the training benchmarks share: data root, output folder, architectures, steps, overrides."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, required=True, help="data root (cellseg synth --preset small|medium)")
    parser.add_argument("--out", type=Path, help=f"folder for {stem}.json and .md (default: the record "
                        f"bench/results/{stem}_<hardware>.json and .md; scratch in a temporary folder)")
    parser.add_argument("--names", default=",".join(names), help="architectures, comma-separated")
    parser.add_argument("--steps", type=int, default=steps, help=steps_help)
    parser.add_argument("--warmup", type=int, default=warmup, help="steps before timing")
    parser.add_argument("--quick", action="store_true", help="smoke configs on the CPU (checks the script)")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="applied to every architecture")
    return parser


def run_environment(args: argparse.Namespace) -> dict:
    """GPU, torch, date and the run's settings, as the result files record them."""
    import torch

    return {"gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu", "torch": torch.__version__,
            "date": datetime.date.today().isoformat(), "root": str(args.root), "steps": args.steps,
            "warmup": args.warmup, "overrides": args.overrides}


def main(argv: list[str] | None = None) -> int:
    parser = run_arguments(__doc__, stem="train_e2e", names=NAMES, steps=60, warmup=10,
                           steps_help="timed steps (end to end, then in memory)")
    parser.add_argument("--repeats", type=int, default=2, choices=(1, 2),
                        help="2: a second process per architecture with the compile cache the first left (warm)")
    parser.add_argument("--gpus", default="1", help="GPU counts to run each architecture on, comma-separated "
                        "(1,2: DDP scaling end to end; > 1 launches torchrun)")
    parser.add_argument("--cores-per-gpu", type=int, default=0,
                        help="pin a job on N GPUs to the first N x K cores (0: every core this process may use)")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # the child process: one architecture, JSON to --out
    parser.add_argument("--run-dir", type=Path, help=argparse.SUPPRESS)  # the child's run directory (all ranks)
    args = parser.parse_args(argv)
    if args.one:
        from cellseg.runtime import shutdown_distributed

        row = measure_one(args.one, args.root, args.run_dir, args.steps, args.warmup, args.overrides, args.quick)
        if int(os.environ.get("RANK", "0")) == 0:
            args.out.write_text(json.dumps(row))
        shutdown_distributed()
        return 0
    json_path, md_path = record_paths(args.out, "train_e2e", max(int(g) for g in args.gpus.split(",")))
    env = {**run_environment(args), "cores_per_gpu": args.cores_per_gpu or "all"}
    rows = []
    for name, gpus in ((n, int(g)) for n in args.names.split(",") for g in args.gpus.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            cache = Path(tmp) / "cache"
            row = _child(args, name, gpus, cache, Path(tmp) / "cold.json")
            if row is None:
                continue
            if args.repeats == 2:
                warm = _child(args, name, gpus, cache, Path(tmp) / "warm.json")
                row["first_step_warm_s"] = warm["first_step_s"] if warm else None
                if warm:
                    row.update(startup_warm_s=warm["startup_s"], warm_reused_startup_record=warm["startup_record_reused"],
                               warm_graphs_compiled_at_first_step=warm["graphs_compiled_at_first_step"])
        rows.append(row)
        print(json.dumps(row), flush=True)
        # after every architecture: a run cut short by a scheduler's time limit keeps what it measured
        json_path.write_text(json.dumps({"env": env, "rows": rows, "ddp_efficiency": ddp_efficiency(rows)}, indent=1))
        md_path.write_text(markdown(env, rows))
    print(markdown(env, rows))
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
