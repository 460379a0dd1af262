"""Figure plumbing shared by every figure: creation, PNG writing, EM display, scale bars, legends.

Figures are `matplotlib.figure.Figure` objects created directly, never through `pyplot`: nothing here
selects a backend, registers a figure with a global manager or changes `rcParams`, so importing
`cellseg.viz` has no side effect on other modules or on a notebook's own plotting. PNGs are rendered
by the Agg canvas, which needs no display; in a notebook a returned figure displays itself (as a PNG).

Sizes: a figure is `width_px × height_px` at `DPI`; `save_png` writes exactly that many pixels (no
tight bounding box, so a figure's PNG size is known before it is drawn).
"""

from __future__ import annotations

import io
import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import Colormap
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle
from matplotlib.patheffects import withStroke

DPI = 100
SIZE_EPS = 1e-3  # pixels added to a requested size against float truncation (see new_figure)
EM_CMAP = "gray"
OUTSIDE_COLOR = "#2b1d3a"  # EM voxels outside the imaged volume (NaN): dark violet, unlike any grey
EM_PERCENTILES = (0.5, 99.5)  # contrast stretch, robust to a few saturated voxels
SCALE_BAR_FRACTION = 0.2  # target scale-bar length as a fraction of the panel width
NICE_STEPS = (1, 2, 5)  # scale-bar lengths are 1, 2 or 5 × 10^k nm


class NotebookFigure(Figure):
    """A `Figure` that Jupyter shows as a PNG by itself (IPython's `_repr_png_`): no pyplot, no inline
    backend, no global state needed."""

    def _repr_png_(self) -> bytes:
        buffer = io.BytesIO()
        self.savefig(buffer, format="png", dpi=self.dpi)
        return buffer.getvalue()


def new_figure(width_px: int, height_px: int) -> NotebookFigure:
    """A figure of exactly `width_px × height_px` pixels with constrained layout, on an Agg canvas."""
    if width_px < 16 or height_px < 16:
        raise ValueError(f"figure size {width_px}×{height_px} px is too small (at least 16×16)")
    # Agg truncates inches × dpi to whole pixels; a hair over the exact size survives float rounding
    # (8.7 in × 100 dpi = 869.999...), so the PNG is exactly width_px × height_px.
    fig = NotebookFigure(figsize=((width_px + SIZE_EPS) / DPI, (height_px + SIZE_EPS) / DPI), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def figure_size_px(fig: Figure) -> tuple[int, int]:
    """(width, height) in pixels of the PNG that `save_png` writes for `fig`."""
    width, height = fig.bbox.size  # what the Agg canvas allocates, truncated like it does
    return int(width), int(height)


def check_png(path: str | os.PathLike[str], *, overwrite: bool = False) -> Path:
    """`path` as a PNG to write, checked before any work.

    Raises:
        ValueError: `path` does not end in `.png`.
        FileExistsError: `path` exists and `overwrite` is False.
        FileNotFoundError: the parent directory does not exist.
    """
    path = Path(path)
    if path.suffix.lower() != ".png":
        raise ValueError(f"{path}: figures are written as PNG; give a path ending in .png")
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} exists; pass --overwrite (overwrite=True) to replace it")
    if not path.parent.is_dir():
        raise FileNotFoundError(f"{path.parent}: directory does not exist (for {path.name})")
    return path


