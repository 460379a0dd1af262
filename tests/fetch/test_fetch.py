"""`cellseg fetch` against a real HTTP server on 127.0.0.1 serving a synthetic CellMap-style data root.

The root has two datasets: A (EM 2/4/8/16 nm, chunk separator "/", crops 1 and 2 overlapping) and B (EM
4/8/16 nm, separator ".", training crop 3 and test crop 10). Some EM chunks are deleted on purpose (the
server answers 404: fill value). The handler records every request and can drop or stall chunk bodies.
"""

from __future__ import annotations

import functools
import json
import math
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from cellseg.cli import main
from cellseg.data.arrays import MultiscaleImage
from cellseg.data.chunks import LEDGER, chunk_keys, coverage
from cellseg.data.crops import Catalog, format_vector
from cellseg.data.ngff import parse_multiscales
from cellseg.data.stores import resolve
from cellseg.data.write import write_multiscale
from cellseg.fetch.download import fetch, load_catalog
from cellseg.fetch.fetch_plan import (
    build_plan,
    choose_em_levels,
    overlapping_range,
    relative_path,
)
from cellseg.fetch.select import select_targets
from cellseg.fetch.size import estimate

PAD = 4  # EM voxels of padding used in these tests
EM = "recon-1/em/fibsem-uint8"
METADATA = {".zattrs", ".zarray", ".zgroup"}


@dataclass(frozen=True)
class CropSpec:
    id: int
    dataset: str
    voxel_nm: float
    translation_nm: tuple[float, float, float]
    shape: tuple[int, int, int]
    classes: tuple[str, ...]
    split: str = "train"


CROPS = (
    CropSpec(1, "jrc_synth-a", 4.0, (81.0, 121.0, 41.0), (16, 20, 24), ("mito", "nuc")),
    CropSpec(2, "jrc_synth-a", 8.0, (83.0, 115.0, 27.0), (8, 8, 10), ("mito",)),
    CropSpec(3, "jrc_synth-b", 4.0, (42.0, 50.0, 82.0), (12, 16, 16), ("er", "mito")),
    CropSpec(10, "jrc_synth-b", 8.0, (36.0, 44.0, 52.0), (6, 6, 6), ("mito", "nuc"), split="test"),
)
DELETED = {"jrc_synth-a": ("s1/1/2/1", "s1/2/2/2"), "jrc_synth-b": ("s0/1.1.2",)}


def _to_dot_separator(array_dir: Path) -> None:
    """Rewrite a '/'-separated zarr array into '.'-separated keys."""
    for path in sorted(p for p in array_dir.rglob("*") if p.is_file() and not p.name.startswith(".")):
        path.rename(array_dir / ".".join(path.relative_to(array_dir).parts))
    for d in sorted((p for p in array_dir.rglob("*") if p.is_dir()), reverse=True):
        d.rmdir()
    meta = json.loads((array_dir / ".zarray").read_text())
    (array_dir / ".zarray").write_text(json.dumps({**meta, "dimension_separator": "."}))


def _write_root(root: Path) -> None:
    rng = np.random.default_rng(0)
    em = {"jrc_synth-a": ((128, 192, 192), 2.0, 0.0, 4), "jrc_synth-b": ((64, 64, 80), 4.0, 2.0, 3)}
    for ds, (shape, vs, tr, levels) in em.items():
        group = root / ds / f"{ds}.zarr" / EM
        write_multiscale(group, rng.integers(0, 256, shape, dtype=np.uint8), voxel_size_nm=(vs,) * 3,
                         translation_nm=(tr,) * 3, kind="em", num_levels=levels, chunks=(16, 16, 16))
        if ds == "jrc_synth-b":
            for level in range(levels):
                _to_dot_separator(group / f"s{level}")
        for key in DELETED[ds]:
            (group / key).unlink()
    train_rows, test_rows, url_rows = [], [], []
    for c in CROPS:
        for name in c.classes:
            row = f"{c.id},{c.dataset},{name},{format_vector([c.voxel_nm] * 3)},{format_vector(c.translation_nm)}," \
                  f"[{';'.join(map(str, c.shape))}]"
            (test_rows if c.split == "test" else train_rows).append(row)
            if c.split == "train":
                labels = rng.integers(0, 3, c.shape, dtype=np.uint8)
                write_multiscale(root / c.dataset / f"{c.dataset}.zarr/recon-1/labels/groundtruth/crop{c.id}" / name,
                                 labels, voxel_size_nm=(c.voxel_nm,) * 3, translation_nm=c.translation_nm,
                                 kind="labels", num_levels=2, chunks=(8, 8, 8))
        if c.split == "train":
            base = f"{c.dataset}/{c.dataset}.zarr/recon-1"
            url_rows.append(f"{c.id},{c.dataset},recon-1,{base}/labels/groundtruth/crop{c.id},{base}/em/fibsem-uint8")
    header = "crop_name,dataset,class_label,voxel_size,translation,shape"
    (root / "train_crop_manifest.csv").write_text("\n".join([header, *train_rows]) + "\n")
    (root / "test_crop_manifest.csv").write_text("\n".join([header, *test_rows]) + "\n")
    (root / "manifest.csv").write_text("\n".join(["crop_number,collection,alignment,crop_url,em_url", *url_rows]) + "\n")


