"""The crop catalogue: which crops exist, where they live, and the geometry of each annotated class.

The official manifests (packaged, see `cellseg/manifests/README.md`) describe 289 training crops in
22 datasets and 16 test crops, the latter in two versions: the 420-row one used while the challenge ran
("2025") and the 413-row one after PR #212 removed empty non-annotated rows ("2026"). A synthetic dataset
written by `cellseg synth` carries manifests in the same formats, so both load through `Catalog`.

Geometry convention (z, y, x order, nm): `translation_nm` is the physical position of the *centre* of voxel
(0, 0, 0); voxel i of an axis sits at `translation + i * voxel_size`. This is the convention under which
the official pyramids' half-voxel shifts between levels are consistent: a level f times coarser than a
v nm `s0` at 0 starts at (f − 1) · v / 2 nm (test crop 982 at 16 nm, over a 4 nm `s0`: 6 nm).
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import io
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from cellseg.classes import MANIFEST_PACKAGE
from cellseg.data.stores import Location, resolve

Vec3 = tuple[float, float, float]
# The test manifest's versions, named by the year of the scoring era that reads it (`ScoringEra.test_manifest`): a
# property of the data, kept apart from the eras, which are scoring rules.
TestVersion = str
CURRENT_TEST_VERSION = "2026"  # test_crop_manifest.csv, the 413-row version
TEST_MANIFESTS: dict[str, str] = {"2025": "test_crop_manifest_2025.csv", CURRENT_TEST_VERSION: "test_crop_manifest.csv"}
TEST_VERSIONS_NEWEST_FIRST: tuple[str, ...] = tuple(sorted(TEST_MANIFESTS, reverse=True))


@dataclass(frozen=True, kw_only=True)
class Geometry:
    """A regular voxel grid in world space (z, y, x).

    Attributes:
        voxel_size_nm: voxel edge lengths.
        translation_nm: centre of voxel (0, 0, 0).
        shape_vox: number of voxels per axis.
    """

    voxel_size_nm: Vec3
    translation_nm: Vec3
    shape_vox: tuple[int, int, int]

    @property
    def extent_nm(self) -> Vec3:
        """Physical size of the grid (shape × voxel size)."""
        return tuple(s * v for s, v in zip(self.shape_vox, self.voxel_size_nm, strict=True))  # type: ignore[return-value]

    @property
    def start_nm(self) -> Vec3:
        """World coordinate of the grid's lower corner (half a voxel before the first centre)."""
        return tuple(t - v / 2 for t, v in zip(self.translation_nm, self.voxel_size_nm, strict=True))  # type: ignore[return-value]

    @property
    def stop_nm(self) -> Vec3:
        """World coordinate of the grid's upper corner."""
        return tuple(a + e for a, e in zip(self.start_nm, self.extent_nm, strict=True))  # type: ignore[return-value]

    @property
    def num_voxels(self) -> int:
        """Total number of voxels."""
        return self.shape_vox[0] * self.shape_vox[1] * self.shape_vox[2]


@dataclass(frozen=True, kw_only=True)
class Crop:
    """One annotated (or test) crop.

    Attributes:
        id: the crop number (`crop<id>` on disk).
        dataset: the dataset it belongs to (`jrc_hela-2`).
        labels: class name → geometry of that class's `s0` annotation.
        crop_url: location of `.../labels/groundtruth/crop<id>` (training crops only).
        em_url: location of `.../recon-1/em/fibsem-uint8` (training crops only).
    """

    id: int
    dataset: str
    labels: Mapping[str, Geometry]
    crop_url: str = ""
    em_url: str = ""

    @property
    def name(self) -> str:
        """`crop<id>`, the folder name used on disk and in submissions."""
        return f"crop{self.id}"

    @property
    def classes(self) -> tuple[str, ...]:
        """The class labels listed for this crop, sorted."""
        return tuple(sorted(self.labels))

    @property
    def geometry(self) -> Geometry:
        """The crop's geometry when every label shares it (true for all official crops).

        Raises:
            ValueError: if labels of this crop disagree on geometry.
        """
        geometries = set(self.labels.values())
        if len(geometries) != 1:
            raise ValueError(f"{self.name}: labels have {len(geometries)} different geometries; ask per label")
        return next(iter(geometries))


def crop_id(text: int | str) -> int:
    """A crop's number from `12`, `"12"` or `"crop12"`.

    Raises:
        ValueError: anything else, e.g. "'mito' is not a crop id (12 or crop12)".
    """
    number = str(text).strip().removeprefix("crop")
    if not number.isdigit():
        raise ValueError(f"{text!r} is not a crop id (12 or crop12)")
    return int(number)


def crop_name(text: int | str) -> str:
    """`12`, `"12"` or `"crop12"` → `"crop12"` (the group name in stores and submissions; see `crop_id`)."""
    return f"crop{crop_id(text)}"


def is_crop_name(text: str) -> bool:
    """True for a group name of the form `crop<N>` (N digits only)."""
    return text.startswith("crop") and text[4:].isdigit()


