"""EM intensities to uint8, explicitly: a stated window, mapped linearly onto 1..255.

cellseg trains and predicts on uint8 EM (the CellMap `fibsem-uint8` arrays) and reads the value 0 as the
padding of "outside the imaged volume" (`data.em_pad_value`; regions of it connected to the volume's edge are
unknown for every class, `data.padding_mask`). So, to keep real dark tissue distinct from padding:

- uint8 input is copied unchanged (its zeros, if any, are counted and reported);
- any other dtype is windowed: `[low, high]` maps linearly onto `[1, 255]`, values outside are clipped,
  NaN becomes 0. The window is either given (`--window`) or the `percentiles` of a sample of the volume
  (`--percentiles`, default 0.1 and 99.9); it is logged and recorded in the root's `import.json`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from cellseg.ingest.readers import Volume

log = logging.getLogger(__name__)
DEFAULT_PERCENTILES = (0.1, 99.9)  # clip the darkest and brightest 0.1 %: outliers, not tissue
SAMPLE_SECTIONS = 32  # sections sampled for the percentiles, evenly spaced in z
SAMPLE_SIDE = 512  # each sampled section is strided down to at most this many voxels per in-plane axis
OUT_LOW, OUT_HIGH = 1, 255  # 0 stays reserved for "no data"


@dataclass(frozen=True, kw_only=True)
class Window:
    """How EM intensities become uint8.

    Attributes:
        low, high: input values mapped to 1 and 255 (None for uint8 input, copied as it is).
        percentiles: the percentiles `low` and `high` were estimated at (None when given explicitly).
        dtype: the input dtype.
    """

    low: float | None
    high: float | None
    percentiles: tuple[float, float] | None
    dtype: str

    @property
    def identity(self) -> bool:
        """True when the input is uint8 and is copied unchanged."""
        return self.low is None

    def describe(self) -> str:
        """One line for the log and the summary."""
        if self.identity:
            return "EM is uint8: copied unchanged"
        where = (f"percentiles {self.percentiles[0]:g}-{self.percentiles[1]:g}" if self.percentiles
                 else "given window")
        return (f"EM {self.dtype} → uint8: [{self.low:.6g}, {self.high:.6g}] ({where}) mapped linearly onto "
                f"[{OUT_LOW}, {OUT_HIGH}], clipped outside; 0 = no data")

    def apply(self, block: np.ndarray) -> np.ndarray:
        """Convert one (z, y, x) block of the input to uint8, a section at a time (bounded float64 memory)."""
        if self.identity:
            return np.asarray(block, dtype=np.uint8)
        assert self.low is not None and self.high is not None
        out = np.empty(block.shape, dtype=np.uint8)
        for z, section in enumerate(block):
            x = np.asarray(section, dtype=np.float64)
            scaled = (x - self.low) * (OUT_HIGH - OUT_LOW) / (self.high - self.low) + OUT_LOW
            scaled = np.rint(np.clip(scaled, OUT_LOW, OUT_HIGH))
            scaled[np.isnan(x)] = 0
            out[z] = scaled
        return out


def _check_dtype(volume: Volume) -> None:
    if volume.dtype == np.bool_ or not (np.issubdtype(volume.dtype, np.integer)
                                        or np.issubdtype(volume.dtype, np.floating)):
        raise ValueError(f"{volume.source}: EM dtype {volume.dtype} is not a number type (integer or float)")


def sample(volume: Volume) -> np.ndarray:
    """Up to `SAMPLE_SECTIONS` evenly spaced sections, strided in-plane, as one flat array."""
    nz, ny, nx = volume.shape
    zs = np.unique(np.linspace(0, nz - 1, min(nz, SAMPLE_SECTIONS)).round().astype(int))
    sy, sx = max(1, -(-ny // SAMPLE_SIDE)), max(1, -(-nx // SAMPLE_SIDE))
    parts = [volume.sections(int(z), int(z) + 1)[:, ::sy, ::sx].ravel() for z in zs]
    return np.concatenate(parts)


def choose_window(volume: Volume, *, percentiles: tuple[float, float] = DEFAULT_PERCENTILES,
                  window: tuple[float, float] | None = None) -> Window:
    """The uint8 conversion of `volume` (module docstring), logged.

    Raises:
        ValueError: a non-numeric dtype, bad percentiles or window, or a constant (or all-NaN) volume.
    """
    _check_dtype(volume)
    if volume.dtype == np.uint8:
        result = Window(low=None, high=None, percentiles=None, dtype="uint8")
    elif window is not None:
        if len(window) != 2 or not window[0] < window[1]:
            raise ValueError(f"--window {window}: needs two values MIN,MAX with MIN < MAX")
        result = Window(low=float(window[0]), high=float(window[1]), percentiles=None, dtype=str(volume.dtype))
    else:
        lo_p, hi_p = check_percentiles(percentiles)
        values = sample(volume).astype(np.float64)
        values = values[np.isfinite(values)]
        if values.size == 0:
            raise ValueError(f"{volume.source}: the sampled EM sections hold no finite values")
        low, high = np.percentile(values, [lo_p, hi_p])
        if not high > low:
            raise ValueError(f"{volume.source}: EM percentiles {lo_p:g}-{hi_p:g} are equal ({low:g}): the volume is "
                             f"(nearly) constant; give --window MIN,MAX")
        result = Window(low=float(low), high=float(high), percentiles=(lo_p, hi_p), dtype=str(volume.dtype))
    log.info("%s", result.describe())
    return result


def check_percentiles(percentiles: tuple[float, ...]) -> tuple[float, float]:
    """Validate `--percentiles LOW,HIGH` (0 <= LOW < HIGH <= 100)."""
    if len(percentiles) != 2 or not 0 <= percentiles[0] < percentiles[1] <= 100:
        raise ValueError(f"--percentiles {tuple(percentiles)}: needs two values LOW,HIGH with 0 <= LOW < HIGH <= 100")
    return float(percentiles[0]), float(percentiles[1])
