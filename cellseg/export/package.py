"""`cellseg export`: a trained run, or an ensemble with its decisions, as a self-contained package.

A member package (one run; `model.json`, format "cellseg-export", version 2, kind "model"):

    model.torchscript.pt, model.onnx   the network as graphs that need neither cellseg nor the run
                                       (`cellseg.export.network`: raw EM in, probabilities out, batch axis free,
                                       spatial shape the training patch), each checked against PyTorch
    rdf.yaml, README.md, cover.png,    the BioImage.IO model description, validated with bioimageio.spec
    sample_input.tif, sample_output.tif  (`cellseg.export.bioimageio`)
    test_input.npy, test_output.npy    a patch of the run's own EM (its first validation crop's centre; seeded
                                       noise where no EM is readable, said in model.json) and the output on it
    config.yaml, meta.json,            what cellseg rebuilds the network from (`cellseg predict PACKAGE`, the
    checkpoints/best.pt, datasplit.csv   default backend "torch"): the run's files and the chosen weights alone
    model.json                         axes, patch, voxel size (nm), channels, parity per format, provenance
                                       (run, checkpoint sha256, step, data, the run's result with intervals) and
                                       the sha256 of every other file

An ensemble package (`ensemble.json`, kind "ensemble") holds one member package per run under `members/<name>/` and
the decisions file rewritten to point at them (`decisions.json`: member run directories relative to it, checkpoint
sha256 of the packaged weights), so `cellseg predict-ensemble PACKAGE` and `predict-volume PACKAGE` apply every
decision as from the runs. Packages are written under a temporary name and renamed when complete.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from cellseg import __version__
from cellseg.data.grid import shape3
from cellseg.data.write import EXPORTED_MODEL, atomic_dir
from cellseg.decide.document import Decisions, DecisionsError
from cellseg.export import bioimageio
from cellseg.export.network import (
    ONNX_OPSET,
    PARITY_ATOL,
    example_input,
    exported,
    require,
    require_onnx,
    to_onnx,
    to_torchscript,
)
from cellseg.infer.packaged import FORMAT, GRAPH_FILES, ensemble_decisions, onnx_session, torchscript_quietly
from cellseg.infer.run import LoadedRun, load_run
from cellseg.runtime.checkpoint import file_sha256
from cellseg.runtime.checkpoint import load as load_checkpoint

log = logging.getLogger(__name__)
VERSION = 2  # of model.json and ensemble.json (FORMAT "cellseg-export")
FORMATS = ("torchscript", "onnx", "bioimageio")
RUN_FILES = ("config.yaml", "meta.json", "datasplit.csv")  # copied from the run (datasplit: `--crops val`)
Say = Callable[[str], None]


def parse_formats(text: str) -> tuple[str, ...]:
    """`--format` (comma-separated) as a tuple in `FORMATS` order; bioimageio needs torchscript or onnx weights.

    Raises:
        ValueError: an unknown format (the known ones named), none, or bioimageio alone.
    """
    given = [f.strip() for f in text.split(",") if f.strip()]
    unknown = [f for f in given if f not in FORMATS]
    if unknown or not given:
        raise ValueError(f"--format {text!r}: unknown {', '.join(unknown) or 'empty'}; choose from "
                         f"{', '.join(FORMATS)} (comma-separated)")
    if given == ["bioimageio"]:
        raise ValueError("--format bioimageio describes weights: add torchscript and/or onnx")
    return tuple(f for f in FORMATS if f in given)


# ------------------------------------------------------------------------------------------------ one member


def test_patch(run: LoadedRun, patch: tuple[int, int, int]) -> tuple[torch.Tensor, str]:
    """(1, 1, *patch) uint8-valued float32 EM and where it came from: the centre of the run's first validation
    crop at its voxel size, else (no datasplit, no readable EM) seeded noise."""
    from cellseg.infer.selection import select_targets

    vs = run.cfg.data.voxel_size_nm
    try:
        crop = select_targets("val", run.cfg, run.run_dir)[0]
        centre = [(a + b) / 2 for a, b in zip(crop.start_nm, crop.stop_nm, strict=True)]
        corner = [c - (n - 1) / 2 * v for c, n, v in zip(centre, patch, vs, strict=True)]  # centre of voxel 0
        em = crop.em().read(translation_nm=corner, shape_vox=patch, voxel_size_nm=vs, interpolation="area",
                            pad_value=run.cfg.data.em_pad_value, dtype=np.uint8)
    except (FileNotFoundError, ValueError, OSError) as err:
        log.warning("%s: no EM for the test input (%s): using seeded noise", run.run_dir, err)
        return example_input(patch, run.spatial_dims), "seeded uint8 noise (seed 0; the run's EM was not readable)"
    tensor = torch.from_numpy(em.astype(np.float32))
    tensor = tensor[None] if run.spatial_dims == 2 else tensor[None, None]  # (1, Y, X) -> (1, 1, Y, X)
    where = [round(c, 1) for c in centre]
    return tensor, f"EM of {crop.name} ({crop.dataset}) centred at {where} nm (z, y, x)"


def validation_intervals(result: dict[str, Any] | None) -> dict[str, Any] | None:
    """The run's last validation scores (result.json "val") with crop-bootstrap intervals (`cellseg.eval.noise`:
    the validation crops resampled with replacement, the scores recombined as the metric's era does); None
    without per-crop scores. One crop gives point intervals: they say nothing about noise."""
    val = (result or {}).get("val") or {}
    if not val.get("crop_scores"):
        return None
    from cellseg.decide.bootstrap import KEYS, PARTS, part_draws
    from cellseg.eval.noise import DRAWS, LEVEL, draws, interval

    crops = sorted(val["crop_scores"])
    parts = part_draws(val["crop_scores"], val["metric"], crops, draws(crops))
    finite = lambda v: v if v is not None and math.isfinite(v) else None  # noqa: E731  (JSON has no NaN)
    return {"metric": val["metric"], "crops": crops, "draws": DRAWS, "level": LEVEL,
            **{part: {"score": finite(val.get(KEYS[part])),
                      "interval": [finite(v) for v in interval(parts[part]).to_json()]} for part in PARTS}}


def _run_record(run: LoadedRun) -> dict[str, Any]:
    """The run's provenance: where it was, its checkpoint, step and weights, its data, its validation scores
    with intervals and result.json."""
    path = run.run_dir / "result.json"
    result = json.loads(path.read_text()) if path.is_file() else None
    return {"run_dir": str(run.run_dir.resolve()), "checkpoint": str(run.checkpoint.resolve()),
            "checkpoint_sha256": file_sha256(run.checkpoint), "step": run.step, "weights": run.weights,
            "data_root": str(run.cfg.data.root), "git_commit": run.meta.get("git_commit"),
            "validation": validation_intervals(result), "result": result}


def describe(run: LoadedRun, patch: tuple[int, int, int], parity: dict[str, float], test_input: str
             ) -> dict[str, Any]:
    """`model.json` (without the files' sha256): input, output, parity, provenance."""
    cfg = run.cfg
    axes = "bcyx" if run.spatial_dims == 2 else "bczyx"
    spatial = list(patch[1:] if run.spatial_dims == 2 else patch)
    vs = cfg.data.voxel_size_nm
    return {
        "format": FORMAT, "version": VERSION, "kind": "model", "cellseg": __version__, "torch": str(torch.__version__),
        "architecture": cfg.model.name, "preset": cfg.model.preset, "formats": sorted(parity),
        "onnx_opset": ONNX_OPSET if "onnx" in parity else None,
        "input": {"axes": axes, "shape": [1, 1, *spatial], "batch_axis_free": True, "spatial_shape_fixed": True,
                  "values": "EM intensities 0..255 (uint8, or float holding them)",
                  "normalisation": "divided by 255 inside the network, as in training",
                  "voxel_size_nm": {"z": vs[0], "y": vs[1], "x": vs[2]},
                  "slices": "z" if run.spatial_dims == 2 else None},
        "output": {"axes": axes, "channels": list(run.channels), "classes": list(cfg.data.classes),
                   "activation": "sigmoid (inside the network)", "dtype": "float32",
                   "boundary_channels": [c for c in run.channels if c.endswith("_boundary")]},
        "parity": {"max_abs_diff": parity, "tolerance": PARITY_ATOL, "against": "the PyTorch network, fp32, CPU"},
        "test_input": test_input,
        "provenance": _run_record(run),
    }


def _save_weights(run: LoadedRun, path: Path) -> None:
    """The run's chosen weights (EMA where it kept them) alone, as a checkpoint `load_run` reads."""
    ckpt = load_checkpoint(run.checkpoint)
    state = ckpt["ema"] if run.weights == "ema" else ckpt["model"]
    path.parent.mkdir(parents=True)
    torch.save({"model": state, "step": run.step, "weights": run.weights, "meta": ckpt.get("meta")}, path)


def _file_hashes(folder: Path, skip: str) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): file_sha256(p) for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != skip}


