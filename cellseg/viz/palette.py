"""Colours: a fixed colour per CellMap class, seeded colours per object id, colours for score kinds.

The class palette is a literal table so that a class has the same colour in every figure, notebook and
document. Families share a hue and the group is the middle shade: `mito` orange with `mito_mem` darker
and `mito_lum` lighter; the ER greens; nuclear envelope and pores blues/cyans; chromatin violets;
vesicles pink; endosomes purple; lysosomes brown; lipid droplets yellow; microtubules red; peroxisomes
olive; Golgi gold. Large background-like classes (`ecs`, `cyto`, `cell`) get pale colours.

Object ids (instance classes) get colours that depend only on `(id, seed)`, never on which other ids
are in view, so an object keeps its colour across slices and panels: the hue steps by the golden ratio
per id (neighbouring ids, which connected-component labelling gives to nearby objects, differ most)
and saturation/value come from an integer hash of the id.
"""

from __future__ import annotations

import numpy as np
from matplotlib.colors import hsv_to_rgb, to_rgb

CLASS_COLORS: dict[str, str] = {
    # cell, extracellular space, plasma membrane, cytosol
    "ecs": "#80b1d3", "pm": "#e7298a", "cyto": "#ffffcc", "cell": "#e5d8bd",
    # mitochondria (orange)
    "mito": "#ff7f00", "mito_mem": "#d94801", "mito_lum": "#fdae6b", "mito_ribo": "#7f2704",
    # Golgi (gold)
    "golgi": "#e6ab02", "golgi_mem": "#b8860b", "golgi_lum": "#ffe066",
    # vesicles (pink)
    "ves": "#f781bf", "ves_mem": "#c51b7d", "ves_lum": "#fbb4d9",
    # endosomes (purple)
    "endo": "#984ea3", "endo_mem": "#6a3d9a", "endo_lum": "#cab2d6",
    # lysosomes (brown)
    "lyso": "#a65628", "lyso_mem": "#7f3b08", "lyso_lum": "#d8a47f",
    # lipid droplets (yellow)
    "ld": "#ffff33", "ld_mem": "#c7c700", "ld_lum": "#ffff99",
    # endoplasmic reticulum and exit sites (greens, teal)
    "er": "#33a02c", "er_mem": "#006d2c", "er_lum": "#a1d99b", "er_mem_all": "#41ab5d",
    "eres": "#1b9e77", "eres_mem": "#00695c", "eres_lum": "#80cbc4",
    # nuclear envelope (blues) and pores (cyans)
    "ne": "#3182bd", "ne_mem": "#08519c", "ne_lum": "#9ecae1", "ne_mem_all": "#2171b5",
    "np": "#17becf", "np_out": "#0e8a96", "np_in": "#9edae5",
    # nucleus, chromatin (violets), nucleoplasm, nucleolus
    "nuc": "#1f3a93", "chrom": "#756bb1", "hchrom": "#54278f", "nhchrom": "#3f007d",
    "echrom": "#bcbddc", "nechrom": "#dadaeb", "nucpl": "#6baed6", "nucleo": "#4a1486",
    # microtubules (red)
    "mt": "#e31a1c", "mt_out": "#b10026", "mt_in": "#fc9272",
    # peroxisomes (olive)
    "perox": "#808000", "perox_mem": "#556b2f", "perox_lum": "#bcbd22",
    # centrosome (greys)
    "cent_all": "#000000", "cent": "#252525", "cent_dapp": "#525252", "cent_sdapp": "#737373",
    # insulin secretory granules (rose)
    "isg": "#fb9a99", "isg_mem": "#dd3497", "isg_lum": "#fcc5c0", "isg_ins": "#ae017e",
    # chloroplasts (leaf greens), vacuoles (lilac), yolk (amber)
    "chlor": "#4daf4a", "chlor_mem": "#238b45", "chlor_lum": "#74c476", "chlor_sg": "#c7e9c0",
    "vac": "#8c6bb1", "vac_mem": "#88419d", "vac_lum": "#d4b9da",
    "yolk": "#fec44f", "yolk_mem": "#ec7014", "yolk_lum": "#fee391",
    # the rest, one each
    "ribo": "#f0027f", "vim": "#8dd3c7", "glyco": "#fdb462", "rbc": "#b2182b", "actin": "#66c2a5",
    "tbar": "#fc8d62", "bm": "#8c510a", "pd": "#41b6c4",
}

KIND_COLORS: dict[str, str] = {"instance": "#d95f02", "semantic": "#1b9e77"}  # score bars, by scoring kind
ERROR_COLORS: dict[str, str] = {  # truth vs prediction panels
    "tp": "#f0f0f0",  # agreement: near white, so the errors stand out
    "fp": "#e41a1c",  # predicted, not in the truth
    "fn": "#377eb8",  # in the truth, missed
    "unknown": "#555555",  # not annotated: neither right nor wrong
}
GOLDEN = 0.6180339887498949  # fractional golden ratio: successive multiples spread hues evenly


def class_color(name: str) -> tuple[float, float, float]:
    """RGB (0-1) of a CellMap class (short name or official alias, e.g. `chloroplast_mem`).

    Raises:
        ValueError: for a name that is not a CellMap class.
    """
    if name not in CLASS_COLORS:
        from cellseg.classes import get_class

        name = get_class(name).name  # an alias, or a clear "unknown class" error
    return to_rgb(CLASS_COLORS[name])


def _mix64(values: np.ndarray) -> np.ndarray:
    """A 64-bit integer hash (splitmix64 finaliser) of uint64 values, vectorised."""
    z = values.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def instance_colors(ids: np.ndarray, *, seed: int = 0) -> np.ndarray:
    """RGB (0-1) colours of object ids, `(n, 3)` float64: a pure function of `(id, seed)`.

    Id 0 (background) gets a colour like any other id; callers leave it transparent.
    """
    ids = np.asarray(ids, dtype=np.uint64).ravel()
    offset = float(_mix64(np.array([seed], dtype=np.uint64))[0] % np.uint64(2**32)) / 2**32
    hue = np.mod(ids.astype(np.float64) * GOLDEN + offset, 1.0)
    bits = _mix64(ids ^ np.uint64(seed & 0xFFFFFFFF))
    # Three saturation and three value levels, picked by hash bits: vivid, never grey or black.
    saturation = 0.55 + 0.2 * (bits % np.uint64(3)).astype(np.float64)
    value = 0.75 + 0.1 * ((bits >> np.uint64(8)) % np.uint64(3)).astype(np.float64)
    return hsv_to_rgb(np.stack([hue, saturation, value], axis=1))
