"""`cellseg fetch`: download the EM and ground truth of selected CellMap crops (see `cellseg.fetch.download`)."""

from __future__ import annotations

import argparse
import sys

ORDER = 30

DESCRIPTION = """\
Download the data of selected crops from the public CellMap bucket (or any data root with manifests),
mirroring its layout under DEST: DEST/<dataset>/<dataset>.zarr/recon-1/em/fibsem-uint8/s<N> and
.../recon-1/labels/groundtruth/crop<ID>/<class>/s<N>, with the .zgroup/.zattrs/.zarray of every node on
the way, so the result opens with zarr and cellseg. DEST also gets manifest.csv (relative URLs),
train_crop_manifest.csv and test_crop_manifest.csv describing what was fetched (merged across runs), so
it works as a data root and as --catalog for another fetch.

What is fetched:
  EM     only the chunks overlapping each crop's box plus --padding-vox voxels of each level, at the
         levels whose voxel size is > 0.8 x the crop's annotation voxel size on every axis (the
         annotation resolution and all coarser ones; the challenge toolbox's default), or at every
         level with --em-levels all. Chunk keys are computed from .zarray; the bucket is never listed.
  labels every level of each selected class of each training crop (small). Test crops: EM only, their
         ground truth is hidden. The 'all' array of a crop is not fetched.

Resuming: chunks are written to a temporary file and renamed when complete, so an existing chunk
file is complete and is skipped; re-run the same command after an interruption to fetch only what is
missing. Chunks the server does not have (HTTP 403/404: empty space, read as the fill value) are
recorded in <array>/.cellseg-fetch.json and not requested again (--recheck-absent asks again).

--dry-run prints, per dataset, crop and array, the levels, the number of chunks and their size
(HEAD requests only; above 2,000 chunks a fixed sample per dataset/level is sized and the total is
marked as estimated), then the total. Nothing is downloaded.

Exit status: 0 when everything planned is present, 1 when chunks failed (listed at the end; re-run to
resume) or the server cannot be reached, 2 for bad arguments (unknown crops, datasets or classes)."""

EPILOG = """\
examples:
  cellseg fetch --dest data --crops 155,177 --dry-run
  cellseg fetch --dest data --datasets jrc_hela-2 --classes mito,er --padding-vox 32
  cellseg fetch --dest data --crops test                  # EM of the 16 test crops
  cellseg fetch --dest mirror --catalog http://host/data  # from another data root"""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `fetch` sub-command."""
    from cellseg.fetch.download import DEFAULT_PADDING_VOX, DEFAULT_WORKERS

    parser = subparsers.add_parser("fetch", help="download EM and ground truth of selected crops (resumable)",
                                   description=DESCRIPTION, epilog=EPILOG,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dest", required=True, metavar="DIR", help="destination root (created if needed)")
    parser.add_argument("--catalog", default="official", metavar="official|PATH|URL",
                        help="where crops are described: the packaged official manifests (default; data from "
                             "s3://janelia-cosem-datasets), or a data root (path or http(s)/s3 URL) holding "
                             "manifest.csv and train_crop_manifest.csv; relative URLs resolve against it")
    parser.add_argument("--crops", default="all", metavar="all|train|test|ID,...",
                        help="'all' = training and test crops (default), 'train', 'test' (EM only), or ids")
    parser.add_argument("--datasets", metavar="NAME,...", help="only crops of these datasets")
    parser.add_argument("--classes", metavar="NAME,...|tested",
                        help="only these label classes ('tested' = the 48 scored ones); crops listing none of "
                             "them are skipped; default: every class of each crop")
    parser.add_argument("--padding-vox", type=int, default=DEFAULT_PADDING_VOX, metavar="N",
                        help="EM voxels of context around each crop, at every level (default %(default)s)")
    parser.add_argument("--em-levels", default="matched", metavar="matched|all|NM",
                        help="'matched': levels not finer than 0.8 x the annotation voxel size (default); "
                             "'all': every EM level; NM (e.g. 8): the levels matched to NM nm or to the crop, "
                             "whichever is finer (8 nm models predicting 16 nm test crops: --em-levels 8)")
    parser.add_argument("--no-labels", dest="labels", action="store_false", help="fetch EM only")
    parser.add_argument("--workers", type=int, default=DEFAULT_WORKERS, metavar="N",
                        help="parallel requests (default %(default)s)")
    parser.add_argument("--dry-run", action="store_true", help="print what would be downloaded and its size")
    parser.add_argument("--refresh-metadata", action="store_true",
                        help="re-read .zattrs/.zarray/.zgroup from the source even when DEST has them")
    parser.add_argument("--recheck-absent", action="store_true",
                        help="request again chunks an earlier run found absent at the source")
    parser.set_defaults(func=run)


def _names(text: str | None) -> list[str] | None:
    return [t.strip() for t in text.split(",") if t.strip()] if text else None


def run(args: argparse.Namespace) -> int:
    """Plan, then download or size; print the summary."""
    from cellseg.fetch.download import check_options, fetch, load_catalog

    check_options(padding_vox=args.padding_vox, workers=args.workers)  # before the catalog is read (maybe remotely)
    try:
        result = fetch(load_catalog(args.catalog), args.dest, crops=args.crops, datasets=_names(args.datasets),
                       classes=args.classes, padding_vox=args.padding_vox, em_levels=args.em_levels,
                       labels=args.labels, workers=args.workers, dry_run=args.dry_run,
                       refresh_metadata=args.refresh_metadata, recheck_absent=args.recheck_absent,
                       progress=not args.quiet)
    except (FileNotFoundError, ValueError):
        raise  # the dispatcher prints these as usage errors
    except OSError as err:
        print(f"cellseg fetch: error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("cellseg fetch: interrupted; re-run the same command to resume", file=sys.stderr)
        return 130
    if args.dry_run:
        print(result.format(verbose=args.verbose > 0))  # type: ignore[union-attr]
        return 0
    print(result.summary())  # type: ignore[union-attr]
    return 0 if result.ok else 1  # type: ignore[union-attr]