def write_member(run: LoadedRun, folder: Path, formats: Sequence[str], zoo: bioimageio.ZooFields, say: Say
                 ) -> dict[str, Any]:
    """Export `run` into the new folder `folder` (module docstring); returns model.json."""
    patch = shape3(run.cfg.data.patch_shape_vox)
    example, source = test_patch(run, patch)
    wrapped = exported(run.model)
    graphs: dict[str, Any] = {}
    parity: dict[str, float] = {}
    if "torchscript" in formats:
        graphs["torchscript"], parity["torchscript"] = to_torchscript(wrapped, example)
        say(f"  torchscript: traced, within {parity['torchscript']:.1e} of PyTorch")
    if "onnx" in formats:
        graphs["onnx"], parity["onnx"] = to_onnx(wrapped, example)
        say(f"  onnx (opset {ONNX_OPSET}): within {parity['onnx']:.1e} of PyTorch in ONNX Runtime")
    with torch.no_grad():
        expected = wrapped(example).numpy()
    folder.mkdir(parents=True)
    if "torchscript" in graphs:
        with torchscript_quietly():
            torch.jit.save(graphs["torchscript"], str(folder / GRAPH_FILES["torchscript"]))
    if "onnx" in graphs:
        (folder / GRAPH_FILES["onnx"]).write_bytes(graphs["onnx"])
    test_input = example.numpy().astype(np.uint8)
    np.save(folder / "test_input.npy", test_input)
    np.save(folder / "test_output.npy", expected)
    for name in RUN_FILES:
        if (run.run_dir / name).is_file():
            shutil.copy2(run.run_dir / name, folder / name)
    _save_weights(run, folder / "checkpoints" / "best.pt")
    doc = describe(run, patch, parity, source)
    if "bioimageio" in formats:
        bioimageio.write_samples(folder, test_input, expected)
        bioimageio.write_cover(folder, test_input, expected, list(run.channels), run.cfg.data.classes,
                               run.cfg.data.voxel_size_nm)
        (folder / "README.md").write_text(bioimageio.readme(doc))
        rdf = bioimageio.description(folder, doc, zoo, formats)
        (folder / bioimageio.RDF).write_text(yaml.safe_dump(rdf, sort_keys=False, allow_unicode=True))
        for warning in bioimageio.validate(folder / bioimageio.RDF):
            say(f"  bioimageio note: {warning}")
        say("  rdf.yaml: a valid BioImage.IO model description (bioimageio.spec, files hashed)")
    doc["files"] = _file_hashes(folder, "model.json")
    (folder / "model.json").write_text(json.dumps(doc, indent=1) + "\n")
    return doc


