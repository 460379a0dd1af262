"""The benchmark's constants, the synthetic test crops' match to the real ones, and the real crops' grids under
each projection policy. Sizes are (z, y, x) in voxels, voxel sizes in nm."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cellseg.config.inference import InferConfig
from cellseg.config.load import from_dict, read_yaml
from cellseg.data.crops import Crop
from cellseg.eval.submit import load_manifest
from cellseg.synth.presets import MirroredCrop, mirror_dataset_name

Vec3 = tuple[float, float, float]
Shape3 = tuple[int, int, int]
REPO = Path(__file__).resolve().parents[3]
EXPERIMENTS = REPO / "configs" / "experiments"
SMOKE = REPO / "configs" / "smoke"  # --quick: tiny presets, 32-voxel patches, 6 classes
MODEL_VOXEL_NM = 8.0  # every configs/experiments model predicts at 8 nm
GOAL_MINUTES = 60.0  # the target: the whole test set within 60 minutes on one H200
# The inference settings come from the recipes users run (`cellseg predict CONFIG ...`): the measured stages
# predict as configs/infer/tta8.yaml says, the projection prices tiles at the overlap of configs/infer/test_set.yaml.
MEASURE_RECIPE = REPO / "configs" / "infer" / "tta8.yaml"
PROJECTION_RECIPE = REPO / "configs" / "infer" / "test_set.yaml"


def load_infer(path: Path) -> InferConfig:
    """The `infer` section of a recipe file (with its `include:`s), checked as `cellseg predict` checks it."""
    return from_dict(InferConfig, read_yaml(path).get("infer", {}), prefix="infer")


TTA = load_infer(MEASURE_RECIPE).tta
# 5.9 M model voxels at 8 nm and 55 M EM voxels (seconds to generate); predict is bound by its tiles, which
# the crops' context keeps from shrinking with the crops (3D: 226 tiles of 128³ here, 306 at scale 16).
DEFAULT_SCALE = 24.0
QUICK_SCALE = 128.0
QUICK_PATCH_3D = "[16,16,16]"  # --quick: 3D tiles 8x cheaper than the smoke configs' 32³ (the tiny models take 16³)
QUICK_MODELS = ("unet_3d", "unet_2d")
PROBE_VOXEL_NM = 4.0  # the submit/validate probe: the largest crop again on the real 4 nm crops' grid ...
PROBE_LABELS = 8  # ... with up to 8 of its labels, instance and semantic alternating: as many arrays as
# `cellseg submit` and `validate-submission` run at once by default on a 16-core host, so the probe's cost per
# voxel is that of the parallel writer over a test set's hundreds of arrays
DOWNSTREAM = ("ensemble", "postprocess", "submit", "validate")  # the stages after predict, in order
POLICIES = {
    "8nm": "every crop at the models' 8 nm",
    "max8": "max(8 nm, the crop's voxel size) per axis: the 13.9-32 nm crops predicted by members trained at "
            "that voxel size (same architectures, patches and speed as the 8 nm members)",
    "max8_ov25": "as max8, with tiles overlapping by 0.25 instead of 0.5 (`cellseg predict --overlap 0.25`; "
                 "tiles counted at that overlap, each at the measured seconds per tile)",
}
LOW_OVERLAP = load_infer(PROJECTION_RECIPE).overlap  # the overlap of the "max8_ov25" policy (0.25)
STEADY_BOX = (256, 256, 256)  # 3D steady-state probe (voxels): 125 tiles of 128³ at overlap 0.5, context included
STEADY_SLICES = (32, 512, 512)  # 2D probe: 32 slices, 800 tiles of 256²
QUICK_STEADY = (32, 32, 32)  # --quick: probe box for both (tiny models on a CPU)
H200_BYTES = 139 * 2**30  # GPU memory for reports made before predict records kept theirs (H200s)
BIG_CROP_SHARE = 0.1  # the probe keeps the channels of the largest scored set among crops with ≥ 10 % of the voxels


def match_crops(root: Path, crops: Sequence[MirroredCrop]) -> dict[int, MirroredCrop]:
    """Synthetic test crop id → the crop it mirrors (ids rise in the preset's order within a dataset).

    Raises:
        ValueError: the root's test manifest does not hold the layout's crops.
    """
    synth = load_manifest(root / "test_crop_manifest.csv")
    out = {}
    for dataset in dict.fromkeys(c.dataset for c in crops):
        ids = sorted(i for i, c in synth.items() if c.dataset == mirror_dataset_name(dataset))
        mine = [c for c in crops if c.dataset == dataset]
        if len(ids) != len(mine):
            raise ValueError(f"{root}/test_crop_manifest.csv: {len(ids)} test crops of {mirror_dataset_name(dataset)}, "
                             f"the layout has {len(mine)}")
        for crop_id, crop in zip(ids, mine, strict=True):
            if synth[crop_id].geometry.shape_vox != crop.spec.shape_vox:
                raise ValueError(f"{root}: crop {crop_id} has shape {synth[crop_id].geometry.shape_vox}, "
                                 f"the layout {crop.spec.shape_vox}")
            out[crop_id] = crop
    return out


def grid_shape(extent_nm: Sequence[float], voxel_size_nm: Sequence[float]) -> Shape3:
    """Voxels of a box on a grid (as `cellseg.infer.crop_plan.box_grid` rounds them)."""
    return tuple(max(1, round(e / v)) for e, v in zip(extent_nm, voxel_size_nm, strict=True))  # type: ignore[return-value]


def model_voxel_size(crop_vs: Sequence[float], policy: str) -> Vec3:
    """The grid a crop is predicted on under `policy` (see `POLICIES`)."""
    if policy == "8nm":
        return (MODEL_VOXEL_NM,) * 3
    return tuple(max(MODEL_VOXEL_NM, v) for v in crop_vs)  # type: ignore[return-value]


def real_volumes(real: Mapping[int, Crop], policy: str) -> dict[int, dict[str, Any]]:
    """Per real test crop: the model grid of `policy` and the voxels submitted (crop grid × labels)."""
    out = {}
    for crop_id, crop in sorted(real.items()):
        g = crop.geometry
        vs = model_voxel_size(g.voxel_size_nm, policy)
        shape = grid_shape(g.extent_nm, vs)
        out[crop_id] = {"voxel_size_nm": list(vs), "shape_vox": list(shape), "voxels": math.prod(shape),
                        "submitted_voxels": g.num_voxels * len(crop.labels)}
    return out


def num_arrays(crops: Mapping[int, Crop]) -> int:
    """(crop, label) arrays a submission holds."""
    return sum(len(c.labels) for c in crops.values())


def submitted_voxels(crops: Mapping[int, Crop]) -> int:
    """Voxels of every (crop, label) array a submission holds."""
    return sum(g.num_voxels for c in crops.values() for g in c.labels.values())


def scored_count(channels: Sequence[str], crop: Crop) -> int:
    """Channels `cellseg predict --channels scored` writes for a real test crop (its labels + boundaries)."""
    from cellseg.infer.crop_plan import scored_channels

    return len(scored_channels(channels, list(crop.labels)))
