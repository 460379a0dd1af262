"""Load pretrained encoder weights from a local file, never from a hub (clusters are offline).

:func:`load_encoder_checkpoint` accepts a plain ``state_dict`` saved with ``torch.save`` (``.pt``,
``.pth``, ``.bin``) or a ``.safetensors`` file, optionally wrapped as ``{"state_dict": ...}`` /
``{"model": ...}`` and/or prefixed ``module.`` (DDP) or ``model.``. It loads every tensor whose
name and shape match, adapts an RGB stem to the encoder's input channels (timm's
``adapt_input_conv``: summed for one channel), and returns a :class:`LoadReport` of what was
missing, unexpected or mismatched, so that a silently half-loaded encoder cannot happen.

Example:
    >>> report = load_encoder_checkpoint(model.encoder, "weights/resnet34_a1_in1k.pth")
    >>> print(report.summary())
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

WRAPPER_KEYS = ("state_dict", "model", "state_dict_ema", "model_ema")
WRAPPER_PREFIXES = ("module.", "model.", "encoder.")


@dataclass(frozen=True, kw_only=True)
class LoadReport:
    """What :func:`load_encoder_checkpoint` did.

    Attributes:
        path: the checkpoint file.
        loaded: encoder keys set from the checkpoint.
        missing: encoder keys absent from the checkpoint (left at their random init).
        unexpected: checkpoint keys the encoder does not have (ignored, e.g. a classifier ``fc.*``).
        mismatched: keys present in both with incompatible shapes (left at init).
        adapted: input-conv keys whose channel count was adapted (e.g. RGB → 1 channel).
    """

    path: str
    loaded: tuple[str, ...]
    missing: tuple[str, ...]
    unexpected: tuple[str, ...]
    mismatched: tuple[str, ...]
    adapted: tuple[str, ...]

    def summary(self, *, max_keys: int = 8) -> str:
        """One readable paragraph: counts, then the first ``max_keys`` names of each problem list."""
        parts = [f"{len(self.loaded)} tensors loaded from {self.path}"]
        for label, keys in (
            ("adapted to the input channels", self.adapted),
            ("missing (random init)", self.missing),
            ("unexpected (ignored)", self.unexpected),
            ("shape mismatch (random init)", self.mismatched),
        ):
            if keys:
                shown = ", ".join(keys[:max_keys]) + (", ..." if len(keys) > max_keys else "")
                parts.append(f"{len(keys)} {label}: {shown}")
        return "; ".join(parts)


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """Read the tensors of a local checkpoint, unwrapping common containers and prefixes.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: the file is not a readable PyTorch / safetensors state dict.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"encoder checkpoint {str(path)!r} does not exist (weights are never downloaded)"
        )
    try:
        raw = _load_file(path)
    except Exception as err:  # torch/safetensors raise many types for a corrupt or foreign file
        raise ValueError(
            f"could not read {str(path)!r} as a PyTorch or safetensors state dict: {err}"
        ) from err
    return _strip_prefixes(_unwrap(raw, path))


def load_encoder_checkpoint(encoder: nn.Module, path: str | Path) -> LoadReport:
    """Load matching tensors of the checkpoint at ``path`` into ``encoder`` and report the rest.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: the file is unreadable, or none of its names match the encoder's.
    """
    source = read_state_dict(path)
    target = encoder.state_dict()
    if not set(source) & set(target):
        raise ValueError(
            f"none of the {len(source)} tensors in {str(path)!r} match the encoder's names "
            f"(checkpoint: {sorted(source)[:3]}..., encoder: {sorted(target)[:3]}...); is it for this encoder?"
        )
    usable, adapted, mismatched = _match_shapes(source, target)
    encoder.load_state_dict(usable, strict=False)
    return LoadReport(
        path=str(path),
        loaded=tuple(sorted(usable)),
        missing=tuple(sorted(set(target) - set(usable) - set(mismatched))),
        unexpected=tuple(sorted(set(source) - set(target))),
        mismatched=tuple(sorted(mismatched)),
        adapted=tuple(sorted(adapted)),
    )


def _load_file(path: Path) -> object:
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path), device="cpu")
    return torch.load(path, map_location="cpu", weights_only=True)


def _unwrap(raw: object, path: Path) -> dict[str, torch.Tensor]:
    if isinstance(raw, Mapping):
        for key in WRAPPER_KEYS:
            if isinstance(raw.get(key), Mapping):
                raw = raw[key]
                break
    if not isinstance(raw, Mapping):
        raise ValueError(f"{str(path)!r} holds a {type(raw).__name__}, not a state dict")
    tensors = {str(key): value for key, value in raw.items() if isinstance(value, torch.Tensor)}
    if not tensors:
        raise ValueError(f"{str(path)!r} contains no tensors")
    return tensors


def _strip_prefixes(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Drop a wrapper prefix (``module.`` etc.) shared by *every* key, repeatedly."""
    changed = True
    while changed:
        changed = False
        for prefix in WRAPPER_PREFIXES:
            if all(key.startswith(prefix) for key in state):
                state = {key[len(prefix) :]: value for key, value in state.items()}
                changed = True
    return state


def _match_shapes(
    source: dict[str, torch.Tensor], target: dict[str, torch.Tensor]
) -> tuple[dict[str, torch.Tensor], list[str], list[str]]:
    usable, adapted, mismatched = {}, [], []
    for key in set(source) & set(target):
        tensor, wanted = source[key], target[key]
        if tensor.shape == wanted.shape:
            usable[key] = tensor
        elif _is_input_conv_variant(tensor, wanted):
            # timm only when a checkpoint needs it: importing it costs seconds of every job's start-up
            from timm.models import adapt_input_conv

            usable[key] = adapt_input_conv(wanted.shape[1], tensor).to(wanted.dtype)
            adapted.append(key)
        else:
            mismatched.append(key)
    return usable, adapted, mismatched


def _is_input_conv_variant(tensor: torch.Tensor, wanted: torch.Tensor) -> bool:
    """An RGB 2D conv weight (OIHW) that differs from the wanted one only in input channels."""
    return (
        tensor.ndim == wanted.ndim == 4
        and tensor.shape[0] == wanted.shape[0]
        and tensor.shape[2:] == wanted.shape[2:]
        and tensor.shape[1] == 3
    )
