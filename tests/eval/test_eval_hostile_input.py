"""Hostile and malformed submissions: refused before reading, or scored as missing with a reason."""

import json
import stat
import zipfile

import numpy as np
import pytest

from cellseg.eval import evaluate
from cellseg.eval.safezip import UnsafeZipError, ZipLimits, inspect_zip


def _zip(path, members):
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            if isinstance(data, zipfile.ZipInfo):
                archive.writestr(data, b"target")
            else:
                archive.writestr(name, data)
    return path


ZGROUP = json.dumps({"zarr_format": 2})


def _zarray(shape, chunks, dtype="|u1", compressor=None, filters=None):
    return json.dumps({"zarr_format": 2, "shape": shape, "chunks": chunks, "dtype": dtype, "compressor": compressor,
                       "fill_value": 0, "order": "C", "filters": filters})


@pytest.mark.parametrize("name", ["../evil", "/etc/passwd", "crop1/../../x", "C:/windows", "crop1\\..\\x"])
def test_path_traversal_is_refused(tmp_path, name):
    path = _zip(tmp_path / "s.zip", {".zgroup": ZGROUP, name: b"x"})
    with pytest.raises(UnsafeZipError, match="refused before reading anything"):
        inspect_zip(path)


def test_symlinks_are_refused(tmp_path):
    link = zipfile.ZipInfo("crop1/mito")
    link.external_attr = (stat.S_IFLNK | 0o777) << 16
    path = _zip(tmp_path / "s.zip", {".zgroup": ZGROUP, "crop1/mito": link})
    with pytest.raises(UnsafeZipError, match="symbolic link"):
        inspect_zip(path)


def test_decompressed_size_beyond_declared_shapes_is_refused(tmp_path):
    bomb = b"\0" * (4 * 2**20)  # 4 MiB of zeros compresses to a few KiB
    members = {".zgroup": ZGROUP, "crop1/.zgroup": ZGROUP,
               "crop1/mito/.zarray": _zarray([4, 4, 4], [4, 4, 4]), "crop1/mito/0.0.0": bomb}
    path = _zip(tmp_path / "bomb.zip", members)
    assert path.stat().st_size < 100_000
    with pytest.raises(UnsafeZipError, match="declares chunks of 64 bytes"):
        inspect_zip(path)
    stray = _zip(tmp_path / "stray.zip", {".zgroup": ZGROUP, "notes/big.bin": bomb})
    with pytest.raises(UnsafeZipError, match="belong to no declared array"):
        inspect_zip(stray, ZipLimits(max_other_bytes=2**20))
    with pytest.raises(UnsafeZipError, match="GiB"):
        inspect_zip(stray, ZipLimits(max_total_bytes=2**20))


def test_unsafe_zip_stops_evaluate_with_a_clear_message(tmp_path, stores, three_balls):
    truth = stores.truth({"crop1": {"mito": three_balls}})
    path = _zip(tmp_path / "s.zip", {".zgroup": ZGROUP, "../x": b"x"})
    with pytest.raises(ValueError, match=r"'\.\.' component"):
        evaluate(path, truth, metric="2026")


def test_corrupt_zip_gives_a_clear_message(tmp_path, stores, three_balls):
    truth = stores.truth({"crop1": {"mito": three_balls}})
    good = stores.zip(stores.submission({"crop1": {"mito": three_balls}}))
    broken = tmp_path / "broken.zip"
    broken.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(ValueError, match="not a valid zip archive"):
        evaluate(broken, truth, metric="2025")


def test_non_zarr_folder_scores_everything_as_missing(tmp_path, stores, three_balls):
    truth = stores.truth({"crop1": {"mito": three_balls}})
    folder = tmp_path / "photos"
    folder.mkdir()
    (folder / "cat.jpg").write_bytes(b"\xff\xd8")
    ev = evaluate(folder, truth, metric="2026")
    assert ev.missing["crops"] == ["crop1"] and ev.overall_score == 0.0
    assert any("No volumes found" in f for f in ev.official_failures)


