"""`cellseg fetch`: download the EM and ground truth of selected CellMap crops, resumably.

`fetch` runs the whole thing: select crops (`select.select_targets`), read the metadata and list the
chunks they need (`fetch_plan.build_plan`: matched EM levels, crop box plus padding, every label
level), then either size the download without fetching anything (`dry_run=True`,
`size.estimate`) or download it (`execute`) and record what was fetched in DEST's manifests.

Resuming
    Every chunk is written to a hidden temporary file (`.<key>.part-<random>`) in its directory and
    renamed into place once complete, so a chunk file that exists is complete by construction and is
    skipped by the next run; an interruption (Ctrl-C, kill, lost connection) leaves no partial chunk.
    Re-running the same command downloads only what is missing. (A kill between the write and the
    rename can leave a hidden `.part-` file; readers ignore it and it is never mistaken for a chunk.)

Absent chunks
    A chunk the server does not have (HTTP 403/404) is legitimate: zarr reads it as the fill value
    (empty space outside the imaged cell, never-written label blocks). Absent keys are recorded in a
    small ledger per array, `<array>/.cellseg-fetch.json` (`{"source": url, "absent": [keys]}`), written
    atomically when the run ends (also on Ctrl-C), so that resuming does not re-request them forever.
    `recheck_absent=True` ignores the ledger; deleting the file has the same effect. zarr and
    tensorstore ignore the file.

Manifests
    After a complete run, DEST gets `manifest.csv` (relative URLs), `train_crop_manifest.csv` and
    `test_crop_manifest.csv` restricted to the fetched crops and classes and merged with rows already
    there, so `Catalog.from_dir(DEST)` describes everything fetched into DEST so far. With
    `labels=False` the training rows still list the selected classes (their geometry describes the
    crop) although their arrays were not fetched. Metadata and manifest files are written atomically.

Failures
    Transient HTTP errors are retried by `stores.http_get`. A chunk that still fails is reported at the
    end (the run's `FetchReport.ok` is False and no manifest is written); after
    `MAX_CONSECUTIVE_FAILURES` failures in a row with no success the run stops early, since the server
    is then most likely unreachable.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import os
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

from cellseg.data import chunks as local_chunks
from cellseg.data.chunks import LEDGER, read_ledger
from cellseg.data.crops import Catalog, Geometry, format_vector
from cellseg.data.stores import resolve
from cellseg.fetch.fetch_plan import (
    ArrayFetch,
    Chunk,
    FetchPlan,
    MetaFile,
    build_plan,
    pending_chunks,
    relative_path,
)
from cellseg.fetch.select import Target, select_targets
from cellseg.fetch.size import SizeReport, estimate, format_bytes, probe

log = logging.getLogger(__name__)

DEFAULT_WORKERS = 16
DEFAULT_PADDING_VOX = 64
MAX_CONSECUTIVE_FAILURES = 64
_IN_FLIGHT_PER_WORKER = 4  # queued downloads per worker: keeps memory flat for millions of chunks
TRAIN_COLUMNS = ("crop_name", "dataset", "class_label", "voxel_size", "translation", "shape")
URL_COLUMNS = ("crop_number", "collection", "alignment", "crop_url", "em_url")


# ------------------------------------------------------------------------------------------ small file I/O


def _write_atomic(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a temporary sibling and a rename: readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.part-{uuid.uuid4().hex[:8]}")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _update_ledger(array_dir: Path, source: str, absent: Iterable[str]) -> None:
    """Merge `absent` into the ledger, dropping keys that have since appeared locally."""
    keys = {k for k in read_ledger(array_dir) | set(absent) if not (array_dir / k).exists()}
    _write_atomic(array_dir / LEDGER, json.dumps({"source": source, "absent": sorted(keys)}, indent=0).encode())


def write_metadata(files: Sequence[MetaFile], dest: Path) -> None:
    """Mirror metadata files under `dest` (in order: markers last), rewriting only changed ones."""
    for meta in files:
        path = dest / meta.rel_path
        if path.is_file() and path.read_bytes() == meta.data:
            continue
        if path.is_file():
            log.warning("%s changed at the source; replacing the local copy", path)
        _write_atomic(path, meta.data)


# ---------------------------------------------------------------------------------------------- chunks


def download_chunk(array: ArrayFetch, key: str, dest: Path) -> int | None:
    """Fetch one chunk into `dest`; its size in bytes, or None when absent at the source."""
    data = array.source.read_bytes(key)
    if data is None:
        return None
    _write_atomic(dest / array.rel_path / key, data)
    return len(data)


@dataclass(kw_only=True)
class FetchReport:
    """What a download run did."""

    num_files: int = 0
    num_bytes: int = 0
    seconds: float = 0.0
    num_present: int = 0
    num_known_absent: int = 0
    num_new_absent: int = 0
    failures: list[tuple[str, str]] = field(default_factory=list)  # (url, error)
    aborted: bool = False

    @property
    def ok(self) -> bool:
        """True when every planned chunk is now present or known absent."""
        return not self.failures and not self.aborted

    def summary(self) -> str:
        """One summary line, followed by the failures when there are any."""
        rate = self.num_bytes / max(self.seconds, 1e-6) / 1e6
        line = (f"fetched {self.num_files:,} files ({format_bytes(self.num_bytes)}) in {self.seconds:.1f} s "
                f"({rate:.1f} MB/s); skipped {self.num_present:,} already present and "
                f"{self.num_known_absent:,} known absent; {self.num_new_absent:,} absent at the source")
        if self.ok:
            return line
        lines = [line, f"{len(self.failures):,} chunk(s) FAILED" + (" and the run stopped early after "
                 "too many failures in a row" if self.aborted else "") + ":"]
        lines += [f"  {url}: {error}" for url, error in self.failures[:20]]
        if len(self.failures) > 20:
            lines.append(f"  ... and {len(self.failures) - 20:,} more")
        lines.append("re-run the same command to fetch what is missing")
        return "\n".join(lines)


def check_options(*, padding_vox: int, workers: int) -> None:
    """Refuse a negative `padding_vox` and fewer than 1 worker (`--padding-vox`, `--workers`).

    Raises:
        ValueError: naming the option and the value.
    """
    if padding_vox < 0:
        raise ValueError(f"--padding-vox must be 0 or more voxels of context, got {padding_vox}")
    if workers < 1:
        raise ValueError(f"--workers must be at least 1, got {workers}")


class _Downloader:
    """Runs chunk downloads on a bounded thread pool and keeps the counts, ledgers and progress bar."""

    def __init__(self, dest: Path, *, workers: int, progress: bool, max_consecutive_failures: int):
        from tqdm import tqdm

        self.dest, self.workers, self.max_failures = dest, max(1, workers), max_consecutive_failures
        self.report = FetchReport()
        self.absent: dict[str, tuple[str, set[str]]] = {}
        self.consecutive_failures = self.done = self.total = 0
        self.bar = tqdm(total=None, unit="B", unit_scale=True, disable=not progress, dynamic_ncols=True,
                        desc="fetch", smoothing=0.05)

    def run(self, chunks: Sequence[Chunk]) -> None:
        self.total = len(chunks)
        todo: Iterator[Chunk] = iter(chunks)
        in_flight: dict[Future[int | None], Chunk] = {}
        with ThreadPoolExecutor(max_workers=self.workers) as pool:
            try:
                while True:
                    while len(in_flight) < self.workers * _IN_FLIGHT_PER_WORKER and not self.report.aborted:
                        chunk = next(todo, None)
                        if chunk is None:
                            break
                        in_flight[pool.submit(download_chunk, *chunk, self.dest)] = chunk
                    if not in_flight:
                        break
                    finished, _ = wait(in_flight, return_when=FIRST_COMPLETED)
                    for future in finished:
                        self._finished(in_flight.pop(future), future)
            finally:
                for future in in_flight:
                    future.cancel()
                self._flush_ledgers()
                self.bar.close()

    def _finished(self, chunk: Chunk, future: Future[int | None]) -> None:
        array, key = chunk
        self.done += 1
        try:
            size = future.result()
        except Exception as err:  # any failure of one chunk is reported, the run goes on
            self.report.failures.append((array.source.join(key).url, f"{type(err).__name__}: {err}"))
            self.consecutive_failures += 1
            self.report.aborted = self.consecutive_failures >= self.max_failures
            return
        self.consecutive_failures = 0
        if size is None:
            self.report.num_new_absent += 1
            self.absent.setdefault(array.rel_path, (array.source.url, set()))[1].add(key)
        else:
            self.report.num_files += 1
            self.report.num_bytes += size
            self._advance(size)

    def _advance(self, size: int) -> None:
        # The total is estimated from the mean chunk size so far, which gives tqdm an ETA.
        mean = self.report.num_bytes / max(1, self.report.num_files)
        self.bar.total = int(self.report.num_bytes + mean * (self.total - self.done))
        self.bar.set_postfix_str(f"{self.done:,}/{self.total:,} files", refresh=False)
        self.bar.update(size)

    def _flush_ledgers(self) -> None:
        for rel_path, (source, keys) in self.absent.items():
            _update_ledger(self.dest / rel_path, source, keys)


def execute(plan: FetchPlan, dest: str | os.PathLike[str], *, workers: int = DEFAULT_WORKERS, progress: bool = True,
            recheck_absent: bool = False, max_consecutive_failures: int = MAX_CONSECUTIVE_FAILURES) -> FetchReport:
    """Download what `plan` lists and `dest` lacks: metadata first, then the chunks in parallel."""
    dest = Path(dest)
    start = time.monotonic()
    write_metadata(plan.metadata, dest)
    pending = pending_chunks(plan, dest, recheck_absent=recheck_absent)
    log.info("%s chunks to request (%s present, %s known absent)", f"{len(pending.chunks):,}",
             f"{pending.num_present:,}", f"{pending.num_known_absent:,}")
    downloader = _Downloader(dest, workers=workers, progress=progress,
                             max_consecutive_failures=max_consecutive_failures)
    downloader.run(pending.chunks)
    local_chunks.forget()  # a read later in this process sees the new chunks and ledgers
    report = downloader.report
    report.num_present, report.num_known_absent = pending.num_present, pending.num_known_absent
    report.seconds = time.monotonic() - start
    return report


# ------------------------------------------------------------------------------------------- manifests


def _geometry_row(crop_id: int, dataset: str, name: str, g: Geometry) -> dict[str, str]:
    shape = "[" + ";".join(str(int(n)) for n in g.shape_vox) + "]"
    return dict(zip(TRAIN_COLUMNS, (str(crop_id), dataset, name, format_vector(g.voxel_size_nm),
                                    format_vector(g.translation_nm), shape), strict=True))


def _merge_csv(path: Path, columns: Sequence[str], rows: Iterable[dict[str, str]], key: Sequence[str]) -> None:
    """Write `rows` into the CSV at `path`, replacing rows with the same key and keeping the others."""
    merged: dict[tuple[str, ...], dict[str, str]] = {}
    if path.is_file():
        with path.open(newline="") as f:
            merged = {tuple(r[k] for k in key): r for r in csv.DictReader(f)}
    merged.update({tuple(r[k] for k in key): r for r in rows})
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(columns), extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for k in sorted(merged, key=lambda k: (int(k[0]), *k[1:])):
        writer.writerow(merged[k])
    _write_atomic(path, out.getvalue().encode())


def write_manifests(catalog: Catalog, plan: FetchPlan, dest: str | os.PathLike[str]) -> None:
    """Record the fetched crops in DEST's manifests (merged with earlier fetches into the same DEST)."""
    dest = Path(dest)
    missing = set(plan.missing_labels)
    train = [t for t in plan.targets if t.split == "train"]
    test = [t for t in plan.targets if t.split == "test"]

    def rows(targets: Sequence[Target]) -> list[dict[str, str]]:
        return [_geometry_row(t.crop.id, t.crop.dataset, n, t.crop.labels[n])
                for t in targets for n in t.classes if (t.crop.id, n) not in missing]

    urls = []
    for t in train:
        em_rel = relative_path(catalog.locate(t.em_url), t.crop.dataset)
        crop_rel = relative_path(catalog.locate(t.crop_url), t.crop.dataset)
        urls.append(dict(zip(URL_COLUMNS, (str(t.crop.id), t.crop.dataset, em_rel.split("/")[2], crop_rel, em_rel),
                             strict=True)))
    _merge_csv(dest / "manifest.csv", URL_COLUMNS, urls, ("crop_number",))
    _merge_csv(dest / "train_crop_manifest.csv", TRAIN_COLUMNS, rows(train), ("crop_name", "class_label"))
    _merge_csv(dest / "test_crop_manifest.csv", TRAIN_COLUMNS, rows(test), ("crop_name", "class_label"))


