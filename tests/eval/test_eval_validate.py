"""`validate_submission` lists every problem the evaluators would meet, per era, without scoring."""

import pickle
import shutil

import numpy as np
from eval_helpers import THREE_BALLS, balls

from cellseg.data.crops import Crop, Geometry
from cellseg.data.write import write_array, write_multiscale
from cellseg.eval import validate, validate_submission
from cellseg.eval.eras import ERAS, get_era
from cellseg.eval.io import list_crop, open_source
from cellseg.eval.rules import is_scored_as_instance

G = Geometry(voxel_size_nm=(8.0, 8.0, 8.0), translation_nm=(0.0, 0.0, 0.0), shape_vox=(32, 32, 32))
LABELS = ("mito", "nuc", "er", "pm", "ld", "golgi_mem", "cell", "golgi", "endo")
CROPS = {1: Crop(id=1, dataset="s", labels=dict.fromkeys(LABELS, G)), 2: Crop(id=2, dataset="s", labels={"er": G})}
ATTRS = {"voxel_size": [8, 8, 8], "translation": [0, 0, 0]}


def _find(issues, where, text, eras=None):
    hits = [i for i in issues if i.where == where and text in i.message and (eras is None or set(i.eras) == set(eras))]
    assert hits, f"no issue at {where} mentioning {text!r}:\n" + "\n".join(map(str, issues))
    return hits[0]


def _problem_submission(sub):
    """A submission of crop 1 with one problem per label (crop 2 missing)."""
    ids = np.zeros((32, 32, 32), np.uint8)
    ids[4:8, 4:8, 4:8] = 1
    write_array(sub / "crop1" / "mito", ids, attrs=ATTRS)  # uint8 ids
    write_multiscale(sub / "crop1" / "nuc", ids, voxel_size_nm=(8, 8, 8), translation_nm=(0, 0, 0), kind="labels",
                     num_levels=1)
    write_array(sub / "crop1" / "er", np.full((32, 32, 32), 0.2, np.float32), attrs=ATTRS)  # probabilities
    write_array(sub / "crop1" / "pm", np.ones((30, 30, 30), np.uint8), attrs={})  # no attributes
    write_array(sub / "crop1" / "ld", np.ones((16, 32, 32), np.uint16),
                attrs={"voxel_size": [8, 8, 8], "translation": [40, 0, 0]})  # smaller, starts inside
    write_array(sub / "crop1" / "golgi_mem", np.ones((64, 64, 64), bool), attrs={"voxel_size": [4, 4, 4],
                                                                                 "translation": [0, 0, 0]})
    nan = np.zeros((32, 32, 32), np.float32)
    nan[0] = np.nan
    write_array(sub / "crop1" / "golgi", nan, attrs=ATTRS)
    write_array(sub / "crop1" / "mitochondria", ids, attrs=ATTRS)
    write_array(sub / "crop1" / "cell", ids.astype(np.uint16), attrs={"voxel_size": [8, 8, 8],
                                                                      "translation": [4, 4, 4]})
    return sub


def test_lists_every_problem(tmp_path):
    issues = validate_submission(_problem_submission(tmp_path / "s.zarr"), CROPS)
    _find(issues, "crop2", "crop missing")
    _find(issues, "crop1/endo", "absent")
    _find(issues, "crop1/nuc", "written as a group")
    _find(issues, "crop1/mito", "uint8 instance ids")
    _find(issues, "crop1/er", "thresholded at > 0")
    _find(issues, "crop1/pm", "centre-cropped/padded")
    _find(issues, "crop1/ld", "copy-length bug", eras=["2025"])
    # every era placing it without the bug (2026 and the 2026-07 reconstruction) shares one issue
    without_bug = [e for e in ERAS if not get_era(e).copy_length_bug]
    _find(issues, "crop1/ld", "covers 50.0% of the crop", eras=without_bug)
    _find(issues, "crop1/golgi_mem", "skimage refuses it", eras=["2025"])
    _find(issues, "crop1/golgi", "NaN")
    _find(issues, "crop1/mitochondria", "did you mean mito")
    assert not [i for i in issues if i.where == "crop1/cell" and i.severity != "info"]  # 4 nm off: snaps to 0


