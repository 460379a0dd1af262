"""The rules both official scoring eras share or differ on, as constants and one-line formulas.

Everything here is restated from the official evaluators (CSC `evaluate.py` as it stood 2025-04 to
2025-11 for "2025", `utils/eval_utils/*` + `utils/matched_crop.py` of 2026 for "2026"); see
`docs/scoring.md` for the full list of rules and quirks. The eras themselves, with their names and titles,
are the modules of `cellseg.eval.eras`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

# The official INSTANCE_CLASSES list decides the scoring branch in both eras. `vim` and `instance` are in
# it although no test manifest lists them; any other label name (including `<label>_mask` arrays of the
# truth, quirk 1 of docs/scoring.md) is scored semantically.
OFFICIAL_INSTANCE_LABELS: frozenset[str] = frozenset(
    {"nuc", "vim", "ves", "endo", "lyso", "ld", "perox", "mito", "np", "mt", "cell", "instance"}
)
MASK_SUFFIX = "_mask"

# 2025: an instance crop with more than 50 predicted objects per truth object scores 0 everywhere.
RATIO_CUTOFF_2025 = 50.0
# 2026: dynamic cutoff 10 + 50·exp(−nG/5); a crop above it is skipped (contributes nothing).
RATIO_FINAL_2026, RATIO_INITIAL_2026, RATIO_DECAY_2026 = 10.0, 50.0, 5.0
MAX_OVERLAP_EDGES_2026 = 5_000_000
COST_SCALE_2026 = 1_000_000  # matching cost int((1 − IoU)·scale); "unmatched" costs scale + 1
MAX_VOLUME_SIZE_RATIO_2026 = 16.0**3  # source voxels / target voxels above this: the 2026 loader refuses
CHUNKED_LOAD_BYTES_2026 = 500 * 1024 * 1024  # source voxels × 4 bytes above this: chunked down-sampling
CHUNK_TARGET_BYTES_2026 = 100 * 1024 * 1024  # per chunk, as float32 voxels
SEMANTIC_THRESHOLD = 0.5  # after linear resampling only; without resampling the threshold is > 0


def is_scored_as_instance(label: str) -> bool:
    """True when the official evaluators score `label` with the instance branch."""
    return label in OFFICIAL_INSTANCE_LABELS


def ratio_cutoff_2026(num_truth: int) -> float:
    """The 2026 instance-count cutoff for `num_truth` truth objects (≈ 50.9 at 1, 28.4 at 5, → 10)."""
    return float(RATIO_FINAL_2026 + RATIO_INITIAL_2026 * np.exp(-num_truth / RATIO_DECAY_2026))


def max_distance_2026(voxel_size_nm: Sequence[float], shape_vox: Sequence[int]) -> float:
    """The 2026 Hausdorff cap: half the smallest physical side of the crop (nm)."""
    return float(min((float(v) * int(s)) / 2 for v, s in zip(voxel_size_nm, shape_vox, strict=True)))


def voxel_norm(voxel_size_nm: Sequence[float]) -> np.float64:
    """‖voxel size‖₂ in nm, the length scale of the Hausdorff normalisation (same call as the official)."""
    return np.linalg.norm(voxel_size_nm)


def normalized_distance_2025(mean_distance_nm: float, voxel_size_nm: Sequence[float]) -> float:
    """2025: `1.01 ** (−d / ‖vs‖)` of the crop's mean Hausdorff distance (inf → 0)."""
    return 1.01 ** (-mean_distance_nm / voxel_norm(voxel_size_nm))


def normalized_distances_2026(distances_nm: np.ndarray, voxel_size_nm: Sequence[float]) -> np.ndarray:
    """2026: per-instance `1.01 ** (−d / ‖vs‖)` on distances already rounded to float32."""
    return 1.01 ** (-np.asarray(distances_nm, dtype=np.float64) / voxel_norm(voxel_size_nm))


def geometric_mean(a: float, b: float) -> float:
    """`(a·b) ** 0.5`, written exactly as the official code writes it (same rounding)."""
    return (a * b) ** 0.5


def nan_to_none(value: float | int | None) -> float | int | None:
    """JSON cannot hold NaN/inf; the official JSON writes them as null, and so do we."""
    if value is None:
        return None
    if isinstance(value, float | np.floating) and not math.isfinite(float(value)):
        return None
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    return value
