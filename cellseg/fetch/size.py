"""HEAD requests for `cellseg fetch`: sizing a plan without downloading it (`--dry-run`) and probing a server.

Sizing (`estimate`)
    Each chunk still to fetch (not in DEST, not recorded absent) gets a HEAD request for its
    Content-Length, in parallel, when there are at most `MAX_EXACT_HEADS` of them. Beyond that the
    chunks are grouped by (dataset, EM or labels, level), the groups chunk sizes depend on; up to
    `SAMPLE_PER_STRATUM` keys per group, drawn with a fixed seed, are sized and each group's total is
    its sample mean × its count. The report then says "estimated". A chunk answered 403/404 is absent at
    the source and counts 0 bytes. No chunk body is downloaded.

EM chunks shared by several crops of a dataset count in each crop's row but once in the dataset and
grand totals.
"""

from __future__ import annotations

import random
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from cellseg.data import stores
from cellseg.data.stores import Location
from cellseg.fetch.fetch_plan import ArrayFetch, Chunk, FetchPlan, pending_chunks

MAX_EXACT_HEADS = 2000
SAMPLE_PER_STRATUM = 32
PROBE_TIMEOUT_S = 15.0


def format_bytes(num_bytes: float) -> str:
    """`1234567` → `1.2 MB` (decimal units, like tqdm's)."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(num_bytes) < 1000 or unit == "TB":
            return f"{num_bytes:.0f} {unit}" if unit == "B" else f"{num_bytes:.1f} {unit}"
        num_bytes /= 1000
    raise AssertionError("unreachable")


def http_content_length(url: str, *, timeout_s: float = stores.HTTP_TIMEOUT_S) -> int | None:
    """HEAD `url`: its Content-Length, or None when absent (403/404); transient errors are retried.

    Raises:
        OSError: the server keeps failing or answers another error status.
    """
    request = urllib.request.Request(url, method="HEAD")
    retries = stores.HTTP_RETRIES
    for attempt in range(retries):
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                return int(response.headers.get("Content-Length", 0))
        except urllib.error.HTTPError as err:
            err.close()
            if err.code in (403, 404):
                return None
            if err.code < 500 or attempt == retries - 1:
                raise OSError(f"{url}: HTTP {err.code} {err.reason}") from None
        except (urllib.error.URLError, TimeoutError, ConnectionError) as err:
            if attempt == retries - 1:
                raise OSError(f"{url}: {getattr(err, 'reason', err)}") from None
        time.sleep(0.5 * 2**attempt)
    raise AssertionError("unreachable")


def chunk_size(array: ArrayFetch, key: str) -> int | None:
    """Stored size of one chunk at the source, or None when absent."""
    if array.source.kind == "file":
        path = Path(array.source.url, key)
        return path.stat().st_size if path.is_file() else None
    return http_content_length(array.source.join(key).url)


def probe(location: Location) -> None:
    """Check that the server of `location` answers at all (any HTTP status will do).

    Raises:
        OSError: no answer (DNS failure, connection refused, timeout).
        FileNotFoundError: a local location that does not exist.
    """
    if location.kind == "file":
        if not Path(location.url).exists():
            raise FileNotFoundError(f"{location}: no such file or directory")
        return
    parts = urllib.parse.urlparse(location.url)
    try:
        with urllib.request.urlopen(urllib.request.Request(f"{parts.scheme}://{parts.netloc}/", method="HEAD"),
                                    timeout=PROBE_TIMEOUT_S):
            pass
    except urllib.error.HTTPError as err:  # the server answered: reachable
        err.close()
    except (urllib.error.URLError, OSError) as err:
        raise OSError(f"cannot reach {parts.netloc} ({getattr(err, 'reason', err)}) to read {location}; "
                      "check the network connection, or the --catalog URL") from None


@dataclass(frozen=True, kw_only=True)
class SizeRow:
    """One crop's chunks of one group ("em" or a label class), over the planned levels."""

    dataset: str
    crop_id: int
    group: str
    levels: tuple[str, ...]
    num_chunks: int  # planned
    num_pending: int  # not yet in DEST nor known absent
    num_bytes: float  # of the pending ones


@dataclass(frozen=True, kw_only=True)
class SizeReport:
    """What a fetch would download; byte counts are exact unless `estimated`."""

    rows: tuple[SizeRow, ...]
    dataset_totals: dict[str, tuple[int, float]]  # dataset → (distinct pending chunks, bytes)
    num_chunks: int
    num_present: int
    num_known_absent: int
    num_pending: int
    num_absent: float  # pending chunks the source does not have (extrapolated when estimated)
    num_bytes: float
    num_heads: int
    estimated: bool

    def format(self, *, verbose: bool = False) -> str:
        """A table per dataset/crop/array (label classes merged unless `verbose`) and the total."""
        return _format_report(self, verbose=verbose)


def _stratum(array: ArrayFetch) -> tuple[str, str, str]:
    return array.dataset, "em" if array.group == "em" else "labels", array.level


def _sample(chunks: Sequence[Chunk], *, exact: bool, per_stratum: int) -> dict[tuple[str, str, str], list[Chunk]]:
    strata: dict[tuple[str, str, str], list[Chunk]] = defaultdict(list)
    for chunk in chunks:
        strata[_stratum(chunk[0])].append(chunk)
    rng = random.Random(0)
    return {s: (cs if exact or len(cs) <= per_stratum else rng.sample(cs, per_stratum)) for s, cs in strata.items()}