def test_workers_give_the_same_issues_in_the_same_order(tmp_path, stores):
    sub = _problem_submission(tmp_path / "s.zarr")
    many = np.zeros((32, 32, 32), np.uint16)
    many[::2, ::2, ::2] = 1  # 4096 objects: an info line, or errors against the truth
    write_array(sub / "crop1" / "ld", many, attrs=ATTRS, overwrite=True)
    write_array(sub / "crop2" / "er", np.ones((32, 32, 32), np.uint8), attrs=ATTRS)
    (sub / "crop2" / "er" / "0" / "0" / "0").write_bytes(b"not blosc")  # unreadable: an error from the data check
    truth = open_source(stores.truth({"crop1": {"ld": (many[:1] + 1).repeat(32, 0)}}))
    for path in (sub, stores.zip(sub)):
        for kwargs in ({}, {"truth": truth}):
            issues = validate_submission(path, CROPS, workers=1, **kwargs)
            assert validate_submission(path, CROPS, workers=4, **kwargs) == issues
            _find(issues, "crop2/er", "cannot read")
            _find(issues, "crop1/golgi", "NaN")
            _find(issues, "crop1/ld", "too many instances" if kwargs else "4096 objects")


def test_a_process_pool_gives_the_same_issues(tmp_path, stores, monkeypatch):
    """From PROCESS_MIN_INSTANCE_VOXELS on (lowered here), `workers` spawned processes check the data: the same
    issues, in the same order, as one thread or a pool of threads, errors of unreadable arrays included."""
    sub = _problem_submission(tmp_path / "s.zarr")
    many = np.zeros((32, 32, 32), np.uint16)
    many[::2, ::2, ::2] = 1  # 4096 objects for 1 true one: too many instances
    write_array(sub / "crop1" / "ld", many, attrs=ATTRS, overwrite=True)
    write_array(sub / "crop1" / "endo", balls((32, 32, 32), THREE_BALLS).astype(np.uint32), attrs=ATTRS)
    write_array(sub / "crop2" / "er", np.ones((32, 32, 32), np.uint8), attrs=ATTRS)
    (sub / "crop2" / "er" / "0" / "0" / "0").write_bytes(b"not blosc")  # unreadable: an error from the data check
    truth = open_source(stores.truth({"crop1": {"ld": np.ones((32, 32, 32), np.uint16),
                                                "endo": balls((32, 32, 32), THREE_BALLS)}}))
    runs = [(sub, {"truth": truth}), (stores.zip(sub), {"truth": truth}), (sub, {})]
    serial = [validate_submission(path, CROPS, workers=1, **kwargs) for path, kwargs in runs]
    assert [validate_submission(path, CROPS, workers=2, **kwargs) for path, kwargs in runs] == serial  # threads
    monkeypatch.setattr(validate, "PROCESS_MIN_INSTANCE_VOXELS", 32**3)
    assert validate.uses_processes(5 * 32**3, 2) and not validate.uses_processes(5 * 32**3, 1)
    assert [validate_submission(path, CROPS, workers=2, **kwargs) for path, kwargs in runs] == serial
    for issues in serial:
        _find(issues, "crop2/er", "cannot read")
        _find(issues, "crop1/golgi", "NaN")
    _find(serial[0], "crop1/ld", "too many instances", eras=["2025"])
    _find(serial[1], "crop1/ld", "too many instances", eras=["2026"])
    _find(serial[2], "crop1/ld", "4096 objects")
    source = open_source(sub)  # a check that loses its process names its array
    check = validate.DataCheck(source, list_crop(source, "crop1").arrays["ld"], "crop1/ld", True, 2**30)
    assert pickle.loads(pickle.dumps(check)) == check
    assert [str(i) for i in validate._died(check)] == [
        "error   crop1/ld: values not checked: the process reading them died (out of memory?) [all eras]"]


