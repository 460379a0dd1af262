"""A package's BioImage.IO model description (`rdf.yaml`, format 0.5), its documentation and cover, validated with
`bioimageio.spec` before the package is written.

The description names what a model zoo upload needs: the input (`em`: batch, channel, z/y/x space axes in
nanometres at the run's voxel size, uint8, cast to float32 by the `ensure_dtype` preprocessing step) and output
(`probabilities`: one channel per class and boundary channel, same space axes, float32 in [0, 1]); the weights
(TorchScript, and ONNX with TorchScript as its parent, the two being the same function: `cellseg.export.network`);
test and sample tensors; authors, maintainers, licence and citations (`ZooFields`); the cellseg provenance under
`config.cellseg`. Validation runs offline (`perform_io_checks`: every file's sha256 is recomputed); an invalid
description stops the export, warnings (e.g. no maintainer's GitHub name) are returned for the command to print.
"""

from __future__ import annotations

import gc
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from cellseg.export.network import INSTALL_EXPORT
from cellseg.runtime.checkpoint import file_sha256

FORMAT_VERSION = "0.5.14"  # the model description format bioimageio.spec 0.5.14 writes and validates
RDF = "rdf.yaml"
CHALLENGE_CITATION = {  # the data every cellseg model learns from: the CellMap/OpenOrganelle FIB-SEM volumes
    "text": "Heinrich L., Bennett D., Ackerman D. et al. Whole-cell organelle segmentation in volume electron "
            "microscopy. Nature 599, 141-146 (2021)",
    "doi": "10.1038/s41586-021-03977-3"}
COVER_PX = (512, 256)  # width, height: the 2:1 cover the model zoo shows
PROBABILITY_SHOWN = 0.5  # the cover paints each class where its probability exceeds this


@dataclass(frozen=True, kw_only=True)
class ZooFields:
    """What a model zoo upload asks of the people behind a model (`cellseg export --author ... --license ...`)."""

    authors: tuple[str, ...] = ("cellseg user",)
    maintainers: tuple[str, ...] = ()  # GitHub user names
    license: str = "CC-BY-4.0"  # SPDX id of the weights' licence: the zoo's usual choice for trained weights
    cite: tuple[Mapping[str, str], ...] = (CHALLENGE_CITATION,)
    extra_tags: tuple[str, ...] = field(default_factory=tuple)


def _space(axis: str, size: Any, scale_nm: float) -> dict[str, Any]:
    return {"type": "space", "id": axis, "size": size, "unit": "nanometer", "scale": float(scale_nm)}


def _file(folder: Path, name: str) -> dict[str, str]:
    return {"source": name, "sha256": file_sha256(folder / name)}


def write_samples(folder: Path, test_input: np.ndarray, test_output: np.ndarray) -> None:
    """The sample tensors (TIFF, which the zoo's viewers open) beside the test tensors (.npy)."""
    import tifffile

    tifffile.imwrite(folder / "sample_input.tif", test_input)
    tifffile.imwrite(folder / "sample_output.tif", test_output)