# ------------------------------------------------------------------------------------------- the command


def load_catalog(spec: str) -> Catalog:
    """`official` (the packaged manifests, s3:// URLs), or a data root path or URL with manifests.

    Raises:
        OSError: the server of a URL cannot be reached.
        FileNotFoundError: the root has no `train_crop_manifest.csv`.
    """
    if spec == "official":
        return Catalog.official()
    location = resolve(spec)
    probe(location)
    return Catalog.from_dir(location)


def fetch(catalog: Catalog, dest: str | os.PathLike[str], *, crops: str | Sequence[int] = "all",
          datasets: Sequence[str] | None = None, classes: str | Sequence[str] | None = None,
          padding_vox: int = DEFAULT_PADDING_VOX, em_levels: str = "matched", labels: bool = True,
          workers: int = DEFAULT_WORKERS, dry_run: bool = False, refresh_metadata: bool = False,
          recheck_absent: bool = False, progress: bool = True) -> FetchReport | SizeReport:
    """Select crops, plan their chunks and download them into `dest` (or only size them: `dry_run`).

    The arguments mirror `cellseg fetch` (see `select.select_targets` and `plan.build_plan`).

    Raises:
        ValueError: unknown crops, datasets or classes; bad options; malformed metadata.
        OSError: the source server cannot be reached.
    """
    check_options(padding_vox=padding_vox, workers=workers)  # before any request: bad arguments, not the network
    dest = Path(dest)
    targets = select_targets(catalog, crops=crops, datasets=datasets, classes=classes)
    probe(catalog.locate(targets[0].em_url))
    log.info("planning %d crop(s) in %d dataset(s)", len(targets), len({t.crop.dataset for t in targets}))
    plan = build_plan(catalog, targets, dest=dest, padding_vox=padding_vox, em_levels=em_levels, labels=labels,
                      refresh_metadata=refresh_metadata, workers=workers)
    if dry_run:
        return estimate(plan, dest, workers=workers, recheck_absent=recheck_absent)
    report = execute(plan, dest, workers=workers, progress=progress, recheck_absent=recheck_absent)
    if report.ok:
        write_manifests(catalog, plan, dest)
    return report
