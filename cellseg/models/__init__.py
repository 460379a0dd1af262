"""Segmentation architectures behind one registry and one contract.

Every network maps ``(B, C, *spatial)`` to raw logits ``(B, K, *spatial)`` (see
:class:`~cellseg.models.base.SegModel`); :func:`build_model` builds one by name and attaches its
:class:`~cellseg.models.base.ModelSpec`. Importing this package registers the eight
architectures: ``unet_2d``, ``unet_3d``, ``resnet_2d``, ``resnet_3d``, ``swin_2d``, ``swin_3d``,
``vit_2d``, ``vit_3d``.

Example:
    >>> from cellseg.models import build_model, list_models
    >>> model = build_model("unet_3d", 1, 8)
    >>> model.spec.input_divisor, model.spec.default_patch_vox
    ((32, 32, 32), (128, 128, 128))
"""

# Importing the architecture modules runs their @register_model decorators.
from cellseg.models import resnet, swin, unet, vit  # noqa: F401
from cellseg.models.base import ModelSpec, SegModel
from cellseg.models.pretrained import LoadReport, load_encoder_checkpoint
from cellseg.models.registry import (
    build_model,
    get_entry,
    list_models,
    preset_patch_vox,
    register_model,
    resolve_params,
)
from cellseg.models.summary import ModelSummary, summarize_model

__all__ = [
    "LoadReport",
    "ModelSpec",
    "ModelSummary",
    "SegModel",
    "build_model",
    "get_entry",
    "list_models",
    "load_encoder_checkpoint",
    "preset_patch_vox",
    "register_model",
    "resolve_params",
    "summarize_model",
]