def crop_sort_key(name: str) -> tuple[int, str]:
    """Sort key putting `crop2` before `crop10` (names that are not `crop<N>` last, alphabetically)."""
    return (int(name[4:]), name) if is_crop_name(name) else (2**63, name)


def parse_vector(text: str) -> tuple[float, ...]:
    """Parse a manifest vector such as `[2.0;2.0;2.0]` (z;y;x)."""
    body = text.strip().strip("[]")
    try:
        return tuple(float(t) for t in body.split(";"))
    except ValueError:
        raise ValueError(f"malformed manifest vector {text!r}; expected e.g. [8.0;8.0;8.0]") from None


def format_vector(values: Iterable[float]) -> str:
    """Inverse of `parse_vector`: `(2, 2, 2.5)` → `[2.0;2.0;2.5]`."""
    return "[" + ";".join(repr(float(v)) for v in values) + "]"


def manifest_text(crops: Mapping[int, Crop]) -> str:
    """The `crop_name,dataset,class_label,voxel_size,translation,shape` manifest of `crops` (one row per label,
    crops in number order): what `_parse_crop_rows` reads back into the same crops."""
    rows = ["crop_name,dataset,class_label,voxel_size,translation,shape"]
    for crop in sorted(crops.values(), key=lambda c: c.id):
        for label, g in sorted(crop.labels.items()):
            shape = "[" + ";".join(str(int(n)) for n in g.shape_vox) + "]"
            rows.append(f"{crop.id},{crop.dataset},{label},{format_vector(g.voxel_size_nm)},"
                        f"{format_vector(g.translation_nm)},{shape}")
    return "\n".join(rows) + "\n"


def _parse_crop_rows(text: str, source: str) -> dict[int, tuple[str, dict[str, Geometry]]]:
    """Parse a `crop_name,dataset,class_label,voxel_size,translation,shape` manifest."""
    reader = csv.DictReader(io.StringIO(text))
    expected = {"crop_name", "dataset", "class_label", "voxel_size", "translation", "shape"}
    if reader.fieldnames is None or not expected <= set(reader.fieldnames):
        raise ValueError(f"{source}: expected columns {sorted(expected)}, found {reader.fieldnames}")
    crops: dict[int, tuple[str, dict[str, Geometry]]] = {}
    for line, row in enumerate(reader, start=2):
        try:
            geometry = Geometry(
                voxel_size_nm=parse_vector(row["voxel_size"]),  # type: ignore[arg-type]
                translation_nm=parse_vector(row["translation"]),  # type: ignore[arg-type]
                shape_vox=tuple(int(v) for v in parse_vector(row["shape"])),  # type: ignore[arg-type]
            )
            crop_id = int(row["crop_name"].removeprefix("crop"))
        except ValueError as err:
            raise ValueError(f"{source}, line {line}: {err}") from None
        _, labels = crops.setdefault(crop_id, (row["dataset"], {}))
        labels[row["class_label"]] = geometry
    return crops


def _parse_urls(text: str) -> dict[int, tuple[str, str, str]]:
    """Parse `manifest.csv`: crop_number → (collection, crop_url, em_url)."""
    return {
        int(r["crop_number"]): (r["collection"], r["crop_url"], r["em_url"])
        for r in csv.DictReader(io.StringIO(text))
    }


