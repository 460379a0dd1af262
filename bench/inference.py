"""Inference throughput per architecture: our `predict_volume` (TTA 1 and 8) vs MONAI's sliding window.

For each architecture, one randomly initialised model (``build_model`` with ``--preset``, the preset's
patch, ``--out-channels`` outputs: by default the 48 classes of ``configs/data/cellmap.yaml`` plus their
boundary channels) predicts one random uint8 EM volume of ``--size``³ voxels at 8 nm:

* ours: ``cellseg.infer.engine.predict_volume``, exactly what ``cellseg predict`` runs per crop: EM read
  from an OME-NGFF zarr with half a patch of context on every side, Gaussian blending (``--overlap``,
  default 0.5 as the CLI), batched tiles, bf16 autocast and channels-last on CUDA (fp32 on CPU), sigmoid,
  result back in host memory; with 1 and with 8 test-time transforms.
* MONAI: ``monai.inferers.sliding_window_inference`` on the same volume already in memory, overlap 0.25,
  constant blending, fp32 (PyTorch's default TF32 settings), contiguous memory, then sigmoid and copy to
  host (float32; ours copies float16, what `cellseg predict` stores). No context margin (so it predicts fewer voxels than ours for the same output).

Throughput is output Mvox/s (``size``³ / seconds; ``processed_mvox_per_s`` counts our context too), after
one untimed warm-up pass per setting (cuDNN autotuning). A row "ours tta1 ov0.25" runs ours at MONAI's
overlap, to tell the engine from the overlap. 2D models predict slice by slice across z in both. Failures (e.g. out of memory) are recorded,
not fatal. Writes ``--out`` (JSON) and prints a markdown table.

Usage (GPU):  python -m bench.inference --out bench/out/inference.json
Smoke (CPU):  python -m bench.inference --models unet_3d --preset tiny --size 64 --device cpu
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from bench.record import record_stem
from cellseg import runtime
from cellseg.data.arrays import MultiscaleImage
from cellseg.data.grid import Grid
from cellseg.data.write import write_multiscale
from cellseg.infer import tta
from cellseg.infer.engine import Window, predict_volume
from cellseg.models import build_model, list_models
from cellseg.runtime.compile import CompiledModel

REPO = Path(__file__).resolve().parents[1]

VOXEL_SIZE_NM = (8.0, 8.0, 8.0)
MONAI_OVERLAP = 0.25  # MONAI's default, as the baseline is specified


def default_out_channels() -> int:
    """Channels of the full challenge model: the classes of configs/data/cellmap.yaml plus boundary channels."""
    import yaml

    from cellseg.config.schema import DataConfig

    classes = yaml.safe_load((REPO / "configs" / "data" / "cellmap.yaml").read_text())["data"]["classes"]
    return DataConfig(root=".", classes=tuple(classes)).num_target_channels


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options (see ``--help``)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n")[-1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", help="comma-separated architectures (default: all registered)")
    parser.add_argument("--preset", default="default", choices=("default", "tiny"), help="model preset")
    parser.add_argument("--size", type=int, default=256, help="edge of the cubic EM volume in voxels (default 256)")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--batch-size", type=int, default=None,
                        help="tiles per forward pass for both (default: 4 for 3D, 32 for 2D models)")
    parser.add_argument("--overlap", type=float, default=0.5, help="our overlap (default 0.5, as cellseg predict)")
    parser.add_argument("--tta", default="1,8", help="our TTA counts to measure (default 1,8)")
    parser.add_argument("--out-channels", type=int, default=None,
                        help="model outputs (default: the 48 challenge classes + boundary channels)")
    parser.add_argument("--no-monai", action="store_true", help="skip the MONAI baseline")
    parser.add_argument("--compile", action="store_true",
                        help="also measure ours with the model compiled (TTA 1 and 8; as `cellseg predict` on CUDA)")
    parser.add_argument("--keep", type=int, nargs="*", default=[], metavar="K",
                        help="with --compile: also TTA 8 keeping only K output channels (a test crop's scored set)")
    parser.add_argument("--out", type=Path, help="JSON output (default: bench/results/inference_<hardware>.json)")
    parser.add_argument("--merge", type=Path, nargs="+", metavar="JSON",
                        help="combine the rows of earlier runs (e.g. one per model, each under its own timeout) "
                             "into --out and print the table; nothing is measured")
    return parser.parse_args(argv)


def sync(device: torch.device) -> None:
    """Wait for queued GPU work (no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_run(fn: Callable[[], object], device: torch.device) -> dict[str, float]:
    """One warm-up call (compilation, autotuning), then one timed call: seconds and peak GPU memory of the timed
    call, and the warm-up's seconds."""
    start = time.perf_counter()
    fn()
    sync(device)
    warmup = time.perf_counter() - start
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    fn()
    sync(device)
    out = {"seconds": time.perf_counter() - start, "warmup_seconds": warmup}
    if device.type == "cuda":
        out["peak_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    return out


def write_volume(root: Path, size: int) -> tuple[MultiscaleImage, np.ndarray, Grid]:
    """A random uint8 EM volume (seed 0) as an OME-NGFF group, the array itself, and its grid."""
    data = np.random.default_rng(0).integers(0, 256, size=(size,) * 3, dtype=np.uint8)
    translation = tuple(v / 2 for v in VOXEL_SIZE_NM)  # voxel centres; the box starts at 0 nm
    write_multiscale(root / "em", data, voxel_size_nm=VOXEL_SIZE_NM, translation_nm=translation, kind="em",
                     num_levels=1)
    grid = Grid(translation_nm=translation, shape_vox=(size,) * 3, voxel_size_nm=VOXEL_SIZE_NM)  # type: ignore[arg-type]
    return MultiscaleImage(str(root / "em"), backend="tensorstore", expected_dtype="uint8"), data, grid


def ours(model: torch.nn.Module, em: MultiscaleImage, grid: Grid, *, patch: tuple[int, ...], outputs: int,
         device: torch.device, batch: int, overlap: float, n_tta: int, compiled: bool = False,
         keep: int | None = None) -> dict[str, float]:
    """Our engine: bf16 + channels-last on CUDA, fp32 on CPU; Gaussian blending; `n_tta` transforms; the model
    under torch.compile (`compiled`, as `cellseg predict --compile auto` on CUDA); the first `keep` outputs only
    (as a test crop's scored channels)."""
    spec = model.spec
    tfms = tta.transforms(spec.spatial_dims, spec.tta_axes, n_tta, transpose_axes=spec.tta_transpose_axes)
    precision = "bf16" if device.type == "cuda" else "fp32"
    runtime.configure_backends(tf32=True, cudnn_benchmark=True)  # as training and `cellseg predict`
    model.to(memory_format=runtime.memory_format(spec.spatial_dims, device.type == "cuda"))

    net = CompiledModel(model) if compiled else None

    def run() -> object:
        window = Window(patch_vox=tuple(patch), device=device, precision=precision, overlap=overlap,
                        batch_size=batch, transforms=tuple(tfms), channels_last=True, compiled=net)
        return predict_volume(model, em, grid, window, num_outputs=outputs,
                              dtype=torch.float16,  # as `cellseg predict` keeps them
                              keep=None if keep is None else list(range(keep)))

    result = timed_run(run, device)
    return {**result, "tta": len(tfms), "precision": precision, "overlap": overlap, "blend": "gaussian",
            "compiled": bool(net and net.compiled_ok), "kept_channels": keep or outputs}


def monai(model: torch.nn.Module, data: np.ndarray, *, patch: tuple[int, ...], device: torch.device,
          batch: int) -> dict[str, float]:
    """MONAI's sliding window: overlap 0.25, constant blending, fp32, contiguous memory, PyTorch defaults."""
    from monai.inferers import sliding_window_inference

    torch.backends.cuda.matmul.allow_tf32 = False  # PyTorch's defaults
    torch.backends.cudnn.allow_tf32 = True
    model.to(memory_format=torch.contiguous_format)
    is_2d = model.spec.spatial_dims == 2

    def predictor(x: torch.Tensor) -> torch.Tensor:
        return model(x[:, :, 0])[:, :, None] if is_2d else model(x)

    @torch.inference_mode()
    def run() -> object:
        image = torch.from_numpy(data)[None, None].to(device).float() / 255.0
        logits = sliding_window_inference(image, roi_size=patch, sw_batch_size=batch, predictor=predictor,
                                          overlap=MONAI_OVERLAP, mode="constant")
        return torch.sigmoid(logits)[0].cpu().numpy()

    result = timed_run(run, device)
    return {**result, "precision": "fp32", "overlap": MONAI_OVERLAP, "blend": "constant"}


def bench_model(name: str, args: argparse.Namespace, volume: tuple[MultiscaleImage, np.ndarray, Grid],
                device: torch.device, outputs: int) -> list[dict]:
    """Every setting of one architecture; a failure becomes a row with its error."""
    torch.manual_seed(0)
    model = build_model(name, 1, outputs, preset=args.preset).to(device).eval()
    spec = model.spec
    patch = tuple(spec.default_patch_vox) if spec.spatial_dims == 3 else (1, *spec.default_patch_vox)
    batch = args.batch_size or (4 if spec.spatial_dims == 3 else 32)
    em, data, grid = volume
    voxels = float(np.prod(grid.shape_vox))
    # Ours also predicts half a patch of context around the volume (as `cellseg predict` does around a crop).
    context = [0 if p == 1 else p // 2 for p in patch]
    processed = float(np.prod([n + 2 * m for n, m in zip(grid.shape_vox, context, strict=True)]))
    common = {"model": name, "preset": args.preset, "patch_vox": list(patch), "batch_size": batch,
              "size_vox": args.size, "out_channels": outputs}
    def our_setting(n_tta: int, overlap: float, compiled: bool = False, keep: int | None = None
                    ) -> Callable[[], dict]:
        return lambda: ours(model, em, grid, patch=patch, outputs=outputs, device=device, batch=batch,
                            overlap=overlap, n_tta=n_tta, compiled=compiled, keep=keep)

    settings = [(f"ours tta{n}", our_setting(n, args.overlap)) for n in (int(t) for t in args.tta.split(","))]
    if args.compile:
        settings += [(f"ours tta{n} compiled", our_setting(n, args.overlap, True)) for n in (1, 8)]
        settings += [(f"ours tta8 compiled {k} ch", our_setting(8, args.overlap, True, k)) for k in args.keep]
    if args.overlap != MONAI_OVERLAP:  # separates the engine from the choice of overlap
        settings.append((f"ours tta1 ov{MONAI_OVERLAP:g}", our_setting(1, MONAI_OVERLAP)))
    if not args.no_monai:
        settings.append(("monai", lambda: monai(model, data, patch=patch, device=device, batch=batch)))
    rows = []
    for label, fn in settings:
        try:
            result = fn()
            read = processed if label.startswith("ours") else voxels
            row = {**common, "setting": label, **result, "mvox_per_s": voxels / 1e6 / result["seconds"],
                   "processed_mvox_per_s": read / 1e6 / result["seconds"]}
        except (RuntimeError, ValueError) as err:  # OOM and shape errors are results too
            row = {**common, "setting": label, "error": f"{type(err).__name__}: {str(err)[:300]}"}
            if device.type == "cuda":
                torch.cuda.empty_cache()
        rows.append(row)
        print(f"  {name:<10} {label:<16} " + (f"{row['mvox_per_s']:8.3f} Mvox/s ({row['seconds']:.2f} s)"
                                             if "error" not in row else row["error"][:120]), flush=True)
    return rows


def table(rows: list[dict]) -> str:
    """Markdown: one line per architecture, Mvox/s per setting and our speed-up over MONAI."""
    settings = list(dict.fromkeys(r["setting"] for r in rows))
    lines = ["| model | patch | batch | " + " | ".join(f"{s} Mvox/s" for s in settings) + " | best ours tta1 / monai |",
             "|---|---|---|" + "---|" * len(settings) + "---|"]
    for name in dict.fromkeys(r["model"] for r in rows):
        mine = {r["setting"]: r for r in rows if r["model"] == name}
        first = next(iter(mine.values()))
        cells = [f"{mine[s]['mvox_per_s']:.3g}" if "mvox_per_s" in mine.get(s, {}) else "error" for s in settings]
        ratio = "-"
        best = max((mine[s]["mvox_per_s"] for s in ("ours tta1", "ours tta1 compiled") if "mvox_per_s" in mine.get(s, {})),
                   default=None)
        if best and "mvox_per_s" in mine.get("monai", {}):
            ratio = f"{best / mine['monai']['mvox_per_s']:.2f}x"
        patch = "×".join(str(p) for p in first["patch_vox"])
        lines.append(f"| {name} | {patch} | {first['batch_size']} | " + " | ".join(cells) + f" | {ratio} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark, write JSON, print the table."""
    args = parse_args(argv)
    if args.merge:
        return merge(args.merge, args.out or record_stem("inference").with_suffix(".json"))
    args.out = args.out or record_stem("inference").with_suffix(".json")
    use_cuda = torch.cuda.is_available() if args.device == "auto" else args.device == "cuda"
    device = torch.device("cuda" if use_cuda else "cpu")
    names = args.models.split(",") if args.models else list_models()
    unknown = sorted(set(names) - set(list_models()))
    if unknown:
        raise SystemExit(f"unknown models {unknown}; choose from {list_models()}")
    outputs = args.out_channels or default_out_channels()
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="cellseg-bench-inference-") as tmp:
        volume = write_volume(Path(tmp), args.size)
        print(f"{args.size}³ random EM, {outputs} output channels, {device}", flush=True)
        for name in names:
            rows.extend(bench_model(name, args, volume, device, outputs))
    report = {"benchmark": "inference", "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
              "device": torch.cuda.get_device_name(device) if use_cuda else platform.processor() or "cpu",
              "cpu_threads": torch.get_num_threads(), "torch": torch.__version__, "args": vars(args) | {"out": str(args.out)},
              "rows": rows}
    write_report(report, args.out)
    return 0


def write_report(report: dict, out: Path) -> None:
    """Write the JSON atomically and print the table."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp_out = out.with_name(f".{out.name}.tmp")
    tmp_out.write_text(json.dumps(report, indent=1))
    tmp_out.replace(out)
    print()
    print(table(report["rows"]))
    print(f"\nwrote {out}")


def merge(paths: list[Path], out: Path) -> int:
    """One report from several runs' JSON files (their rows in order; the first run's header)."""
    reports = [json.loads(p.read_text()) for p in paths if p.is_file()]
    missing = [str(p) for p in paths if not p.is_file()]
    if not reports:
        raise SystemExit(f"--merge: none of {[str(p) for p in paths]} exists")
    merged = {**reports[0], "rows": [row for r in reports for row in r["rows"]], "merged_from": [str(p) for p in paths],
              "missing": missing}
    write_report(merged, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
