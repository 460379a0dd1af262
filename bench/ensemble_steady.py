"""Ensemble and post-processing rates on one large crop: seconds per channel-voxel in the steady state.

The test-set benchmark's synthetic crops are small, so its ensemble and post-processing times are mostly the
cost per crop; this prices the voxels. `--members` probability stores of one `--shape`³ crop at 8 nm, each
holding the `--channels` channels real test crop `--crop` is scored on (its labels and their boundary channels,
as `cellseg predict --channels scored` writes them), filled with smooth random probability fields (blobs of
about 16 voxels: they compress and segment like model output, unlike white noise), are combined with
`cellseg.infer.ensemble.ensemble` (uniform weights) and segmented with `postprocess_store` (default
parameters; CUDA when present), each timed; with `--members 1` the one store is segmented (what
`cellseg predict-ensemble` leaves to post-process). The segmentation is then submitted on a `--submit-nm`
grid over the crop's box, every label of crop `--crop` (as `cellseg submit`), and the zip validated with its
data checks (as `cellseg validate-submission`), each timed: seconds per submitted voxel on arrays the size of
the real 2-4 nm crops' (512³ at 4 nm), with objects as many and as compressible as the segmentation's. Writes
`--out` (JSON) for `python -m bench.studies.test_set --rates`.

Usage (GPU host):  python -m bench.ensemble_steady --out OUT/ensemble_steady.json
Smoke (CPU):       python -m bench.ensemble_steady --shape 48 --members 2 --out /tmp/es.json
Fused ensemble:    python -m bench.ensemble_steady --members 1 --out OUT/ensemble_steady_h200.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.record import record_stem

# Only light modules at the top: the process pools of submit and validate spawn workers that import this file
# again, and cellseg.infer.predict (torch, MONAI) would cost each of them seconds.
from cellseg.classes import is_instance
from cellseg.data.crops import Catalog, Crop, Geometry
from cellseg.data.grid import Grid
from cellseg.data.prediction_store import BOUNDARY_SUFFIX, PredictionStore

REPO = Path(__file__).resolve().parents[1]

VOXEL_NM = 8.0
BLOB_VOX = 16  # correlation length of the random fields (voxels)


def all_channels() -> tuple[str, ...]:
    """The 48 classes of configs/data/cellmap.yaml and their boundary channels, as the experiments train them."""
    import yaml

    from cellseg.config.schema import DataConfig

    classes = yaml.safe_load((REPO / "configs" / "data" / "cellmap.yaml").read_text())["data"]["classes"]
    cfg = DataConfig(root=".", classes=tuple(classes))
    return tuple(cfg.classes) + tuple(f"{c}_boundary" for c in cfg.boundary_classes)


def smooth_field(shape: int, rng: np.random.Generator) -> np.ndarray:
    """(shape³) float16 probabilities: coarse Gaussian noise upsampled linearly, through a steep sigmoid."""
    from scipy.ndimage import zoom

    coarse = rng.standard_normal((math.ceil(shape / BLOB_VOX) + 1,) * 3).astype(np.float32)
    fine = zoom(coarse, shape / (coarse.shape[0] - 1), order=1)[:shape, :shape, :shape]
    return (1 / (1 + np.exp(-4 * fine))).astype(np.float16)


def write_members(root: Path, n: int, shape: int, channels: tuple[str, ...], every: tuple[str, ...]) -> list[Path]:
    """`n` probability stores of one crop `crop1` holding `channels` (of the model's `every`)."""
    grid = Grid(translation_nm=(VOXEL_NM / 2,) * 3, shape_vox=(shape,) * 3, voxel_size_nm=(VOXEL_NM,) * 3)
    instance = [c for c in every if not c.endswith(BOUNDARY_SUFFIX) and is_instance(c)]
    paths = []
    for i in range(n):
        rng = np.random.default_rng(i)
        store = PredictionStore.create(root / f"member{i}.zarr", kind="probabilities", channels=every,
                                       instance_channels=instance, provenance={"run_dir": f"synthetic member {i}"})
        writer = store.crop_writer("crop1", grid, channels=channels)
        writer.write_all({c: smooth_field(shape, rng) for c in channels})
        writer.commit({"dataset": "synthetic"})
        paths.append(store.path)
    return paths


def submit_and_validate(work: Path, crop: Crop, shape: int, voxel_nm: float) -> dict:
    """`write_submission` of `work/seg.zarr` (crop1) on a `voxel_nm` grid over its box, for every label of `crop`,
    then `validate_submission` of the zip with its data checks, on threads and then on its default pool
    (processes here); seconds of each and per submitted voxel."""
    from cellseg.eval.submit import write_submission
    from cellseg.eval.validate import validate_submission

    n = round(shape * VOXEL_NM / voxel_nm)
    box = Geometry(voxel_size_nm=(voxel_nm,) * 3, translation_nm=(voxel_nm / 2,) * 3,  # voxel centres, box at 0
                   shape_vox=(n,) * 3)
    probe = {1: Crop(id=1, dataset="synthetic", labels={label: box for label in crop.labels})}
    record: dict = {"submit_voxel_size_nm": voxel_nm, "submitted_arrays": len(crop.labels),
                    "submitted_voxels": n**3 * len(crop.labels)}
    start = time.perf_counter()
    report = write_submission(work / "seg.zarr", probe, work / "submission.zip")
    record["submit_seconds"] = time.perf_counter() - start
    if report.missing:
        raise SystemExit(f"the segmentation lacks {report.missing}")
    start = time.perf_counter()
    validate_submission(work / "submission.zip", probe, read_data=True, processes=False)
    record["validate_threads_seconds"] = time.perf_counter() - start
    start = time.perf_counter()
    issues = validate_submission(work / "submission.zip", probe, read_data=True)
    record["validate_seconds"] = time.perf_counter() - start
    record.update(submission_bytes=(work / "submission.zip").stat().st_size,
                  validate_errors=[str(i) for i in issues if i.severity == "error"][:10],
                  submit_seconds_per_submitted_voxel=record["submit_seconds"] / record["submitted_voxels"],
                  validate_seconds_per_submitted_voxel=record["validate_seconds"] / record["submitted_voxels"])
    return record


def main(argv: list[str] | None = None) -> int:
    """Write the members, time the ensemble and the post-processing, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n")[-1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--members", type=int, default=8,
                        help="member stores (default 8: the full ensemble; 1: no ensemble, the store is segmented)")
    parser.add_argument("--shape", type=int, default=256, help="crop edge in voxels (default 256)")
    parser.add_argument("--crop", type=int, default=983, help="real test crop whose scored channels are used")
    parser.add_argument("--submit-nm", type=float, default=4.0,
                        help="voxel size (nm) of the submission probe over the crop's box (default 4: 512³ arrays "
                             "from a 256³ crop at 8 nm)")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"), help="post-processing device")
    parser.add_argument("--out", type=Path, help="JSON output (default: bench/results/ensemble_steady_<hardware>.json)")
    args = parser.parse_args(argv)

    from cellseg.config.inference import EnsembleConfig
    from cellseg.infer.crop_plan import scored_channels
    from cellseg.infer.ensemble import ensemble
    from cellseg.postprocess.apply import open_probabilities, postprocess_store, resolve
    from cellseg.postprocess.params import ParamSet

    every = all_channels()
    crop = Catalog.official().test("2026")[args.crop]
    channels = scored_channels(every, list(crop.labels))
    channel_voxels = len(channels) * args.shape ** 3
    device = resolve(args.device)
    record: dict = {"benchmark": "ensemble_steady", "members": args.members, "shape_vox": [args.shape] * 3,
                    "crop": args.crop, "channels": list(channels), "channel_voxels": channel_voxels,
                    "device": device, "host": platform.node(),
                    "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
    work = Path(tempfile.mkdtemp(prefix="cellseg-ensemble-steady-"))
    try:
        start = time.perf_counter()
        members = write_members(work, args.members, args.shape, channels, every)
        record["write_members_seconds"] = time.perf_counter() - start
        probabilities = members[0]
        if args.members > 1:
            start = time.perf_counter()
            ensemble(EnsembleConfig(members=tuple(str(m) for m in members)), work / "ensemble.zarr")
            record["ensemble_seconds"] = time.perf_counter() - start
            record["ensemble_seconds_per_channel_voxel"] = record["ensemble_seconds"] / channel_voxels
            probabilities = work / "ensemble.zarr"
        start = time.perf_counter()
        postprocess_store(open_probabilities(probabilities), work / "seg.zarr", params=ParamSet(), device=device,
                          progress=False)
        record["postprocess_seconds"] = time.perf_counter() - start
        record["postprocess_seconds_per_channel_voxel"] = record["postprocess_seconds"] / channel_voxels
        record.update(submit_and_validate(work, crop, args.shape, args.submit_nm))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    args.out = args.out or record_stem("ensemble_steady").with_suffix(".json")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_name(f".{args.out.name}.tmp")
    tmp.write_text(json.dumps(record, indent=1))
    tmp.replace(args.out)
    print(f"{args.members} members × {len(channels)} channels × {args.shape}³: ensemble "
          f"{record.get('ensemble_seconds', 0.0):.1f} s, post-processing ({device}) {record['postprocess_seconds']:.1f} s, "
          f"submit {record['submit_seconds']:.1f} s and validate {record['validate_seconds']:.1f} s (threads {record['validate_threads_seconds']:.1f} s) of "
          f"{record['submitted_voxels'] / 1e9:.2f} G voxels; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
