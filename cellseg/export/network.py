"""A trained network as graphs that run without cellseg: TorchScript and ONNX, each checked against PyTorch.

Both formats hold the same function (`Exported`): raw EM in, uint8 intensities 0..255 given as uint8 or float,
shaped (B, 1, *patch) with axes (b, c, z, y, x) for a 3D model or (b, c, y, x) for a 2D one; per-class sigmoid
probabilities out, float32 (B, K, *patch). The input normalisation (EM / 255, as in training) and the activation
are inside, so a loader needs nothing of cellseg's preprocessing.

Shapes: the batch axis is free in both formats; the spatial shape is the training patch. The graphs are made from
one example of that shape and the models' shape-dependent Python (padding to an input divisor, window and
position-embedding sizes) is fixed by it: exporting the spatial axes as dynamic produced ONNX graphs that gave
wrong answers at other sizes for six of the eight architectures, so no architecture claims them.

Everything runs on the CPU in float32 (no channels-last, no autocast), so a package runs wherever torch or ONNX
Runtime runs. `PARITY_ATOL` is the largest absolute difference from the eager network allowed on the test input.
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings

import numpy as np
import torch

from cellseg.infer.engine import EM_SCALE
from cellseg.infer.packaged import INSTALL_EXPORT, onnx_session, torchscript_quietly

log = logging.getLogger(__name__)
PARITY_ATOL = 1e-4  # float32 probabilities: an exported graph and the eager network agree to this
ONNX_OPSET = 18  # the opset torch's exporter targets by default; ONNX Runtime ≥ 1.14 runs it


class Exported(torch.nn.Module):
    """A network with cellseg's input normalisation (EM / 255, as in training) and its output activation
    (sigmoid: per-class probabilities) around it."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, em: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.model(em.to(torch.float32) / EM_SCALE).float())


def exported(model: torch.nn.Module) -> Exported:
    """`model` (float32, eval mode, no gradients) wrapped in `Exported`."""
    return Exported(model.float()).eval().requires_grad_(False)


def example_input(patch_vox: tuple[int, int, int], spatial_dims: int, batch: int = 1) -> torch.Tensor:
    """A deterministic uint8-valued float32 batch (seed 0), shaped (batch, 1, *patch): seeded noise, for where no
    EM can be read."""
    shape = patch_vox if spatial_dims == 3 else patch_vox[1:]
    generator = torch.Generator().manual_seed(0)
    return torch.randint(0, 256, (batch, 1, *shape), generator=generator).to(torch.float32)


def batch_of(example: torch.Tensor) -> torch.Tensor:
    """`example` (1, 1, *patch) and its mirror image along the last axis: the two tiles graphs are
    made from."""
    return torch.cat([example, example.flip(-1)])


def _largest_diff(got: torch.Tensor | np.ndarray, want: torch.Tensor, what: str) -> float:
    diff = float((torch.as_tensor(got) - want).abs().max())
    if not diff <= PARITY_ATOL:  # NaN fails too
        raise RuntimeError(f"the {what} network differs from the eager one by {diff:.2e} (> {PARITY_ATOL:g})")
    return diff


def to_torchscript(wrapped: Exported, example: torch.Tensor) -> tuple[torch.jit.ScriptModule, float]:
    """`wrapped` traced on `batch_of(example)`, with the largest absolute difference between the traced and the
    eager outputs on it.

    Raises:
        RuntimeError: the network cannot be traced (the error names the operator), or the trace differs by more
            than `PARITY_ATOL`.
    """
    tiles = batch_of(example)
    with torch.no_grad(), torchscript_quietly():
        # shape-dependent Python branches are traced for the one fixed patch (module docstring): the parity check
        # below is what says the trace is right
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        try:
            traced = torch.jit.trace(wrapped, tiles, check_trace=False)
        except Exception as err:  # torch raises several types for an untraceable operator
            raise RuntimeError(f"TorchScript cannot trace this network: {type(err).__name__}: {err}") from err
        diff = _largest_diff(traced(tiles), wrapped(tiles), "traced")
    return traced, diff


def to_onnx(wrapped: Exported, example: torch.Tensor) -> tuple[bytes, float]:
    """`wrapped` as an ONNX model (opset `ONNX_OPSET`, batch axis dynamic, the spatial shape of `example`),
    serialised, with the largest absolute difference between ONNX Runtime's and the eager outputs on `example`.

    The graph is made from `batch_of(example)` (torch.export traces with fake tensors: no memory of the size of a
    forward), and checked on one tile: ONNX Runtime holds far more memory than eager PyTorch for the attention
    models (swin_3d at 128³, fp32: 10.6 GB for one tile, 20.5 GB for two), so checking a batch of two would make
    exporting the largest models fail on a 24 GB machine. That the batch axis is free is checked for every
    architecture in the suite (`tests/infer/test_export.py`: batches of one to three).

    Raises:
        ImportError: onnx, onnxscript or onnxruntime missing (names the install command).
        RuntimeError: the exporter fails (its message names the operator), or ONNX Runtime's output differs by
            more than `PARITY_ATOL`.
    """
    require_onnx()
    tiles = batch_of(example)
    batch = torch.export.Dim("batch", min=1)
    chatter = io.StringIO()
    with torch.no_grad(), warnings.catch_warnings(), contextlib.redirect_stdout(chatter):
        warnings.simplefilter("ignore")  # the exporter's progress and deprecation notes: the parity check decides
        try:
            program = torch.onnx.export(wrapped, (tiles,), None, input_names=["em"], output_names=["probabilities"],
                                        opset_version=ONNX_OPSET, dynamo=True, dynamic_shapes=({0: batch},))
            data = program.model_proto.SerializeToString()  # type: ignore[union-attr]  # weights inline (< 2 GB)
        except Exception as err:  # torch.export and onnxscript raise several types, naming the operator
            first = str(err).strip().splitlines()[0] if str(err).strip() else ""
            raise RuntimeError(f"ONNX cannot export this network: {type(err).__name__}: {first}") from err
    got = onnx_session(data).run(None, {"em": example.numpy()})[0]
    with torch.no_grad():
        return data, _largest_diff(got, wrapped(example), "ONNX Runtime")


def require(packages: tuple[str, ...], what: str) -> None:
    """ImportError naming the missing ones of `packages` (import names) and the install command, for `what`."""
    import importlib.util

    missing = [name for name in packages if importlib.util.find_spec(name) is None]
    if missing:
        raise ImportError(f"{what} needs {', '.join(missing)}: {INSTALL_EXPORT}")


def require_onnx() -> None:
    """ImportError naming the install command when the ONNX packages are missing."""
    require(("onnx", "onnxscript", "onnxruntime"), "ONNX export (or --format torchscript)")
