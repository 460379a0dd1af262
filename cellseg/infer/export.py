"""`cellseg export`: a trained run as a package that runs without cellseg, its run directory or its config.

    OUT/model.torchscript.pt   TorchScript: EM (B, 1, *patch), uint8 values as float or uint8 → sigmoid
                               probabilities (B, K, *patch), float32 (`Exported`: the normalisation and the
                               activation inside, so a caller feeds raw EM)
    OUT/model.json             what the network takes and gives (module docstring of `describe`), the run's
                               provenance and the sha256 of every file; format "cellseg-export", version 1
    OUT/test_input.npy         a deterministic uint8 patch (seed 0) and the network's output on it, float32:
    OUT/test_output.npy        what a loader of the package checks itself against

The network is traced at the run's training patch on the CPU in float32 (no channels-last, no autocast), so the
package runs anywhere torch runs; its spatial shape is fixed to that patch (`model.json` says so): a caller tiles
a volume with it, as `cellseg predict` does. The trace is checked against the PyTorch network on the test input
before anything is written (maximum absolute difference ≤ `PARITY_ATOL`), and the package is written under a
temporary name and renamed when complete.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cellseg import __version__
from cellseg.data.grid import shape3
from cellseg.data.write import EXPORTED_MODEL, atomic_dir
from cellseg.infer.engine import EM_SCALE
from cellseg.infer.run import LoadedRun, load_run

FORMAT, VERSION = "cellseg-export", 1
PARITY_ATOL = 1e-4  # float32 probabilities: the traced and the eager network agree to this


class Exported(torch.nn.Module):
    """A network with cellseg's input normalisation (uint8 EM / 255, as in training) and its output activation
    (sigmoid: per-class probabilities) around it."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, em: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.model(em.to(torch.float32) / EM_SCALE).float())


