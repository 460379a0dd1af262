"""Slice figures: a crop with class overlays, a group against its atoms, truth against a prediction.

Every image panel is drawn in physical coordinates (nm), so anisotropic voxels keep their true aspect,
and carries a scale bar. Colours come from `cellseg.viz.palette` (fixed per class; objects seeded by id).
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from matplotlib.axes import Axes
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from cellseg.classes import get_class
from cellseg.viz.figure import bare, legend, new_figure, scale_bar, show_em, show_rgba
from cellseg.viz.overlay import FILL_ALPHA, error_counts, error_rgba, instance_rgba, semantic_rgba, stack_rgba
from cellseg.viz.palette import CLASS_COLORS, ERROR_COLORS
from cellseg.viz.slices import CropSlice, PredictionSlice
from cellseg.viz.sources import Plane

PANEL_PX = 320  # longer side of an image panel, pixels
MIN_PANEL_PX = 96  # below this, panel titles leave constrained layout no room for the image
TITLE_PX = 40  # figure title band
PANEL_TITLE_PX = 34  # a panel's title: up to TITLE_LINES lines
TITLE_LINES = 2
TITLE_CHAR_PX = 7  # width of a title character at 8 pt and 100 dpi (generous)
LEGEND_CHAR_PX = 6  # width of one legend character at the legend's 7 pt font (generous)
LEGEND_PATCH_PX = 40  # colour patch and padding of a legend column
LEGEND_ROW_PX = 18  # height of one legend entry (generous)
LEGEND_ROWS = 22  # legend entries per column before a second column starts
MAX_ATOM_PANELS = 8  # group figures: atoms beyond this appear only in the combined panel
UNKNOWN_ALPHA = 0.6  # grey veil over unannotated pixels in truth panels


def _panel_shape(plane: Plane, panel_px: int) -> tuple[int, int]:
    """(width, height) in pixels of one image panel with the slice's physical aspect ratio."""
    left, right, bottom, top = plane.extent_nm
    width_nm, height_nm = abs(right - left), abs(bottom - top)
    if width_nm >= height_nm:
        return panel_px, max(48, round(panel_px * height_nm / width_nm))
    return max(48, round(panel_px * width_nm / height_nm)), panel_px


@dataclass(frozen=True)
class _Layout:
    """A figure of image panels on one plane, each `panel_width_px` wide, and an optional legend axes."""

    fig: Figure
    axes: list[list[Axes]]
    legend_ax: Axes | None
    plane: Plane
    panel_width_px: int

    def draw(self, ax: Axes, em: np.ndarray | None, title: str, layers: Sequence[np.ndarray] = ()) -> None:
        """EM, then the RGBA layers, a wrapped title and a scale bar."""
        show_em(ax, em, self.plane.extent_nm)
        for layer in layers:
            show_rgba(ax, layer, self.plane.extent_nm)
        bare(ax)
        ax.set_title(fit_title(title, self.panel_width_px), fontsize=8)
        scale_bar(ax, self.plane.extent_nm)


def _layout(plane: Plane, *, rows: int, cols: int, panel_px: int, legend: Sequence[str] = (), legend_cols: int = 1
            ) -> _Layout:
    """`rows × cols` image panels plus, when `legend` lists labels (the title first), a legend column on
    the right wide enough for them."""
    if panel_px < MIN_PANEL_PX:
        raise ValueError(f"panel size {panel_px} px is too small for titles and scale bars (at least {MIN_PANEL_PX})")
    width, height = _panel_shape(plane, panel_px)
    longest = max((len(label) for label in legend), default=0)
    legend_px = legend_cols * (longest * LEGEND_CHAR_PX + LEGEND_PATCH_PX) if legend else 0
    legend_height = math.ceil(len(legend) / legend_cols) * LEGEND_ROW_PX + LEGEND_ROW_PX
    fig = new_figure(cols * width + legend_px + 20, max(rows * (height + PANEL_TITLE_PX), legend_height) + TITLE_PX)
    ratios = [width] * cols + ([legend_px] if legend else [])
    grid = fig.add_gridspec(rows, len(ratios), width_ratios=ratios)
    axes = [[fig.add_subplot(grid[r, c]) for c in range(cols)] for r in range(rows)]
    legend_ax = fig.add_subplot(grid[:, cols]) if legend else None
    return _Layout(fig=fig, axes=axes, legend_ax=legend_ax, plane=plane, panel_width_px=width)