@pytest.fixture(scope="module")
def source_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("source")
    _write_root(root)
    return root


# ------------------------------------------------------------------------------------------------- server


def _is_chunk(path: str) -> bool:
    name = path.rstrip("/").rsplit("/", 1)[-1]
    return bool(name) and name not in METADATA and not name.endswith(".csv") and not path.endswith("/")


@dataclass
class ServerState:
    """What the handler saw, and how it should misbehave."""

    requests: list[tuple[str, str]] = field(default_factory=list)
    drop: set[str] = field(default_factory=set)  # chunk paths whose body is cut in half
    stall_after: int | None = None  # chunk GETs beyond this send half a body, then hang until `release`
    stalled: int = 0
    release: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def chunk_gets(self) -> list[str]:
        with self.lock:
            return [p for m, p in self.requests if m == "GET" and _is_chunk(p)]

    def count(self, method: str) -> int:
        with self.lock:
            return sum(m == method for m, _ in self.requests)

    def reset(self) -> None:
        with self.lock:
            self.requests.clear()


def _wait_until_quiet(state: ServerState, quiet_s: float = 0.5, timeout_s: float = 30.0) -> None:
    """Return once the server has seen no new request for `quiet_s` seconds."""
    deadline = time.monotonic() + timeout_s
    seen = -1
    while time.monotonic() < deadline:
        with state.lock:
            now = len(state.requests)
        if now == seen:
            return
        seen = now
        time.sleep(quiet_s)


class Handler(SimpleHTTPRequestHandler):
    state: ServerState

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_HEAD(self) -> None:
        with self.state.lock:
            self.state.requests.append(("HEAD", self.path))
        super().do_HEAD()

    def do_GET(self) -> None:
        state = self.state
        with state.lock:
            state.requests.append(("GET", self.path))
            num_chunks = sum(m == "GET" and _is_chunk(p) for m, p in state.requests)
            stall = state.stall_after is not None and _is_chunk(self.path) and num_chunks > state.stall_after
            state.stalled += stall
        if self.path in state.drop or stall:
            self._half_body(wait=stall)
            return
        super().do_GET()

    def _half_body(self, *, wait: bool) -> None:
        """Announce the whole chunk, send half of it, (maybe hang), then close: an interrupted transfer."""
        path = Path(self.translate_path(self.path))
        if not path.is_file():
            self.send_error(404)
            return
        data = path.read_bytes()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data[: len(data) // 2])
        self.wfile.flush()
        if wait:
            self.state.release.wait(timeout=60)
        self.close_connection = True


class Server(ThreadingHTTPServer):
    request_queue_size = 128  # the default backlog of 5 makes parallel clients wait for SYN retries (1 s)


@pytest.fixture
def server(source_root: Path):
    state = ServerState()
    handler = type("BoundHandler", (Handler,), {"state": state})
    httpd = Server(("127.0.0.1", 0), functools.partial(handler, directory=str(source_root)))
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", state
    finally:
        state.release.set()
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=10)


# ------------------------------------------------------------------------------------------------- oracle