def _require(formats: Sequence[str]) -> None:
    """Fail before any work when a format's packages are missing."""
    if "onnx" in formats:
        require_onnx()
    if "bioimageio" in formats:
        require(("bioimageio", "tifffile"), "--format bioimageio")


def export_run(run_dir: str | Path, out: str | Path, *, checkpoint: str = "best",
               formats: Sequence[str] = FORMATS, zoo: bioimageio.ZooFields | None = None, overwrite: bool = False,
               say: Say = log.info) -> dict[str, Any]:
    """Export one run (module docstring); returns its model.json.

    Raises:
        FileNotFoundError, ValueError: what `load_run` raises for a broken run directory (nothing written).
        RuntimeError: a format cannot hold the network, or disagrees with it (nothing written).
        ImportError: a format's packages are missing (names the install command).
        FileExistsError: `out` exists and is not an export cellseg wrote, or `overwrite` is False.
    """
    _require(formats)
    run = load_run(run_dir, checkpoint, device="cpu")
    with atomic_dir(out, overwrite=overwrite, kind=EXPORTED_MODEL) as tmp:
        return write_member(run, tmp, formats, zoo or bioimageio.ZooFields(), say)


# ------------------------------------------------------------------------------------------------ an ensemble


def export_ensemble(decisions_path: str | Path, out: str | Path, *, formats: Sequence[str] = FORMATS,
                    zoo: bioimageio.ZooFields | None = None, overwrite: bool = False, say: Say = log.info
                    ) -> dict[str, Any]:
    """Export every member of a decisions file and the decisions beside them (module docstring); returns
    ensemble.json.

    Raises:
        DecisionsError: the file is unreadable, or a member's run or checkpoint is missing or changed since the
            decisions were made (named; nothing written).
        and what `export_run` raises.
    """
    _require(formats)
    path = Path(decisions_path)
    decisions = Decisions.load(path)
    checkpoint = str(decisions.inference.get("checkpoint", "best"))
    run_dirs = decisions.check_runs(checkpoint=checkpoint)
    doc = json.loads(path.read_text())
    with atomic_dir(out, overwrite=overwrite, kind=EXPORTED_MODEL) as tmp:
        tmp.mkdir(parents=True)
        for member, record, run_dir in zip(doc["members"], decisions.members, run_dirs, strict=True):
            say(f"member {record.name} ({record.architecture}) from {run_dir}")
            folder = Path("members") / record.name
            write_member(load_run(run_dir, checkpoint, device="cpu"), tmp / folder, formats,
                         zoo or bioimageio.ZooFields(), say)
            member["run_dir"] = folder.as_posix()  # relative to decisions.json (`Decisions.load`)
            member["checkpoint"] = "best"
            member["checkpoint_sha256"] = file_sha256(tmp / folder / "checkpoints" / "best.pt")
        doc["inference"] = {**doc["inference"], "checkpoint": "best"}
        (tmp / "decisions.json").write_text(json.dumps(doc, indent=1) + "\n")
        Decisions.load(tmp / "decisions.json").check_runs(checkpoint="best")  # the package applies as written
        ensemble = {"format": FORMAT, "version": VERSION, "kind": "ensemble", "cellseg": __version__,
                    "members": [m.name for m in decisions.members], "formats": list(formats),
                    "decisions": {"source": str(path.resolve()), "sha256": file_sha256(path)},
                    "files": _file_hashes(tmp, "ensemble.json")}
        (tmp / "ensemble.json").write_text(json.dumps(ensemble, indent=1) + "\n")
    return ensemble