def write_cover(folder: Path, em: np.ndarray, probabilities: np.ndarray, channels: Sequence[str],
                classes: Sequence[str], voxel_nm: Sequence[float]) -> None:
    """cover.png: the test input's middle plane (z for a 3D model), beside it the same plane with each class
    painted where its probability exceeds `PROBABILITY_SHOWN` (cellseg's class colours).

    Args:
        em: (1, 1, *S) uint8; probabilities: (1, K, *S) float32, S = (Z, Y, X) or (Y, X).
    """
    from cellseg.viz.figure import bare, new_figure, save_png, show_em, show_rgba
    from cellseg.viz.overlay import semantic_rgba

    plane = (lambda a: a[a.shape[0] // 2]) if em.ndim == 5 else (lambda a: a)
    em2 = plane(em[0, 0]).astype(np.float32)
    height, width = em2.shape
    extent = (0.0, width * voxel_nm[2], height * voxel_nm[1], 0.0)  # nm: left, right, bottom, top (image rows down)
    masks = {c: plane(probabilities[0, channels.index(c)]) > PROBABILITY_SHOWN for c in classes}
    fig = new_figure(*COVER_PX)
    for i, overlay in enumerate((False, True)):
        ax = fig.add_subplot(1, 2, i + 1)
        show_em(ax, em2, extent)
        shown = {c: m for c, m in masks.items() if m.any()}
        if overlay and shown:
            show_rgba(ax, semantic_rgba(shown), extent)
        bare(ax)
    save_png(fig, folder / "cover.png")


def _scores(validation: Mapping[str, Any] | None) -> list[str]:
    """The README's training scores: the run's last validation, with crop-bootstrap intervals."""
    if not validation or validation["overall"]["score"] is None:
        return []
    low, high = validation["overall"]["interval"]
    span = f" ({validation['level']:.0%} interval {low:.3f}-{high:.3f} over its crops)" if low is not None else ""
    return ["## Training scores", "",
            f"Overall {validation['metric']} score on the run's {len(validation['crops'])} validation crops: "
            f"{validation['overall']['score']:.3f}{span}.", ""]


def readme(doc: Mapping[str, Any]) -> str:
    """The description's documentation: what goes in and out, and how the package was checked."""
    inp, out = doc["input"], doc["output"]
    vs = inp["voxel_size_nm"]
    return "\n".join([
        f"# {doc['architecture']} ({doc['preset']}): organelle probabilities from FIB-SEM", "",
        f"Trained with cellseg {doc['cellseg']} (torch {doc['torch']}) on CellMap-layout data.", "",
        "## Input", "",
        f"Raw EM intensities (uint8, 0..255), axes `{inp['axes']}`, shape {inp['shape']} (the spatial shape is "
        f"fixed: the training patch; tile larger volumes with it), voxel size z {vs['z']:g}, y {vs['y']:g}, "
        f"x {vs['x']:g} nm. The normalisation (EM / 255, as in training) is inside the network.", "",
        "## Output", "",
        f"Per-channel sigmoid probabilities, float32, axes `{out['axes']}`, channels: "
        f"{', '.join(out['channels'])}. A class's object masks are `p > 0.5` (the evaluators' reading).", "",
        *_scores(doc["provenance"].get("validation")),
        "## Validation", "",
        f"Each weights format reproduces the PyTorch network's output on the test input within "
        f"{doc['parity']['tolerance']:g} (largest absolute difference: "
        + ", ".join(f"{k} {v:.1e}" for k, v in doc["parity"]["max_abs_diff"].items())
        + "). Test input: " + doc["test_input"] + ".", ""])


def description(folder: Path, doc: Mapping[str, Any], zoo: ZooFields, formats: Sequence[str]) -> dict[str, Any]:
    """The `rdf.yaml` content for the member package in `folder` (its files already written)."""
    inp, out = doc["input"], doc["output"]
    vs = inp["voxel_size_nm"]
    spatial = [a for a in inp["axes"][2:]]
    patch = inp["shape"][2:]
    in_axes = [{"type": "batch"}, {"type": "channel", "channel_names": ["em"]},
               *(_space(a, n, vs[a]) for a, n in zip(spatial, patch, strict=True))]
    out_axes = [{"type": "batch"}, {"type": "channel", "channel_names": list(out["channels"])},
                *(_space(a, {"tensor_id": "em", "axis_id": a}, vs[a]) for a in spatial)]
    weights: dict[str, Any] = {}
    if "torchscript" in formats:
        weights["torchscript"] = {**_file(folder, "model.torchscript.pt"), "pytorch_version": doc["torch"].split("+")[0]}  # no local build tag
    if "onnx" in formats:
        weights["onnx"] = {**_file(folder, "model.onnx"), "opset_version": doc["onnx_opset"],
                           **({"parent": "torchscript"} if "torchscript" in weights else {})}
    classes = ", ".join(out["classes"])
    return {
        "format_version": FORMAT_VERSION, "type": "model",
        "name": f"cellseg {doc['architecture']} {len(out['classes'])} organelle classes",
        "description": f"Per-class probabilities of {classes} in FIB-SEM at {vs['z']:g}x{vs['y']:g}x{vs['x']:g} "
                       f"nm ({doc['architecture']}, {doc['preset']}, trained with cellseg)",
        "authors": [{"name": a} for a in zoo.authors],
        **({"maintainers": [{"github_user": m} for m in zoo.maintainers]} if zoo.maintainers else {}),
        "cite": [dict(c) for c in zoo.cite], "license": zoo.license,
        "documentation": _file(folder, "README.md"), "covers": [_file(folder, "cover.png")],
        "tags": ["electron-microscopy", "fib-sem", "semantic-segmentation", "cellmap", "organelles",
                 "3d" if len(spatial) == 3 else "2d", doc["architecture"], *zoo.extra_tags],
        "inputs": [{"id": "em", "axes": in_axes, "test_tensor": _file(folder, "test_input.npy"),
                    "sample_tensor": _file(folder, "sample_input.tif"), "data": {"type": "uint8", "range": [0, 255]},
                    "preprocessing": [{"id": "ensure_dtype", "kwargs": {"dtype": "float32"}}]}],
        "outputs": [{"id": "probabilities", "axes": out_axes, "test_tensor": _file(folder, "test_output.npy"),
                     "sample_tensor": _file(folder, "sample_output.tif"),
                     "data": {"type": "float32", "range": [0.0, 1.0]}}],
        "weights": weights,
        "config": {"cellseg": {"version": doc["cellseg"], "provenance": doc["provenance"]}},
    }


def _summary(content: Mapping[str, Any], root: Path, *, io_checks: bool) -> Any:
    from bioimageio.spec import ValidationContext, build_description

    context = ValidationContext(root=root, perform_io_checks=io_checks, log_warnings=False, disable_cache=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pydantic/imageio notes; the summary is the verdict
        summary = build_description(dict(content), context=context).validation_summary
        gc.collect()  # bioimageio.spec leaves files it hashed open: close them here, where their warning is silenced
    return summary


def validate(path: Path) -> list[str]:
    """Validate `path` (an rdf.yaml) with bioimageio.spec offline; returns the validator's warnings.

    Two passes: the whole description as a format, and, with the files opened and their sha256 recomputed, the
    description less its maintainers (bioimageio.spec asks GitHub whether a maintainer's user name exists when it
    checks files; the zoo does so at upload).

    Raises:
        ImportError: bioimageio.spec missing (names the install command).
        ValueError: the description is invalid (the validator's errors, with their locations).
    """
    try:
        import bioimageio.spec  # noqa: F401
    except ImportError:
        raise ImportError(f"the BioImage.IO description needs bioimageio.spec: {INSTALL_EXPORT} "
                          "(or leave bioimageio out of --format)") from None
    content = yaml.safe_load(path.read_text())
    notes: list[str] = []
    for io_checks, doc in ((False, content), (True, {k: v for k, v in content.items() if k != "maintainers"})):
        summary = _summary(doc, path.parent, io_checks=io_checks)
        where = lambda item: ".".join(map(str, item.loc)) or "(root)"  # noqa: E731
        if summary.status not in ("valid-format", "passed"):
            errors = [f"{where(e)}: {e.msg}" for d in summary.details for e in d.errors]
            raise ValueError(f"{path}: not a valid BioImage.IO description: " + "; ".join(errors or [summary.status]))
        dropped = io_checks and "maintainers" in content  # the second pass's "no maintainers" is of its own making
        notes += [f"{where(w)}: {w.msg}" for d in summary.details for w in d.warnings
                  if not (dropped and "maintainers" in w.msg)]
    return list(dict.fromkeys(notes))