def test_small_submissions_keep_the_threads(tmp_path):
    """Processes pay for themselves only on large submissions: a few small crops, or one worker, use threads."""
    sub = open_source(_problem_submission(tmp_path / "s.zarr"))
    voxels = sum(info.num_voxels for crop in CROPS.values() for label, info in list_crop(sub, crop.name).arrays.items()
                 if label in crop.labels and is_scored_as_instance(label))
    assert 0 < voxels < validate.PROCESS_MIN_INSTANCE_VOXELS
    assert not validate.uses_processes(voxels, 8)
    assert validate.uses_processes(validate.PROCESS_MIN_INSTANCE_VOXELS, 2)
    assert not validate.uses_processes(10 * validate.PROCESS_MIN_INSTANCE_VOXELS, 1)


def test_too_many_instances_against_the_truth(tmp_path, stores):
    truth = np.zeros((32, 32, 32), np.uint16)
    truth[10:20, 10:20, 10:20] = 1
    pred = np.zeros_like(truth)
    pred[::2, ::2, ::2] = 1  # 4096 separate voxels
    t = stores.truth({"crop1": {"mito": truth}})
    sub = stores.submission({"crop1": {"mito": pred}})
    crops = {1: Crop(id=1, dataset="s", labels={"mito": G})}
    issues = validate_submission(sub, crops, truth=open_source(t))
    _find(issues, "crop1/mito", "too many instances", eras=["2025"])
    _find(issues, "crop1/mito", "too many instances", eras=["2026"])


def test_layout_problems_name_the_era(tmp_path, stores):
    er = np.ones((32, 32, 32), np.uint8)
    sub = stores.submission({"crop2": {"er": er}})
    shutil.move(sub / "crop2", sub / "2")
    issues = validate_submission(sub, {2: CROPS[2]})
    _find(issues, "submission", "lack the 'crop' prefix", eras=["2025"])
    nested = stores.zip(stores.submission({"crop2": {"er": er}}), prefix="out/submission.zarr/")
    issues = validate_submission(nested, {2: CROPS[2]})
    _find(issues, "submission", "not at the root", eras=["2025"])
    assert not [i for i in issues if i.severity == "error" and "2026" in i.eras]


def test_an_integer_mask_is_decoded_chunk_by_chunk(tmp_path, stores):
    """Integer semantic masks are only decoded (no value can be wrong): a chunk that decodes to the wrong size,
    or not at all, is an error naming the chunk; chunks never written read as the fill value and are fine."""
    from numcodecs import Blosc

    sub = tmp_path / "s.zarr"
    mask = np.zeros((96, 32, 32), np.uint8)
    mask[:40] = 1
    write_array(sub / "crop2" / "er", mask, attrs=ATTRS, chunks=(32, 32, 32))
    (sub / "crop2" / "er" / "2" / "0" / "0").unlink()  # an all-zero chunk not stored: fine
    crops = {2: Crop(id=2, dataset="s", labels={"er": Geometry(voxel_size_nm=(8.0,) * 3, translation_nm=(0.0,) * 3,
                                                               shape_vox=(96, 32, 32))})}
    assert [i for i in validate_submission(sub, crops) if i.severity == "error"] == []
    small = Blosc(cname="zstd", clevel=3, shuffle=Blosc.BITSHUFFLE).encode(np.ones((16, 32, 32), np.uint8))
    (sub / "crop2" / "er" / "1" / "0" / "0").write_bytes(small)
    for path in (sub, stores.zip(sub)):
        errors = [str(i) for i in validate_submission(path, crops) if i.severity == "error"]
        assert len(errors) == 1 and "crop2/er/1/0/0: decodes to 16384 bytes, not the 32768" in errors[0], errors