def estimate(plan: FetchPlan, dest: Path | None, *, workers: int = 16, recheck_absent: bool = False,
             max_exact: int = MAX_EXACT_HEADS, sample_per_stratum: int = SAMPLE_PER_STRATUM) -> SizeReport:
    """Size what `execute(plan, dest)` would download, with HEAD requests only (see the module docstring).

    Raises:
        OSError: the source cannot be reached.
    """
    pending = pending_chunks(plan, dest, recheck_absent=recheck_absent)
    exact = len(pending.chunks) <= max_exact
    samples = _sample(pending.chunks, exact=exact, per_stratum=sample_per_stratum)
    heads = [c for cs in samples.values() for c in cs]
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        sizes = dict(zip(((a.rel_path, k) for a, k in heads), pool.map(lambda c: chunk_size(*c), heads), strict=True))
    counts: dict[tuple[str, str, str], int] = defaultdict(int)
    for array, _ in pending.chunks:
        counts[_stratum(array)] += 1
    mean = {s: sum(sizes[(a.rel_path, k)] or 0 for a, k in cs) / len(cs) for s, cs in samples.items()}
    absent = sum(counts[s] * sum(sizes[(a.rel_path, k)] is None for a, k in cs) / len(cs) for s, cs in samples.items())

    def size_of(array: ArrayFetch, key: str) -> float:
        known = sizes.get((array.rel_path, key), -1)
        return mean[_stratum(array)] if known == -1 else float(known or 0)

    todo = {(a.rel_path, k) for a, k in pending.chunks}
    dataset_totals: dict[str, tuple[int, float]] = {}
    for array, key in pending.chunks:
        n, b = dataset_totals.get(array.dataset, (0, 0.0))
        dataset_totals[array.dataset] = (n + 1, b + size_of(array, key))
    return SizeReport(
        rows=_rows(plan, todo, size_of), dataset_totals=dataset_totals,
        num_chunks=len(pending.chunks) + pending.num_present + pending.num_known_absent,
        num_present=pending.num_present, num_known_absent=pending.num_known_absent,
        num_pending=len(pending.chunks), num_absent=absent,
        num_bytes=sum(b for _, b in dataset_totals.values()), num_heads=len(heads), estimated=not exact,
    )


def _rows(plan: FetchPlan, todo: set[tuple[str, str]], size_of: Callable[[ArrayFetch, str], float]
          ) -> tuple[SizeRow, ...]:
    rows: dict[tuple[str, int, str], SizeRow] = {}
    for array in plan.arrays:
        pending = [k for k in array.keys if (array.rel_path, k) in todo]
        key = (array.dataset, array.crop_id, array.group)
        old = rows.get(key, SizeRow(dataset=array.dataset, crop_id=array.crop_id, group=array.group, levels=(),
                                    num_chunks=0, num_pending=0, num_bytes=0.0))
        rows[key] = SizeRow(dataset=old.dataset, crop_id=old.crop_id, group=old.group,
                            levels=(*old.levels, array.level), num_chunks=old.num_chunks + len(array.keys),
                            num_pending=old.num_pending + len(pending),
                            num_bytes=old.num_bytes + sum(size_of(array, k) for k in pending))
    return tuple(rows.values())


def _merge_labels(rows: Sequence[SizeRow]) -> list[SizeRow]:
    """One "labels (N classes)" row per crop instead of one row per class."""
    out: list[SizeRow] = []
    merged: dict[tuple[str, int], list[SizeRow]] = defaultdict(list)
    for row in rows:
        if row.group == "em":
            out.append(row)
        else:
            merged[(row.dataset, row.crop_id)].append(row)
    for (dataset, crop_id), group in merged.items():
        levels = tuple(dict.fromkeys(lv for r in group for lv in r.levels))
        out.append(SizeRow(dataset=dataset, crop_id=crop_id, group=f"labels ({len(group)} class{'es' if len(group) > 1 else ''})", levels=levels,
                           num_chunks=sum(r.num_chunks for r in group), num_pending=sum(r.num_pending for r in group),
                           num_bytes=sum(r.num_bytes for r in group)))
    return sorted(out, key=lambda r: (r.dataset, r.crop_id, r.group != "em", r.group))


def _format_report(report: SizeReport, *, verbose: bool) -> str:
    rows = sorted(report.rows, key=lambda r: (r.dataset, r.crop_id, r.group != "em", r.group)) if verbose \
        else _merge_labels(report.rows)
    approx = "~" if report.estimated else ""
    lines = [f"{'dataset':<26} {'crop':<9} {'array':<22} {'levels':<18} {'chunks':>9} {'to fetch':>9} {'bytes':>11}"]
    for dataset in sorted({r.dataset for r in rows}):
        for r in (r for r in rows if r.dataset == dataset):
            lines.append(f"{r.dataset:<26} crop{r.crop_id:<5} {r.group:<22} {','.join(r.levels):<18} "
                         f"{r.num_chunks:>9,} {r.num_pending:>9,} {approx + format_bytes(r.num_bytes):>11}")
        n, b = report.dataset_totals.get(dataset, (0, 0.0))
        lines.append(f"{dataset:<26} {'all':<9} {'(distinct chunks)':<22} {'':<18} {'':>9} {n:>9,} "
                     f"{approx + format_bytes(b):>11}")
    how = (f"estimated from {report.num_heads:,} sampled HEAD requests" if report.estimated
           else f"exact, from {report.num_heads:,} HEAD requests")
    lines.append(
        f"total: {report.num_chunks:,} distinct chunks planned; {report.num_pending:,} to fetch "
        f"({report.num_present:,} already present, {report.num_known_absent:,} known absent), of which "
        f"{approx}{report.num_absent:,.0f} absent at the source; {approx}{format_bytes(report.num_bytes)} ({how})")
    lines.append("dry run: nothing was downloaded")
    return "\n".join(lines)