def fit_title(title: str, width_px: int) -> str:
    """Wrap a panel title to `width_px`, at most `TITLE_LINES` lines (the last shortened with "[...]"):
    a title wider than its panel makes constrained layout squeeze the images to nothing."""
    chars = max(8, int(width_px / TITLE_CHAR_PX))
    lines = textwrap.wrap(title, width=chars)
    if len(lines) > TITLE_LINES:
        lines = [*lines[:TITLE_LINES - 1], textwrap.shorten(" ".join(lines[TITLE_LINES - 1:]), width=chars)]
    return "\n".join(lines)


def draw_order(names: Sequence[str]) -> list[str]:
    """Classes covering more atoms first (cell, nuc, er ...), atoms last, so fine structure stays on top."""
    return sorted(names, key=lambda n: (-len(get_class(n).atom_ids), get_class(n).id))


def _legend_columns(n: int) -> int:
    return max(1, math.ceil(n / LEGEND_ROWS))


def num_objects(ids: np.ndarray) -> int:
    """Distinct non-zero ids."""
    return len(np.unique(ids[ids != 0]))


def _in_view(s: CropSlice, names: Sequence[str]) -> list[str]:
    return [n for n in names if s.masks[n].any()]


def _instance_layer(s: CropSlice, names: Sequence[str], *, seed: int, outlines: bool) -> np.ndarray | None:
    """All instance classes with ids, largest classes underneath; each class its own colour sequence."""
    layers = [instance_rgba(s.ids[n], seed=seed + get_class(n).id, outlines=outlines)
              for n in draw_order(names) if n in s.ids]
    return stack_rgba(layers) if layers else None


def crop_figure(s: CropSlice, *, instances: bool = True, outlines: bool = False, seed: int = 0,
                panel_px: int = PANEL_PX) -> Figure:
    """EM | EM + class colours | EM + object colours (when an instance class with ids is shown), and a
    legend of the classes in view.

    Args:
        s: the slice (`load_crop_slice`).
        instances: add the object panel.
        outlines: draw class borders opaque on the class panel (objects always get outlines).
        seed: colour seed of the object panel (same seed, same colours).
        panel_px: longer side of each image panel, pixels.
    """
    visible = _in_view(s, s.classes)
    inst = [n for n in s.classes if n in s.ids] if instances else []
    entries = [(n, CLASS_COLORS[n]) for n in sorted(visible, key=lambda n: get_class(n).id)]
    lay = _layout(s.plane, rows=1, cols=2 + bool(inst), panel_px=panel_px,
                  legend=["class", "nothing in view", *visible], legend_cols=_legend_columns(len(visible)))
    em_ax, classes_ax, *objects_ax = lay.axes[0]
    lay.draw(em_ax, s.em, "EM" if s.em is not None else "EM (not available)")
    layer = semantic_rgba({n: s.masks[n] for n in draw_order(s.classes)}, outlines=outlines)
    lay.draw(classes_ax, s.em, f"classes: {len(visible)} of {len(s.classes)} in view", [layer])
    if inst:
        counts = ", ".join(f"{n} {num_objects(s.ids[n])}" for n in inst if s.ids[n].any())
        lay.draw(objects_ax[0], s.em, f"objects: {counts or 'none in view'}",
                 [_instance_layer(s, inst, seed=seed, outlines=True)])
    assert lay.legend_ax is not None
    legend(lay.legend_ax, entries, title="class", ncols=_legend_columns(len(visible)))
    lay.fig.suptitle(s.title(), fontsize=9)
    return lay.fig


def group_figure(s: CropSlice, *, panel_px: int = PANEL_PX) -> Figure:
    """A group class against its atoms: the group | each atom | all atoms in their colours with the
    group's outline. `s` holds the group first, then its atoms (`load_group_slice`).

    The combined panel's title counts pixels where the group differs from the union of its atoms (a
    group annotated where its atoms were not, or an inconsistency).
    """
    group, atoms = s.classes[0], list(s.classes[1:])
    if not atoms or not get_class(group).is_group:
        raise ValueError(f"group_figure needs a group and its atoms; got {list(s.classes)} (use load_group_slice)")
    # Atom panels only for atoms in view (the largest `MAX_ATOM_PANELS`); the legend names the others.
    in_view = [a for a in atoms if s.masks[a].any()]
    largest = set(sorted(in_view, key=lambda a: -int(s.masks[a].sum()))[:MAX_ATOM_PANELS])
    shown = [a for a in in_view if a in largest]
    panels = 2 + len(shown)
    cols = min(panels, 4)
    title = f"{group} and its atoms"
    entries = [(n if n in in_view or n == group else f"{n} (not in view)", CLASS_COLORS[n]) for n in [group, *atoms]]
    lay = _layout(s.plane, rows=math.ceil(panels / cols), cols=cols, panel_px=panel_px,
                  legend=[title, *(label for label, _ in entries)])
    flat = [ax for row in lay.axes for ax in row]
    lay.draw(flat[0], s.em, f"{group} (group)", [semantic_rgba({group: s.masks[group]})])
    for ax, atom in zip(flat[1:], shown, strict=False):
        lay.draw(ax, s.em, atom, [semantic_rgba({atom: s.masks[atom]})])
    differ = int((np.logical_or.reduce([s.masks[a] for a in atoms]) != s.masks[group]).sum())
    combined = stack_rgba([semantic_rgba({a: s.masks[a] for a in atoms}, alpha=0.7),
                           semantic_rgba({group: s.masks[group]}, alpha=0.0, outlines=True)])
    lay.draw(flat[len(shown) + 1], s.em, f"atoms, {group} outline: {differ} px differ", [combined])
    for ax in flat[panels:]:
        ax.axis("off")
    assert lay.legend_ax is not None
    legend(lay.legend_ax, entries, title=title)
    lay.fig.suptitle(s.title(), fontsize=9)
    return lay.fig


