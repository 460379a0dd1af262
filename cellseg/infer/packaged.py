"""An exported package's graph (`cellseg export`: TorchScript or ONNX) as the model the sliding window runs.

The engine feeds a model normalised EM (uint8 / 255) and takes logits; a package's graph takes raw EM and gives
probabilities (`cellseg.export.network`). `PackagedNetwork` undoes one and the other: EM × 255 recovers the uint8
values exactly (in float32, (b / 255) × 255 == b for every b in 0..255), and the logit of the graph's probabilities
goes back through the engine's sigmoid to the same probabilities to within float32 rounding (≤ 1e-7), so a store
predicted from a package's graph equals the runs' to the stored precision (`tests/infer/test_predict_export.py`).
The default backend, "torch", does not come here: it rebuilds the network from the package's weights with cellseg's
model code, exactly as from the run.
"""

from __future__ import annotations

import contextlib
import json
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from cellseg.infer.engine import EM_SCALE
from cellseg.runtime.checkpoint import file_sha256

log = logging.getLogger(__name__)
FORMAT = "cellseg-export"  # the "format" of a package's model.json / ensemble.json
BACKENDS = ("torch", "torchscript", "onnx")
GRAPH_FILES = {"torchscript": "model.torchscript.pt", "onnx": "model.onnx"}
INSTALL_EXPORT = "pip install 'cellseg[export]'"


def onnx_session(model: bytes | str, device: torch.device | None = None):  # -> onnxruntime.InferenceSession
    """An ONNX Runtime session of `model` (bytes or a file): on CUDA where `device` is CUDA and ONNX Runtime's
    CUDA provider is installed, else on the CPU (with a warning when CUDA was asked for).

    Raises:
        ImportError: onnxruntime missing (names the install command).
    """
    try:
        import onnxruntime
    except ImportError:
        raise ImportError(f"the ONNX backend needs onnxruntime: {INSTALL_EXPORT}") from None
    providers = ["CPUExecutionProvider"]
    if device is not None and device.type == "cuda":
        if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
            providers.insert(0, "CUDAExecutionProvider")
        else:
            log.warning("ONNX Runtime has no CUDA provider here (install onnxruntime-gpu): running on the CPU")
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3  # errors only: its notes on graph optimisation are not a user's business
    return onnxruntime.InferenceSession(model, sess_options=options, providers=providers)


@contextlib.contextmanager
def torchscript_quietly() -> Iterator[None]:
    """torch ≥ 2.10 marks `torch.jit.trace`, `save` and `load` deprecated in favour of torch.export; TorchScript is
    still what the tools that load models read (BioImage.IO, cellmap-flow, `torch.jit.load`): silence that one
    warning where cellseg calls them."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning, message=r".*torch\.jit\..*deprecated.*")
        yield


def is_package(folder: str | Path) -> bool:
    """Whether `folder` is a member package `cellseg export` wrote (its model.json)."""
    path = Path(folder) / "model.json"
    try:
        return path.is_file() and json.loads(path.read_text()).get("format") == FORMAT
    except (OSError, ValueError):
        return False


def check_package_files(folder: str | Path, names: list[str]) -> None:
    """The files `names` (paths relative to the package) against the sha256 its model.json lists.

    Raises:
        ValueError: a file missing, unlisted or changed since the export (naming it).
    """
    folder = Path(folder)
    listed = json.loads((folder / "model.json").read_text()).get("files", {})
    for name in names:
        path = folder / name
        if name not in listed or not path.is_file():
            raise ValueError(f"{path}: missing from the package, or not listed in its model.json")
        if file_sha256(path) != listed[name]:
            raise ValueError(f"{path}: sha256 differs from the package's model.json: the package was changed "
                             "since `cellseg export` wrote it")


def ensemble_decisions(path: str | Path) -> Path | None:
    """`PACKAGE/decisions.json` when `path` is an ensemble package `cellseg export` wrote, else None."""
    marker = Path(path) / "ensemble.json"
    try:
        if marker.is_file() and json.loads(marker.read_text()).get("format") == FORMAT:
            return Path(path) / "decisions.json"
    except (OSError, ValueError):
        return None
    return None


class PackagedNetwork(torch.nn.Module):
    """A package's graph behind the engine's model interface: normalised EM (B, 1, *patch) in, float32 logits
    (B, K, *patch) out, in float32 whatever autocast the caller runs under (the graphs are float32)."""

    def __init__(self, folder: str | Path, backend: str, device: torch.device, spec: object = None):
        super().__init__()
        folder = Path(folder)
        if backend not in GRAPH_FILES:
            raise ValueError(f"--backend {backend}: choose one of {', '.join(BACKENDS)}")
        if not is_package(folder):
            raise ValueError(f"--backend {backend}: {folder} is not a package written by `cellseg export` (no "
                             "model.json); a run directory predicts with --backend torch")
        path = folder / GRAPH_FILES[backend]
        if not path.is_file():
            raise FileNotFoundError(f"{path}: the package has no {backend} graph (export it with --format {backend})")
        doc = json.loads((folder / "model.json").read_text())
        self.patch = tuple(int(n) for n in doc["input"]["shape"][2:])
        self.backend, self.spec, self.source = backend, spec, path
        self.graph: torch.nn.Module | None = None
        self.session = None
        if backend == "torchscript":
            with torchscript_quietly():
                self.graph = torch.jit.load(str(path), map_location=device)
        else:
            self.session = onnx_session(str(path), device)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        if tuple(image.shape[2:]) != self.patch:
            raise ValueError(f"{self.source}: takes tiles of {list(self.patch)} voxels, given {list(image.shape[2:])}")
        em = image.float() * EM_SCALE  # exact: the uint8 values the graph normalises itself (module docstring)
        with torch.autocast(image.device.type, enabled=False):
            if self.graph is not None:
                probabilities = self.graph(em)
            else:  # tile by tile: ONNX Runtime holds several times eager PyTorch's memory per tile (bench/export.py)
                tiles = em.contiguous().cpu().numpy()
                got = [self.session.run(None, {"em": tiles[i:i + 1]})[0] for i in range(len(tiles))]  # type: ignore[union-attr]
                probabilities = torch.from_numpy(np.concatenate(got)).to(image.device)
        return torch.logit(probabilities.float())  # the engine's sigmoid turns these back into the graph's output