def write_atomically(path: Path, write: Callable[[Path], object]) -> Path:
    """`write(tmp)` into a temporary file next to `path`, then a rename: never a half-written `path`."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def save_png(fig: Figure, path: str | os.PathLike[str], *, overwrite: bool = False) -> Path:
    """Render `fig` to a PNG atomically (`check_png`, then `write_atomically`); raises what `check_png` raises."""
    return write_atomically(check_png(path, overwrite=overwrite),
                            lambda tmp: fig.savefig(tmp, format="png", dpi=fig.dpi))


def em_colormap() -> Colormap:
    """Grey colour map that shows NaN (outside the imaged volume) in `OUTSIDE_COLOR`."""
    return colormaps[EM_CMAP].with_extremes(bad=OUTSIDE_COLOR)


def em_limits(em: np.ndarray) -> tuple[float, float]:
    """Display range of an EM slice: robust percentiles of its finite values (0-255 if none)."""
    finite = em[np.isfinite(em)]
    if finite.size == 0:
        return 0.0, 255.0
    lo, hi = np.percentile(finite, EM_PERCENTILES)
    return float(lo), float(max(hi, lo + 1.0))


def show_em(ax: Axes, em: np.ndarray | None, extent_nm: Sequence[float]) -> None:
    """Draw an EM slice (or a neutral background when there is none) in physical coordinates."""
    if em is None:
        ax.set_facecolor("#808080")
        ax.set_xlim(extent_nm[0], extent_nm[1])
        ax.set_ylim(extent_nm[2], extent_nm[3])
        ax.set_aspect("equal")
        return
    lo, hi = em_limits(em)
    ax.imshow(em, cmap=em_colormap(), vmin=lo, vmax=hi, extent=tuple(extent_nm), interpolation="nearest")


def show_rgba(ax: Axes, rgba: np.ndarray, extent_nm: Sequence[float]) -> None:
    """Draw an RGBA overlay over whatever the axes already show."""
    ax.imshow(rgba, extent=tuple(extent_nm), interpolation="nearest")


def bare(ax: Axes) -> None:
    """No ticks or spines: image panels carry a scale bar instead of axes."""
    ax.set_xticks([])
    ax.set_yticks([])
    for spine in ax.spines.values():
        spine.set_visible(False)


def nice_length(target: float) -> float:
    """The largest 1, 2 or 5 × 10^k not above `target` (> 0)."""
    if target <= 0:
        raise ValueError(f"scale-bar target length must be positive, got {target}")
    power = 10.0 ** math.floor(math.log10(target))
    return max(step * power for step in NICE_STEPS if step * power <= target * (1 + 1e-9))


def format_nm(length_nm: float) -> str:
    """`200 nm`, `1 µm`, `2.5 µm`."""
    if length_nm >= 1000:
        return f"{length_nm / 1000:g} µm"
    return f"{length_nm:g} nm"


def scale_bar(ax: Axes, extent_nm: Sequence[float]) -> float:
    """Draw a physical scale bar in the lower right of an image panel; returns its length (nm).

    `extent_nm` is the imshow extent `(left, right, bottom, top)` in nm, as used for the image.
    """
    left, right, bottom, top = (float(v) for v in extent_nm)
    width, height = abs(right - left), abs(top - bottom)
    length = nice_length(width * SCALE_BAR_FRACTION)
    margin, thickness = 0.05 * width, 0.02 * height
    x0 = max(left, right) - margin - length
    # Images use origin "upper" (top < bottom in data units when the y axis is inverted); place the bar
    # near the visual bottom either way.
    y_low = max(bottom, top) - 0.05 * height - thickness
    ax.add_patch(Rectangle((x0, y_low), length, thickness, facecolor="white", edgecolor="black", linewidth=0.5))
    ax.text(x0 + length / 2, y_low - 0.01 * height, format_nm(length), color="white", ha="center", va="bottom",
            fontsize=7, fontweight="bold", path_effects=[withStroke(linewidth=1.5, foreground="black")])
    return length


def legend(ax: Axes, entries: Sequence[tuple[str, object]], *, title: str | None = None, ncols: int = 1) -> None:
    """A legend of coloured patches in an otherwise empty axes (`entries`: label, colour)."""
    ax.axis("off")
    if not entries:
        ax.text(0.5, 0.5, "nothing in view", ha="center", va="center", fontsize=8, transform=ax.transAxes)
        return
    handles = [Patch(facecolor=colour, edgecolor="black", linewidth=0.3, label=label) for label, colour in entries]
    ax.legend(handles=handles, loc="upper left", fontsize=7, title=title, title_fontsize=8, frameon=False,
              ncols=ncols, borderaxespad=0.0)


def read_json_object(path: Path) -> Mapping[str, Any]:
    """A JSON file holding an object (benchmark results, evaluations); clear errors naming the file."""
    try:
        doc = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not JSON ({err.msg} at line {err.lineno})") from None
    if not isinstance(doc, Mapping):
        raise ValueError(f"{path}: expected a JSON object")
    return doc
