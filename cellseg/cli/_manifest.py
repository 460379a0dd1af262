"""The test crops `submit` writes a submission for and `validate-submission` checks it against, found the same
way by both (so that a submission written with defaults validates with defaults)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cellseg.data.crops import Crop


def add_manifest_args(parser: argparse.ArgumentParser, *, default: str) -> None:
    """--manifest, --truth and --data-root; `default` says where the crops come from without them."""
    parser.add_argument("--manifest", help=f"test_crop_manifest.csv (default: {default})")
    parser.add_argument("--truth", metavar="TRUTH",
                        help="take the crops and their grids from a ground-truth store instead of a manifest (e.g. "
                             "the validation crops' truth `cellseg truth` wrote)")
    parser.add_argument("--data-root", metavar="ROOT", help="take ROOT/test_crop_manifest.csv as the manifest")


def test_crops(args: argparse.Namespace, *, recorded_root: Path | None = None, submission: str | None = None
               ) -> tuple[Mapping[int, Crop], str]:
    """The test crops and where they came from, the first of: --manifest, --truth, --data-root's manifest, the
    manifest a cellseg submission records it was written for (`submission`), the test manifest of the data root
    the predictions record (`recorded_root`), the packaged official manifest of `args.metric`.

    Raises:
        ValueError: --manifest and --truth together.
        FileNotFoundError: --data-root without a test_crop_manifest.csv.
    """
    from cellseg.eval.submit import load_manifest

    if args.manifest and args.truth:
        raise ValueError("give --manifest or --truth, not both")
    if args.manifest:
        return load_manifest(args.manifest), args.manifest
    if args.truth:
        from cellseg.eval.io import open_source
        from cellseg.eval.validate import crops_from_truth

        return crops_from_truth(open_source(args.truth)), f"the crops of the truth store {args.truth}"
    if args.data_root:
        path = Path(args.data_root) / "test_crop_manifest.csv"
        if not path.is_file():
            raise FileNotFoundError(f"--data-root {args.data_root}: no test_crop_manifest.csv there (a root from "
                                    "`cellseg import` has one only with --test-box); pass --manifest")
        return load_manifest(path), f"{path} (--data-root)"
    if submission is not None:
        from cellseg.eval.io import open_source
        from cellseg.eval.submit import recorded_manifest

        try:
            recorded = recorded_manifest(open_source(submission))
        except ValueError:  # not a readable store: the validator reports that itself
            recorded = None
        if recorded is not None:
            return recorded
    path = recorded_root / "test_crop_manifest.csv" if recorded_root is not None else None
    if path is not None and path.is_file():
        return load_manifest(path), f"{path} (the data root the predictions record)"
    from cellseg.data.crops import Catalog
    from cellseg.eval.eras import get_era

    version = get_era(args.metric).test_manifest
    return Catalog.official().test(version), f"the packaged official {version} test manifest"
