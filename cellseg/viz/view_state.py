"""The neuroglancer viewer state of `cellseg view`, as plain JSON (built and tested without a browser or server).

Neuroglancer reads each layer's OME-NGFF metadata itself: its scale and translation (nm, axes z, y, x,
translation = the centre of voxel 0, the convention of `cellseg.data.crops`) place every level, crop and
prediction in world coordinates, so no layer needs a transform here. The state fixes what the data does not
say: the global dimensions (z, y, x at the EM's finest voxel size, in metres as neuroglancer writes them),
the starting position and zoom (the focused region, `ViewPlan.focus_nm`, fitted into the panels), which plane
the panels show (x across, y down, as in the EM's slices), and how each layer is drawn:

- the EM: grey, as stored;
- probabilities: the class colour over the voxels at or above a threshold (default 0.5, what the plain decoding
  keeps), its opacity rising with the probability from half strength at the threshold, so the EM stays visible
  under the low probabilities everywhere (uint8 255 = 1.0; float32 as is), with sliders for both;
- labels: masks in the class colour, object ids in neuroglancer's colours per id; truth crops mark
  unknown voxels (255) grey.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cellseg.viz.view_layers import Layer, ViewPlan

NM = 1e-9  # neuroglancer writes coordinate scales in metres
AXES = ("z", "y", "x")
DISPLAY_AXES = ("x", "y", "z")  # the xy panel shows x across and y down
FALLBACK_COLOR = "#bbbbbb"  # a channel that is not a CellMap class (e.g. a user's own)
UNKNOWN_ID = "255"  # CellMap truth's "unknown" value (the annotation encoding's `unknown`)
UNKNOWN_COLOR = "#808080"
# The first view fits the focused region (a crop, a store's ROI, or the EM) into a panel of about this many screen
# pixels (a 4-panel layout on a 1080p screen), zooming in up to 8 screen pixels per voxel for a small crop.
FIT_PIXELS = 400
MIN_SCALE = 1 / 8
PROJECTION_MARGIN = 1.5  # the 3D panel shows the region with half its size around it
LAYOUTS = ("4panel", "xy", "xz", "yz", "3d")  # neuroglancer layouts `cellseg view --layout` offers

PROBABILITY_SHADER = """\
#uicontrol vec3 color color(default="{color}")
#uicontrol float threshold slider(min=0, max=1, step=0.01, default={threshold})
#uicontrol float strength slider(min=0, max=1, step=0.05, default={strength})
void main() {{
  // toNormalized: uint8 0..255 -> 0..1 (255 = p 1.0); float32 probabilities pass through
  float p = clamp(toNormalized(getDataValue()), 0.0, 1.0);
  emitRGBA(vec4(color, p >= threshold ? p * strength : 0.0));
}}
"""
PROBABILITY_THRESHOLD = 0.5  # the first view: what the plain decoding (p > 0.5) keeps; lower it with the slider
PROBABILITY_STRENGTH = 0.7  # opacity at p = 1: the EM shows through even where the model is sure


def class_hex(name: str) -> str:
    """A class's fixed colour (`cellseg.viz.palette`) as `#rrggbb`; grey for a name that is not a class."""
    from matplotlib.colors import to_hex

    from cellseg.viz.palette import class_color

    try:
        return str(to_hex(class_color(name)))
    except (ValueError, KeyError):
        return FALLBACK_COLOR


def source_url(base_url: str, layer: Layer) -> str:
    """The layer's data source: its group over HTTP, read as zarr v2 (`<url>/|zarr2:`, neuroglancer's form)."""
    return f"{base_url.rstrip('/')}/{layer.mount}/{layer.path}/|zarr2:"


def layer_json(layer: Layer, base_url: str) -> dict[str, Any]:
    """One layer of the state: source, type and how it is drawn (module docstring)."""
    entry: dict[str, Any] = {"name": layer.name, "source": source_url(base_url, layer)}
    if layer.kind == "em":
        entry |= {"type": "image", "opacity": 1.0}
    elif layer.kind == "probabilities":
        entry |= {"type": "image", "opacity": 1.0, "blend": "default",
                  "shader": PROBABILITY_SHADER.format(
                      color=class_hex(layer.class_name), threshold=PROBABILITY_THRESHOLD, strength=PROBABILITY_STRENGTH)}
    else:
        entry |= {"type": "segmentation", "hideSegmentZero": True}
        if layer.is_mask:
            entry["segmentDefaultColor"] = class_hex(layer.class_name)
        if layer.name.startswith("truth/"):
            entry["segmentColors"] = {UNKNOWN_ID: UNKNOWN_COLOR}
    if not layer.visible:
        entry["visible"] = False
    return entry


def dimensions(voxel_size_nm: Sequence[float]) -> dict[str, list[Any]]:
    """Global dimensions z, y, x: one unit = one EM voxel, written in metres."""
    return {axis: [float(v) * NM, "m"] for axis, v in zip(AXES, voxel_size_nm, strict=True)}


def viewer_state(plan: ViewPlan, base_url: str, *, position_nm: Sequence[float] | None = None,
                 layout: str = "4panel", fit_pixels: float = FIT_PIXELS) -> dict[str, Any]:
    """The viewer state (neuroglancer's JSON) showing every layer of `plan`, its data under `base_url`.

    Args:
        plan: what to show (`view_layers.plan_view`).
        base_url: where the mounts are served: `<base_url>/<mount>/<path>`.
        position_nm: the starting point (world nm, z y x); default `plan.focus_nm`.
        layout: neuroglancer's layout: "4panel", "xy", "xz", "yz" or "3d" (`LAYOUTS`).
        fit_pixels: the focused region fits into this many screen pixels of a panel.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"--layout {layout}: choose one of {', '.join(LAYOUTS)}")
    voxel = plan.em_levels[0].voxel_size_nm
    centre = position_nm if position_nm is not None else plan.focus_nm
    extent = max([n / v for n, v in zip(plan.focus_extent_nm, voxel, strict=True)] + [1.0])  # EM voxels
    return {
        "dimensions": dimensions(voxel),
        "displayDimensions": list(DISPLAY_AXES),
        "position": [float(c) / v for c, v in zip(centre, voxel, strict=True)],  # in global units (EM voxels)
        "crossSectionScale": max(MIN_SCALE, extent / fit_pixels),  # EM voxels per screen pixel: the region fits
        "projectionScale": extent * PROJECTION_MARGIN,
        "layers": [layer_json(layer, base_url) for layer in plan.layers],
        "selectedLayer": {"layer": plan.layers[0].name, "visible": True},
        "layout": layout,
    }


def layer_names(state: Mapping[str, Any]) -> list[str]:
    """The names of a state's layers, in order."""
    return [layer["name"] for layer in state["layers"]]