def test_non_zarr_truth_is_a_clear_error(tmp_path, stores, three_balls):
    sub = stores.submission({"crop1": {"mito": three_balls}})
    with pytest.raises(ValueError, match="no crop folders with label arrays"):
        evaluate(sub, tmp_path, metric="2026")


def test_object_dtype_and_pickle_codecs_are_never_read(tmp_path, stores, three_balls):
    truth = stores.truth({"crop1": {"mito": three_balls, "er": (three_balls > 0).astype(np.uint8)}})
    members = {".zgroup": ZGROUP, "crop1/.zgroup": ZGROUP,
               "crop1/mito/.zarray": _zarray([48, 48, 48], [48, 48, 48], dtype="|O", filters=[{"id": "pickle"}]),
               "crop1/mito/0.0.0": b"cos\nsystem\n(S'echo pwned'\ntR.",
               "crop1/er/.zarray": _zarray([48, 48, 48], [48, 48, 48], compressor={"id": "evil"}),
               "crop1/er/0.0.0": b"x"}
    ev = evaluate(_zip(tmp_path / "s.zip", members), truth, metric="2026")
    assert "not numeric" in ev.missing["unreadable"]["crop1"]["mito"]
    assert "not allowed" in ev.missing["unreadable"]["crop1"]["er"]
    assert ev.crop_scores["crop1"]["mito"]["is_missing"] and ev.crop_scores["crop1"]["er"]["is_missing"]


def test_memory_budget_refuses_huge_declared_shapes(tmp_path, stores, three_balls):
    truth = stores.truth({"crop1": {"er": (three_balls > 0).astype(np.uint8)}})
    members = {".zgroup": ZGROUP, "crop1/.zgroup": ZGROUP,
               "crop1/er/.zarray": _zarray([100_000, 100_000, 100_000], [64, 64, 64]),
               "crop1/er/.zattrs": json.dumps({"voxel_size": [8, 8, 8], "translation": [0, 0, 0]})}
    ev = evaluate(_zip(tmp_path / "s.zip", members), truth, metric="2025", memory_budget_bytes=2**30)
    assert "memory budget" in ev.missing["unreadable"]["crop1"]["er"]
    assert ev.label_scores["er"]["iou"] == 0


def test_corrupt_chunks_and_bad_attributes_are_scored_as_missing(stores, three_balls):
    er = (three_balls > 0).astype(np.uint8)
    truth = stores.truth({"crop1": {"mito": three_balls, "er": er, "nuc": three_balls}})
    sub = stores.submission({"crop1": {"mito": three_balls, "er": er}})
    sub2 = stores.submission({"crop1": {"nuc": three_balls}}, attrs={"voxel_size": "eight"}, name=sub.name)
    assert sub2 == sub
    for chunk in (sub / "crop1" / "mito").rglob("0"):
        if chunk.is_file():
            chunk.write_bytes(b"garbage")
    ev = evaluate(sub, truth, metric="2025")
    assert set(ev.missing["unreadable"]["crop1"]) == {"mito", "nuc"}
    assert ev.label_scores["er"]["iou"] == 1.0


def test_nan_in_a_semantic_array_is_background(stores, three_balls):
    er = (three_balls > 0).astype(np.uint8)
    truth = stores.truth({"crop1": {"er": er}})
    pred = er.astype(np.float32)
    pred[er == 1] = np.nan
    ev = evaluate(stores.submission({"crop1": {"er": pred}}), truth, metric="2026")
    assert ev.label_scores["er"]["tp"] == 0 and ev.label_scores["er"]["fn"] == er.sum()
    assert "NaN voxels count as background" in ev.array_notes["crop1"]["er"][0]


def test_unknown_labels_in_the_submission_are_ignored_and_listed(stores, three_balls):
    truth = stores.truth({"crop1": {"mito": three_balls}})
    sub = stores.submission({"crop1": {"mito": three_balls, "mitochondria": three_balls}})
    ev = evaluate(sub, truth, metric="2026")
    assert ev.missing["not_in_truth"] == {"crop1": ["mitochondria"]} and ev.overall_instance_score == 1.0