# ------------------------------------------------------------------------------------------------ checking


def _check_files(folder: Path, files: dict[str, str]) -> None:
    for name, digest in files.items():
        if not (folder / name).is_file():
            raise ValueError(f"{folder / name}: missing from the package (listed in its description)")
        if file_sha256(folder / name) != digest:
            raise ValueError(f"{folder / name}: sha256 differs from the package's: the package was changed")


def check_member(folder: Path) -> dict[str, float]:
    """A member package's files against their sha256, then each graph on the test input against the test output
    (ONNX only where onnxruntime is installed, else noted); returns format → largest absolute difference."""
    doc = json.loads((folder / "model.json").read_text()) if (folder / "model.json").is_file() else {}
    if doc.get("format") != FORMAT:
        raise ValueError(f"{folder}: not a cellseg export (no model.json of format {FORMAT!r})")
    _check_files(folder, doc["files"])
    em = np.load(folder / "test_input.npy")
    want = np.load(folder / "test_output.npy")
    diffs: dict[str, float] = {}
    if (folder / GRAPH_FILES["torchscript"]).is_file():
        with torchscript_quietly():
            graph = torch.jit.load(str(folder / GRAPH_FILES["torchscript"]), map_location="cpu")
        with torch.no_grad():
            diffs["torchscript"] = float(np.abs(graph(torch.from_numpy(em)).numpy() - want).max())
    if (folder / GRAPH_FILES["onnx"]).is_file():
        try:
            session = onnx_session(str(folder / GRAPH_FILES["onnx"]))
        except ImportError as err:
            log.warning("%s: ONNX graph not run: %s", folder, err)
        else:
            got = session.run(None, {"em": em.astype(np.float32)})[0]
            diffs["onnx"] = float(np.abs(got - want).max())
    bad = {k: v for k, v in diffs.items() if not (math.isfinite(v) and v <= PARITY_ATOL)}
    if bad:
        raise ValueError(f"{folder}: output on the test input differs: "
                         + ", ".join(f"{k} by {v:.2e}" for k, v in bad.items()) + f" (> {PARITY_ATOL:g})")
    return diffs


def check_export(path: str | Path) -> dict[str, dict[str, float]]:
    """Check a member or ensemble package (sha256 of every file, every graph on its test input); returns
    member folder → format → largest absolute difference.

    Raises:
        ValueError: not a package, a missing or changed file, or an output off by more than `PARITY_ATOL`.
    """
    path = Path(path)
    decisions = ensemble_decisions(path)
    if decisions is None:
        return {str(path): check_member(path)}
    doc = json.loads((path / "ensemble.json").read_text())
    _check_files(path, doc["files"])
    try:
        Decisions.load(decisions).check_runs(checkpoint="best")
    except DecisionsError as err:
        raise ValueError(str(err)) from None
    return {str(path / "members" / name): check_member(path / "members" / name) for name in doc["members"]}