def _prediction_layer(p: PredictionSlice, name: str, *, seed: int) -> np.ndarray:
    values = p.prediction[name]
    if p.kind == "probabilities":
        rgba = np.zeros((*values.shape, 4))
        rgba[..., :3] = to_rgb(CLASS_COLORS[name])
        rgba[..., 3] = np.clip(values, 0.0, 1.0) * 0.9  # opacity = probability
        return rgba
    if p.has_ids(name):
        return instance_rgba(values, seed=seed + get_class(name).id)
    return semantic_rgba({name: values != 0})


def _truth_layers(t: CropSlice, name: str, *, seed: int, objects: bool) -> list[np.ndarray]:
    """Truth fill (objects when the prediction has ids too, else the class colour) and a grey veil over
    unannotated pixels."""
    fill = (instance_rgba(t.ids[name], seed=seed + get_class(name).id) if objects and name in t.ids
            else semantic_rgba({name: t.masks[name]}))
    veil = np.zeros((*fill.shape[:2], 4))
    veil[~t.known[name]] = (*to_rgb(ERROR_COLORS["unknown"]), UNKNOWN_ALPHA)
    return [fill, veil]


def prediction_figure(p: PredictionSlice, *, seed: int = 0, panel_px: int = 240) -> Figure:
    """One row per class: EM | truth | prediction | errors (false positives red, false negatives blue,
    unannotated grey). Without truth, only the prediction column. Probabilities show as opacity."""
    if not p.classes:
        raise ValueError(f"{p.store}/{p.crop}: no classes to show")
    t = p.truth
    lay = _layout(p.plane, rows=len(p.classes), cols=4 if t is not None else 1, panel_px=panel_px)
    what = "p" if p.kind == "probabilities" else "labels"
    for row, name in zip(lay.axes, p.classes, strict=True):
        pred = _prediction_layer(p, name, seed=seed)
        if t is None:
            lay.draw(row[0], None, f"{name}: prediction ({what})", [pred])
            continue
        counts = error_counts(t.masks[name], p.foreground(name), t.known[name])
        union = counts["tp"] + counts["fp"] + counts["fn"]
        iou = f"{counts['tp'] / union:.2f}" if union else "n/a"
        lay.draw(row[0], t.em, f"{name}: EM")
        lay.draw(row[1], t.em, f"{name}: truth", _truth_layers(t, name, seed=seed, objects=p.has_ids(name)))
        lay.draw(row[2], t.em, f"{name}: prediction ({what})", [pred])
        lay.draw(row[3], t.em, f"FP {counts['fp']} · FN {counts['fn']} · IoU {iou}",
                 [error_rgba(t.masks[name], p.foreground(name), t.known[name])])
    if t is not None:
        handles = [Patch(facecolor=ERROR_COLORS[k], edgecolor="black", linewidth=0.3, label=label)
                   for k, label in (("tp", "agree"), ("fp", "false positive"), ("fn", "false negative"),
                                    ("unknown", "not annotated"))]
        lay.fig.legend(handles=handles, loc="outside lower center", ncols=4, fontsize=7, frameon=False)
    threshold = f" · foreground p > {p.threshold:g}" if p.kind == "probabilities" else ""
    lay.fig.suptitle(p.title() + threshold, fontsize=9)
    return lay.fig


__all__ = ["FILL_ALPHA", "crop_figure", "draw_order", "fit_title", "group_figure", "num_objects", "prediction_figure"]