@contextlib.contextmanager
def torchscript_quietly() -> Iterator[None]:
    """torch ≥ 2.10 marks `torch.jit.trace`, `save` and `load` deprecated in favour of torch.export; TorchScript is
    still what the tools that load models read (BioImage.IO, cellmap-flow, `torch.jit.load`): silence that one
    warning where cellseg calls them."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning, message=r".*torch\.jit\..*deprecated.*")
        yield


def example_input(patch_vox: tuple[int, int, int], spatial_dims: int) -> torch.Tensor:
    """A deterministic uint8-valued float32 patch (seed 0), shaped (1, 1, *patch) for the network."""
    shape = patch_vox if spatial_dims == 3 else patch_vox[1:]
    generator = torch.Generator().manual_seed(0)
    return torch.randint(0, 256, (1, 1, *shape), generator=generator).to(torch.float32)


def trace(model: torch.nn.Module, example: torch.Tensor) -> tuple[torch.jit.ScriptModule, float]:
    """`model` wrapped (`Exported`) and traced on `example`, with the largest absolute difference between the
    traced and the eager outputs on it.

    Raises:
        RuntimeError: the network cannot be traced (the error names the operator), or the trace differs by more
            than `PARITY_ATOL`.
    """
    wrapped = Exported(model).eval().requires_grad_(False)  # an inference package: outputs carry no graph
    with torch.no_grad(), torchscript_quietly():
        # shape-dependent Python branches (padding to the input divisor, window sizes) are traced for the one
        # fixed patch the package takes: the parity check below is what says the trace is right
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        try:
            traced = torch.jit.trace(wrapped, example, check_trace=False)
        except Exception as err:  # torch raises several types for an untraceable operator
            raise RuntimeError(f"TorchScript cannot trace this network: {type(err).__name__}: {err}") from err
        diff = float((traced(example) - wrapped(example)).abs().max())
    if not diff <= PARITY_ATOL:
        raise RuntimeError(f"the traced network differs from the eager one by {diff:.2e} (> {PARITY_ATOL:g})")
    return traced, diff


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def describe(run: LoadedRun, patch: tuple[int, int, int], max_diff: float) -> dict[str, Any]:
    """`model.json` (without the files' sha256): input, output, what the run was."""
    cfg = run.cfg
    two_d = patch[0] == 1
    result_path = run.run_dir / "result.json"
    return {
        "format": FORMAT, "version": VERSION, "cellseg": __version__, "torch": torch.__version__,
        "architecture": cfg.model.name, "preset": cfg.model.preset,
        "input": {"axes": "bcyx" if two_d else "bczyx", "shape": [1, 1, *(patch[1:] if two_d else patch)],
                  "spatial_shape_fixed": True, "values": "EM intensities 0..255 (uint8, or float holding them)",
                  "normalisation": f"divided by {EM_SCALE:g} inside the network, as in training",
                  "voxel_size_nm": {"z": cfg.data.voxel_size_nm[0], "y": cfg.data.voxel_size_nm[1],
                                    "x": cfg.data.voxel_size_nm[2]},
                  "slices": "z" if two_d else None},
        "output": {"axes": "bcyx" if two_d else "bczyx", "channels": list(run.channels),
                   "classes": list(cfg.data.classes), "activation": "sigmoid (inside the network)",
                   "dtype": "float32", "boundary_channels": [c for c in run.channels if c.endswith("_boundary")]},
        "parity": {"max_abs_diff_vs_pytorch": max_diff, "tolerance": PARITY_ATOL},
        "provenance": {"run_dir": str(run.run_dir.resolve()), "checkpoint": str(run.checkpoint.resolve()),
                       "checkpoint_sha256": _sha256(run.checkpoint), "step": run.step, "weights": run.weights,
                       "data_root": str(cfg.data.root),
                       "result": json.loads(result_path.read_text()) if result_path.is_file() else None},
    }


def export_run(run_dir: str | Path, out: str | Path, *, checkpoint: str = "best", overwrite: bool = False
               ) -> dict[str, Any]:
    """Export a run (module docstring); returns `model.json`.

    Raises:
        FileNotFoundError, ValueError: what `load_run` raises for a broken run directory.
        RuntimeError: the network cannot be traced, or its trace disagrees with it (nothing written).
        FileExistsError: `out` exists and is not an export cellseg wrote, or `overwrite` is False.
    """
    run = load_run(run_dir, checkpoint, device="cpu")
    patch = shape3(run.cfg.data.patch_shape_vox)
    example = example_input(patch, run.spatial_dims)
    traced, diff = trace(run.model.float().eval(), example)
    with torch.no_grad():
        expected = traced(example)
    doc = describe(run, patch, diff)
    with atomic_dir(out, overwrite=overwrite, kind=EXPORTED_MODEL) as tmp:
        tmp.mkdir(parents=True)
        with torchscript_quietly():
            torch.jit.save(traced, str(tmp / "model.torchscript.pt"))
        np.save(tmp / "test_input.npy", example.numpy().astype(np.uint8))
        np.save(tmp / "test_output.npy", expected.numpy())
        doc["files"] = {p.name: _sha256(p) for p in sorted(tmp.iterdir())}
        (tmp / "model.json").write_text(json.dumps(doc, indent=1) + "\n")
    return doc


def check_export(path: str | Path) -> float:
    """Load an export with TorchScript alone, check its files' sha256 and run its test input; returns the largest
    absolute difference from the test output.

    Raises:
        ValueError: not an export, a file whose sha256 differs, or an output off by more than `PARITY_ATOL`.
    """
    path = Path(path)
    doc = json.loads((path / "model.json").read_text()) if (path / "model.json").is_file() else {}
    if doc.get("format") != FORMAT:
        raise ValueError(f"{path}: not a cellseg export (no model.json of format {FORMAT!r})")
    for name, digest in doc["files"].items():
        if _sha256(path / name) != digest:
            raise ValueError(f"{path / name}: sha256 differs from model.json's: the package was changed")
    with torchscript_quietly():
        model = torch.jit.load(str(path / "model.torchscript.pt"), map_location="cpu")
    with torch.no_grad():
        got = model(torch.from_numpy(np.load(path / "test_input.npy")).to(torch.float32))
    diff = float((got - torch.from_numpy(np.load(path / "test_output.npy"))).abs().max())
    if not (math.isfinite(diff) and diff <= PARITY_ATOL):
        raise ValueError(f"{path}: the network's output on its test input differs by {diff:.2e} (> {PARITY_ATOL:g})")
    return diff
