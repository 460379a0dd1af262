"""Ready-to-train configs for an imported root: `ROOT/data.yaml` and one `ROOT/train_<model>.yaml` per experiment.

What a run needs to know about the root (where it is, its datasplit, its classes, its voxel size, the
axes 2D patches may be cut across) goes into `ROOT/data.yaml`, a `data:` section. Each experiment in
`configs/experiments/imported_*.yaml` (the model, the training schedule, 2D patches across z) gets a
two-line wrapper that includes the experiment and then `data.yaml`:

    # ROOT/train_unet_2d.yaml
    include: [/path/to/cellseg/configs/experiments/imported_unet_2d.yaml, data.yaml]
    run_dir: runs/<dataset>/unet_2d

so `cellseg train ROOT/train_unet_2d.yaml` trains with no override (any `key=value` still applies).
Every wrapper is loaded once with the strict config loader before the root is finished.

The training grid is the EM's s0 voxel size; 2D patches are cut across z only for anisotropic data, across
z, y and x when the voxels are isotropic (within 1 %).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import yaml

from cellseg.config import load_run_config

log = logging.getLogger(__name__)
EXPERIMENT_GLOB = "imported_*.yaml"
ISOTROPY_RTOL = 0.01  # voxel sizes within 1 % count as equal


def default_experiments() -> list[Path]:
    """`configs/experiments/imported_*.yaml` of the working directory, else of the checkout cellseg runs from."""
    for base in (Path.cwd(), Path(__file__).resolve().parents[2]):
        found = sorted((base / "configs" / "experiments").glob(EXPERIMENT_GLOB))
        if found:
            return found
    return []


def slice_axes(voxel_size_nm: Sequence[float]) -> list[str]:
    """Axes 2D patches may be cut across: all three for isotropic voxels, else z only."""
    isotropic = max(voxel_size_nm) <= min(voxel_size_nm) * (1 + ISOTROPY_RTOL)
    return ["z", "y", "x"] if isotropic else ["z"]


def data_section(root: Path, *, classes: Sequence[str], voxel_size_nm: Sequence[float]) -> dict[str, object]:
    """The `data:` keys describing an imported root (absolute paths)."""
    return {"root": str(root), "datasplit": str(root / "datasplit.csv"), "classes": list(classes),
            "voxel_size_nm": [float(v) for v in voxel_size_nm], "slice_axes": slice_axes(voxel_size_nm)}


def _model_name(experiment: Path) -> str:
    return experiment.stem.removeprefix("imported_")


def write_configs(build_dir: Path, *, final_root: Path, dataset: str, classes: Sequence[str],
                  voxel_size_nm: Sequence[float], experiments: Sequence[str | Path] | None) -> list[Path]:
    """Write `data.yaml` and the wrappers into `build_dir` (the root under construction); returns the
    wrapper names (relative to the root).

    Args:
        experiments: experiment configs to wrap; None: `default_experiments()`.

    Raises:
        FileNotFoundError: an experiment file is missing.
        ValueError: a wrapper does not load (the config loader's message, naming the experiment).
    """
    header = (f"# The data section of the imported root {final_root} (written by `cellseg import`).\n"
              f"# Include it after an experiment config, as the train_*.yaml files here do.\n")
    section = {"data": data_section(final_root, classes=classes, voxel_size_nm=voxel_size_nm)}
    (build_dir / "data.yaml").write_text(header + yaml.safe_dump(section, sort_keys=False, default_flow_style=None))
    paths = [Path(p) for p in experiments] if experiments is not None else default_experiments()
    if experiments is None and not paths:
        log.warning("no configs/experiments/%s found (run from a cellseg checkout or pass --experiments): wrote "
                    "data.yaml only", EXPERIMENT_GLOB)
    written = []
    for experiment in paths:
        if not experiment.is_file():
            raise FileNotFoundError(f"--experiments {experiment}: no such config file")
        name = _model_name(experiment)
        wrapper = build_dir / f"train_{name}.yaml"
        body = {"include": [str(experiment.resolve()), "data.yaml"], "run_dir": f"runs/{dataset}/{name}"}
        wrapper.write_text(f"# Train on {final_root}: cellseg train {final_root / wrapper.name} [key=value ...]\n"
                           + yaml.safe_dump(body, sort_keys=False, default_flow_style=None))
        try:
            load_run_config(wrapper)
        except ValueError as err:
            raise ValueError(f"--experiments {experiment}: does not combine with the imported data: {err}") from None
        written.append(Path(wrapper.name))
    return written