def _axis_chunks(centres_nm: np.ndarray, voxel_nm: float, start: float, stop: float, chunk: int) -> set[int]:
    """Chunk indices along one axis that the crop [start, stop) plus PAD voxels touches (brute force)."""
    inside = np.nonzero((centres_nm + voxel_nm / 2 > start + 1e-6) & (centres_nm - voxel_nm / 2 < stop - 1e-6))[0]
    if inside.size == 0:
        return set()
    lo, hi = max(0, inside.min() - PAD), min(len(centres_nm), inside.max() + PAD + 1)
    return set(range(lo // chunk, (hi - 1) // chunk + 1))


def expected_em_chunks(root: Path, crop: CropSpec, *, levels: str = "matched") -> dict[str, set[tuple[int, ...]]]:
    """Level path → chunk indices the crop needs, computed voxel by voxel from the source metadata."""
    group = root / crop.dataset / f"{crop.dataset}.zarr" / EM
    out = {}
    for lv in parse_multiscales(json.loads((group / ".zattrs").read_text()), source=str(group)):
        if levels == "matched" and not all(v > 0.8 * crop.voxel_nm for v in lv.voxel_size_nm):
            continue
        meta = json.loads((group / lv.path / ".zarray").read_text())
        per_axis = []
        for a in range(3):
            start = crop.translation_nm[a] - crop.voxel_nm / 2
            centres = lv.translation_nm[a] + np.arange(meta["shape"][a]) * lv.voxel_size_nm[a]
            per_axis.append(_axis_chunks(centres, lv.voxel_size_nm[a], start, start + crop.shape[a] * crop.voxel_nm,
                                         meta["chunks"][a]))
        out[lv.path] = {(z, y, x) for z in per_axis[0] for y in per_axis[1] for x in per_axis[2]}
    return out


def _key(index: tuple[int, ...], array_dir: Path) -> str:
    sep = json.loads((array_dir / ".zarray").read_text()).get("dimension_separator", ".")
    return sep.join(map(str, index))


def expected_chunk_paths(root: Path, crops: list[CropSpec], *, labels: bool = True) -> set[str]:
    """URL paths of every chunk a fetch of `crops` must request (EM boxes, all label chunks)."""
    paths = set()
    for c in crops:
        em_dir = f"{c.dataset}/{c.dataset}.zarr/{EM}"
        for level, indices in expected_em_chunks(root, c).items():
            paths |= {f"/{em_dir}/{level}/{_key(i, root / em_dir / level)}" for i in indices}
        if c.split == "train" and labels:
            for name in c.classes:
                group = root / c.dataset / f"{c.dataset}.zarr/recon-1/labels/groundtruth/crop{c.id}" / name
                for level_dir in sorted(group.glob("s*")):
                    meta = json.loads((level_dir / ".zarray").read_text())
                    ranges = [(0, n) for n in meta["shape"]]
                    rel = level_dir.relative_to(root).as_posix()
                    paths |= {f"/{rel}/{k}" for k in chunk_keys(ranges, chunks=meta["chunks"], separator="/")}
    return paths


def _source_bytes(root: Path, paths: set[str]) -> int:
    return sum((root / p.lstrip("/")).stat().st_size for p in paths if (root / p.lstrip("/")).is_file())


def _chunk_files(dest: Path) -> dict[str, Path]:
    """URL path → file for every non-hidden, non-manifest file under dest."""
    return {"/" + p.relative_to(dest).as_posix(): p for p in dest.rglob("*")
            if p.is_file() and not p.name.startswith(".") and p.suffix != ".csv"}


def assert_em_matches(root: Path, dest: Path, crops: list[CropSpec]) -> None:
    """The fetched EM equals the source on every chunk some crop needs and is fill value (0) elsewhere."""
    for dataset in {c.dataset for c in crops}:
        needed: dict[str, set[tuple[int, ...]]] = {}
        for crop in (c for c in crops if c.dataset == dataset):
            for level, indices in expected_em_chunks(root, crop).items():
                needed.setdefault(level, set()).update(indices)
        rel = f"{dataset}/{dataset}.zarr/{EM}"
        source, fetched = MultiscaleImage(root / rel, backend="zarr"), MultiscaleImage(dest / rel)
        for level, indices in needed.items():
            want = source.read_level(level)
            chunk = json.loads((root / rel / level / ".zarray").read_text())["chunks"][0]
            grid = np.zeros([math.ceil(n / chunk) for n in want.shape], dtype=bool)
            grid[tuple(np.array(sorted(indices)).T)] = True
            mask = grid.repeat(chunk, 0).repeat(chunk, 1).repeat(chunk, 2)[tuple(slice(0, n) for n in want.shape)]
            np.testing.assert_array_equal(fetched.read_level(level), np.where(mask, want, 0))


# -------------------------------------------------------------------------------------------------- tests


def test_chunk_geometry_helpers():
    # Aligned grids: a 4 nm crop of 16 voxels starting at voxel 20 of a 4 nm level (translation 1 nm).
    assert overlapping_range(79.0, 143.0, voxel_size_nm=4.0, translation_nm=1.0, size_vox=64) == (20, 36)
    assert overlapping_range(79.0, 143.0, voxel_size_nm=4.0, translation_nm=1.0, size_vox=64, padding_vox=30) == (0, 64)
    # A coarse voxel only partly inside still counts; one merely touching the box does not.
    assert overlapping_range(80.0, 81.0, voxel_size_nm=8.0, translation_nm=3.0, size_vox=99) == (10, 11)
    assert chunk_keys([(20, 32), (0, 1), (15, 17)], chunks=(16, 16, 16), separator=".") == ("1.0.0", "1.0.1")
    assert chunk_keys([(5, 5), (0, 1), (0, 1)], chunks=(16, 16, 16), separator="/") == ()
    url = "s3://janelia-cosem-datasets/jrc_hela-2/jrc_hela-2.zarr/recon-1/em/fibsem-uint8"
    assert relative_path(resolve(url), "jrc_hela-2") == "jrc_hela-2/jrc_hela-2.zarr/recon-1/em/fibsem-uint8"
    with pytest.raises(ValueError, match="zarr"):
        relative_path(resolve("https://host/data/em"), "x")


def test_em_levels_follow_the_challenge_rule(source_root: Path, server):
    url, _ = server
    catalog = load_catalog(url)
    plan = build_plan(catalog, select_targets(catalog, crops="1,2"), padding_vox=PAD)
    levels = {(a.crop_id, a.level) for a in plan.arrays if a.group == "em"}
    assert levels == {(1, "s1"), (1, "s2"), (1, "s3"), (2, "s2"), (2, "s3")}  # 2 nm s0 is finer than 0.8 × 4 nm
    assert choose_em_levels([], (4, 4, 4), "all") == []


def test_fetch_mirrors_source_and_requests_only_overlapping_chunks(source_root: Path, server, tmp_path: Path):
    url, state = server
    catalog = load_catalog(url)
    state.reset()
    report = fetch(catalog, tmp_path, crops="train", padding_vox=PAD, workers=4, progress=False)
    train = [c for c in CROPS if c.split == "train"]
    expected = expected_chunk_paths(source_root, train)
    gets = state.chunk_gets()
    assert report.ok and sorted(gets) == sorted(expected)  # each needed chunk once, nothing else
    absent = {f"/{ds}/{ds}.zarr/{EM}/{k}" for ds, keys in DELETED.items() for k in keys}
    assert absent <= expected and report.num_new_absent == len(absent)
    assert report.num_files == len(expected - absent) and report.num_bytes == _source_bytes(source_root, expected)
    assert_em_matches(source_root, tmp_path, train)
    for crop in train:
        for name in crop.classes:
            rel = f"{crop.dataset}/{crop.dataset}.zarr/recon-1/labels/groundtruth/crop{crop.id}/{name}"
            src, got = MultiscaleImage(source_root / rel), MultiscaleImage(tmp_path / rel, backend="zarr")
            for level in src.levels:
                np.testing.assert_array_equal(got.read_level(level.path), src.read_level(level.path))
    ledger = json.loads((tmp_path / "jrc_synth-a/jrc_synth-a.zarr" / EM / "s1" / LEDGER).read_text())
    assert ledger["absent"] == ["1/2/1", "2/2/2"]
    fetched = Catalog.from_dir(tmp_path)
    assert set(fetched.train) == {1, 2, 3} and fetched.train[1].labels == catalog.train[1].labels
    assert fetched.locate(fetched.train[3].em_url).url == str(tmp_path / "jrc_synth-b/jrc_synth-b.zarr" / EM)

    state.reset()  # a second run finds everything present or known absent: not one GET
    again = fetch(catalog, tmp_path, crops="train", padding_vox=PAD, workers=4, progress=False)
    assert again.ok and again.num_files == 0 and again.num_present == len(expected - absent)
    assert again.num_known_absent == len(absent) and state.count("GET") == 0


def test_a_read_after_a_download_in_this_process_sees_what_it_fetched(source_root: Path, server, tmp_path: Path):
    catalog, level = load_catalog(server[0]), tmp_path / "jrc_synth-a/jrc_synth-a.zarr" / EM / "s1"
    assert fetch(catalog, tmp_path, crops=[2], padding_vox=PAD, workers=4, progress=False).ok  # s2's chunks
    zarray, box = json.loads((level / ".zarray").read_text()), ((16, 32), (32, 48), (16, 32))  # chunk 1/2/1
    assert coverage(level, zarray, box) == 0.0  # before s1 is fetched (the per-process caches fill)
    assert fetch(catalog, tmp_path, crops=[1], padding_vox=PAD, workers=4, progress=False).ok  # s1's chunks
    assert coverage(level, zarray, box) == 1.0  # 1/2/1 is absent at the source: the ledger was re-read


def test_resume_after_killed_download(source_root: Path, server, tmp_path: Path):
    url, state = server
    state.stall_after = 10
    command = "import sys; from cellseg.cli import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.Popen([sys.executable, "-c", command, "-q", "fetch", "--dest", str(tmp_path), "--catalog", url,
                             "--crops", "train", "--padding-vox", str(PAD), "--workers", "4"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while state.stalled < 1 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.kill()  # mid-transfer: at least one chunk body is half sent
    _, stderr = proc.communicate()
    state.release.set()
    assert state.stalled >= 1, stderr.decode()

    expected = expected_chunk_paths(source_root, [c for c in CROPS if c.split == "train"])
    partial = _chunk_files(tmp_path)
    assert 0 < len(partial) <= 10 and set(partial) <= expected
    for path, file in partial.items():  # every chunk file on disk is complete
        assert file.read_bytes() == (source_root / path.lstrip("/")).read_bytes()
    assert not (tmp_path / "train_crop_manifest.csv").exists()  # an incomplete fetch is not recorded

    _wait_until_quiet(state)  # requests the killed client left in the server's backlog are served first
    state.stall_after, state.stalled = None, 0
    state.release.clear()
    state.reset()
    report = fetch(load_catalog(url), tmp_path, crops="train", padding_vox=PAD, workers=4, progress=False)
    assert report.ok and report.num_present == len(partial)
    assert sorted(state.chunk_gets()) == sorted(expected - set(partial))  # only what was missing
    assert_em_matches(source_root, tmp_path, [c for c in CROPS if c.split == "train"])


def test_failed_chunk_is_reported_and_retried_next_run(source_root: Path, server, tmp_path: Path, capsys):
    url, state = server
    crop = CROPS[2]
    level, indices = sorted(expected_em_chunks(source_root, crop).items())[0]
    em_dir = f"{crop.dataset}/{crop.dataset}.zarr/{EM}/{level}"
    broken = f"/{em_dir}/{_key(sorted(indices)[0], source_root / em_dir)}"
    assert (source_root / broken.lstrip("/")).is_file()
    state.drop.add(broken)
    args = ["-q", "fetch", "--dest", str(tmp_path), "--catalog", url, "--crops", "3", "--padding-vox", str(PAD),
            "--workers", "4"]
    assert main(args) == 1
    out = capsys.readouterr().out
    assert "1 chunk(s) FAILED" in out and broken in out and "re-run" in out
    assert not (tmp_path / broken.lstrip("/")).exists() and not list(tmp_path.rglob(".*.part-*"))
    assert not (tmp_path / "train_crop_manifest.csv").exists()

    state.drop.clear()
    state.reset()
    assert main(args) == 0
    assert state.chunk_gets() == [broken]
    assert (tmp_path / broken.lstrip("/")).read_bytes() == (source_root / broken.lstrip("/")).read_bytes()
    assert "fetched 1 files" in capsys.readouterr().out


def test_dry_run_heads_only_and_sizes_exactly(source_root: Path, server, tmp_path: Path, capsys):
    url, state = server
    state.reset()
    assert main(["fetch", "--dest", str(tmp_path), "--catalog", url, "--crops", "1,3", "--padding-vox", str(PAD),
                 "--dry-run"]) == 0
    out = capsys.readouterr().out
    expected = expected_chunk_paths(source_root, [CROPS[0], CROPS[2]])
    total = _source_bytes(source_root, expected)
    assert state.chunk_gets() == [] and state.count("HEAD") == len(expected) + 2  # + 2 reachability probes
    last = out.strip().splitlines()[-2]
    assert f"{len(expected):,} distinct chunks planned; {len(expected):,} to fetch" in last
    num_absent = sum(not (source_root / p.lstrip("/")).is_file() for p in expected)
    assert num_absent == 3 and f"of which 3 absent at the source; {total / 1000:.1f} kB (exact" in last
    assert "crop1" in out and "labels (2 classes)" in out and "s1,s2,s3" in out
    assert not any(tmp_path.iterdir())  # nothing written

    catalog = load_catalog(url)  # sampled: a few HEADs per (dataset, em|labels, level), extrapolated
    plan = build_plan(catalog, select_targets(catalog, crops="1,3"), padding_vox=PAD)
    sampled = estimate(plan, None, max_exact=10, sample_per_stratum=3)
    assert sampled.estimated and sampled.num_heads < len(expected) and sampled.num_pending == len(expected)
    assert abs(sampled.num_bytes - total) < 0.25 * total
    assert "estimated from" in sampled.format()


def test_bad_selections_name_the_valid_choices(source_root: Path, server, capsys):
    url, _ = server
    catalog = load_catalog(url)
    with pytest.raises(ValueError, match=r"unknown crop id: 4 \(closest: 3, 2, 1\).*training crops 1-3; test crops 10"):
        select_targets(catalog, crops="1,4")
    with pytest.raises(ValueError, match=r"'mitoo' \(did you mean mito\?\).*Valid classes: er, mito, nuc"):
        select_targets(catalog, classes="mitoo")
    with pytest.raises(ValueError, match=r"unknown dataset: 'jrc_synth-c' \(did you mean jrc_synth-b, jrc_synth-a\?\)"):
        select_targets(catalog, datasets=["jrc_synth-c"])
    with pytest.raises(ValueError, match="no crop matches"):
        select_targets(catalog, crops="2", classes="er")
    assert [t.crop.id for t in select_targets(catalog, classes="tested,er")] == [1, 2, 3, 10]
    assert [t.crop.id for t in select_targets(catalog, datasets=["jrc_synth-b"])] == [3, 10]
    assert [(t.crop.id, t.classes) for t in select_targets(catalog, crops="train", classes="er")] == [(3, ("er",))]
    assert main(["fetch", "--dest", "x", "--catalog", url, "--classes", "mitoo"]) == 2
    assert "did you mean mito?" in capsys.readouterr().err


def test_cli_end_to_end_test_crops_and_merged_manifests(source_root: Path, server, tmp_path: Path, capsys):
    url, _ = server
    base = ["fetch", "--dest", str(tmp_path), "--catalog", url, "--padding-vox", "0", "--workers", "3"]
    assert main([*base, "--crops", "test"]) == 0  # EM only
    assert "fetched" in capsys.readouterr().out
    assert not list(tmp_path.rglob("groundtruth")) and (tmp_path / "jrc_synth-b/jrc_synth-b.zarr" / EM / "s1").is_dir()
    assert main([*base, "--crops", "1", "--classes", "nuc", "--em-levels", "all", "--no-labels"]) == 0
    fetched = Catalog.from_dir(tmp_path)
    assert set(fetched.train) == {1} and fetched.train[1].classes == ("nuc",)
    assert set(fetched.test()) == {10} and set(fetched.test()[10].labels) == {"mito", "nuc"}
    assert not list(tmp_path.rglob("groundtruth"))
    em = MultiscaleImage(tmp_path / "jrc_synth-a/jrc_synth-a.zarr" / EM, backend="zarr")
    assert [lv.path for lv in em.levels] == ["s0", "s1", "s2", "s3"]
    assert list((tmp_path / "jrc_synth-a/jrc_synth-a.zarr" / EM / "s0").iterdir())  # --em-levels all fetched s0
    import zarr

    group = zarr.open_group(str(tmp_path / "jrc_synth-a/jrc_synth-a.zarr"), mode="r")
    assert group["recon-1/em/fibsem-uint8/s3"].shape == (16, 24, 24)


def test_unreachable_server_is_a_clear_error(tmp_path: Path, capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert main(["fetch", "--dest", str(tmp_path), "--catalog", f"http://127.0.0.1:{port}/data"]) == 1
    assert f"cannot reach 127.0.0.1:{port}" in capsys.readouterr().err


def test_test_split_plans_no_labels(source_root: Path, server):
    url, _ = server
    catalog = load_catalog(url)
    plan = build_plan(catalog, select_targets(catalog, crops="test"), padding_vox=PAD)
    assert {a.group for a in plan.arrays} == {"em"} and {a.level for a in plan.arrays} == {"s1", "s2"}
