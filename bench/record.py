"""Where a benchmark writes its record by default: `bench/results/<bench>_<hardware>` (`.json`, and `.md` where the
benchmark renders one), one record per (benchmark, hardware), so a re-run on the same hardware overwrites it and the
git history keeps the earlier ones."""

from __future__ import annotations

import re
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def hardware(gpus: int | None = None, *, cpu: bool = False) -> str:
    """The hardware part of a record's name: `cpu`, or the GPU kind with the count when above one (`h200`,
    `h200x2`, `h100x4`).

    Args:
        gpus: GPUs the benchmark ran on (default: those visible to this process).
        cpu: the benchmark measures CPU work only (`cpu` whatever GPUs the machine has).
    """
    if cpu:
        return "cpu"
    import torch  # lazy: CPU-only benchmarks never import it

    if not torch.cuda.is_available():
        return "cpu"
    name = torch.cuda.get_device_name(0).removeprefix("NVIDIA ")
    kind = re.search(r"[A-Z]+[0-9]+", name)  # "H200", "H100 80GB HBM3" -> "H100", "A100-SXM4-80GB" -> "A100"
    tag = (kind.group(0) if kind else re.sub(r"[^a-z0-9]+", "", name.lower()) or "gpu").lower()
    count = torch.cuda.device_count() if gpus is None else gpus
    return tag + (f"x{count}" if count > 1 else "")


def record_stem(bench: str, gpus: int | None = None, *, cpu: bool = False) -> Path:
    """`bench/results/<bench>_<hardware>` without its extension (`.json`, `.md`)."""
    return RESULTS / f"{bench}_{hardware(gpus, cpu=cpu)}"


def record_paths(out: Path | None, bench: str, gpus: int | None = None, *, cpu: bool = False) -> tuple[Path, Path]:
    """The (`.json`, `.md`) paths of a benchmark that takes an output folder: `OUT/<bench>.json` when one is given,
    else the record of this hardware in `bench/results/`."""
    stem = Path(out) / bench if out is not None else record_stem(bench, gpus, cpu=cpu)
    stem.parent.mkdir(parents=True, exist_ok=True)
    return stem.with_suffix(".json"), stem.with_suffix(".md")