@dataclass(frozen=True)
class Catalog:
    """Training and test crops of a data release (the official one or a synthetic one).

    Example:
        >>> cat = Catalog.official()
        >>> len(cat.datasets), len(cat.train), len(cat.test("2026"))
        (22, 289, 16)
    """

    train: Mapping[int, Crop]
    tests: Mapping[str, Mapping[int, Crop]] = field(default_factory=dict)
    base: str = ""  # location the manifests came from; relative crop/EM URLs resolve against it

    @classmethod
    def official(cls) -> Catalog:
        """The packaged official manifests (cached)."""
        return _official()

    @classmethod
    def from_texts(
        cls, *, train_text: str, urls_text: str = "", tests_text: Mapping[str, str] | None = None, source: str = ""
    ) -> Catalog:
        """Build a catalogue from manifest file contents."""
        urls = _parse_urls(urls_text) if urls_text else {}
        train = {
            cid: Crop(id=cid, dataset=ds, labels=labels, crop_url=urls.get(cid, ("", "", ""))[1],
                      em_url=urls.get(cid, ("", "", ""))[2])
            for cid, (ds, labels) in sorted(_parse_crop_rows(train_text, f"{source}train_crop_manifest").items())
        }
        tests = {
            version: {cid: Crop(id=cid, dataset=ds, labels=labels)
                      for cid, (ds, labels) in sorted(_parse_crop_rows(text, f"{source}{version}").items())}
            for version, text in (tests_text or {}).items()
        }
        return cls(train=train, tests=tests)

    @classmethod
    def from_dir(cls, root: str | Path | Location) -> Catalog:
        """Load `manifest.csv`, `train_crop_manifest.csv` and the test manifests from a data root.

        `test_crop_manifest.csv` is the "2026" version; `test_crop_manifest_2025.csv`, when present, the
        "2025" one.

        `root` may be a local directory or a URL (`http(s)://`, `s3://`); crop and EM URLs in
        `manifest.csv` that are relative paths resolve against it.

        Raises:
            FileNotFoundError: when `train_crop_manifest.csv` is missing.
        """
        location = resolve(root)

        def text(name: str) -> str | None:
            raw = location.read_bytes(name)
            return raw.decode("utf-8") if raw is not None else None

        train_text = text("train_crop_manifest.csv")
        if train_text is None:
            raise FileNotFoundError(f"{location.join('train_crop_manifest.csv')}: no training-crop manifest "
                                    f"(is {location} a cellseg/CellMap data root?)")
        tests = {version: text(name) for version, name in TEST_MANIFESTS.items()}
        catalog = cls.from_texts(train_text=train_text, urls_text=text("manifest.csv") or "",
                                 tests_text={v: t for v, t in tests.items() if t}, source=f"{location}/")
        return dataclasses.replace(catalog, base=location.url)

    def locate(self, url: str) -> Location:
        """Resolve a crop/EM URL from `manifest.csv`: absolute URLs as they are, relative paths against `base`."""
        if "://" in url or Path(url).is_absolute():
            return resolve(url)
        if not self.base:
            raise ValueError(f"relative location {url!r} in a catalogue with no base location")
        return resolve(self.base).join(*url.split("/"))

    def test(self, version: TestVersion = CURRENT_TEST_VERSION) -> Mapping[int, Crop]:
        """Test crops of a manifest version: "2026" (413 rows, the leaderboard's since PR #212) or "2025" (challenge
        era, 420 rows)."""
        if version not in self.tests:
            raise ValueError(f"no test manifest {version!r} in this catalogue; available: {sorted(self.tests)}")
        return self.tests[version]

    @property
    def datasets(self) -> tuple[str, ...]:
        """Dataset names with at least one training crop, sorted."""
        return tuple(sorted({c.dataset for c in self.train.values()}))

    def crops_of(self, dataset: str) -> tuple[Crop, ...]:
        """Training crops of one dataset."""
        return tuple(c for c in self.train.values() if c.dataset == dataset)

    def summary(self) -> str:
        """A human-readable summary: datasets, crops per dataset, voxel sizes and classes per crop."""
        return format_summary(self)


@functools.cache
def _official() -> Catalog:
    files = resources.files(MANIFEST_PACKAGE)
    return Catalog.from_texts(
        train_text=files.joinpath("train_crop_manifest.csv").read_text(),
        urls_text=files.joinpath("manifest.csv").read_text(),
        tests_text={v: files.joinpath(name).read_text() for v, name in TEST_MANIFESTS.items()},
        source="packaged ",
    )


def _fmt_vs(voxel_size: Iterable[float]) -> str:
    vs = tuple(voxel_size)
    if len(set(vs)) == 1:
        return f"{vs[0]:g}"
    return "×".join(f"{v:g}" for v in vs)


def format_summary(catalog: Catalog) -> str:
    """Render `Catalog.summary()`."""
    lines = [f"{len(catalog.datasets)} datasets, {len(catalog.train)} training crops"]
    lines.append(f"{'dataset':<28} {'crops':>5}  voxel sizes (nm, z×y×x)")
    for ds in catalog.datasets:
        crops = catalog.crops_of(ds)
        sizes = Counter(_fmt_vs(g.voxel_size_nm) for c in crops for g in set(c.labels.values()))
        lines.append(f"{ds:<28} {len(crops):>5}  " + ", ".join(f"{k} ({n})" for k, n in sizes.most_common()))
    hist = Counter(_fmt_vs(g.voxel_size_nm) for c in catalog.train.values() for g in set(c.labels.values()))
    lines += ["", "voxel-size histogram (crops per annotation voxel size, nm):"]
    width = max(hist.values(), default=1)
    for size, n in hist.most_common():
        lines.append(f"  {size:>12}  {n:>4}  " + "#" * max(1, round(40 * n / width)))
    per_crop = sorted(len(c.labels) for c in catalog.train.values())
    if per_crop:
        buckets: dict[str, int] = defaultdict(int)
        for n in per_crop:
            buckets[f"{10 * (n // 10):>2}-{10 * (n // 10) + 9}"] += 1
        lines += ["", f"classes listed per crop: min {per_crop[0]}, median {per_crop[len(per_crop) // 2]}, "
                      f"max {per_crop[-1]}"]
        lines += [f"  {k} classes: {v} crops" for k, v in sorted(buckets.items())]
    for version, crops in sorted(catalog.tests.items()):
        rows = sum(len(c.labels) for c in crops.values())
        lines += ["", f"test crops ({version} manifest): {len(crops)} crops, {rows} (crop, label) rows"]
        for c in crops.values():
            g = next(iter(c.labels.values()))
            lines.append(f"  crop{c.id:<5} {c.dataset:<24} {_fmt_vs(g.voxel_size_nm):>12} nm  "
                         f"{'×'.join(map(str, g.shape_vox)):>14}  {len(c.labels):>2} labels")
    return "\n".join(lines)
