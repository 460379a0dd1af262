"""Hierarchy-aware decoding: the two options on small arrays, the parameter file, tuning that keeps an option only
where it wins, and `postprocess_store` applying the kept options."""

from __future__ import annotations

import json

import numpy as np
import pytest
from blobs import random_probabilities

from cellseg.data.crops import Catalog
from cellseg.data.grid import Grid
from cellseg.data.prediction_store import PredictionStore
from cellseg.eval.truth import read_class_truth
from cellseg.postprocess.hierarchy import (
    Rivals,
    argmax_probability,
    check_option,
    edited_probability,
    option_for,
    partners,
    union_probability,
)
from cellseg.postprocess.native import decode_on_grid
from cellseg.postprocess.params import InstanceParams, ParamSet, SemanticParams
from cellseg.postprocess.tune import split_entry

ISO = (8.0, 8.0, 8.0)


@pytest.mark.parametrize(("t_group", "t_atoms"), [(0.5, (0.5, 0.5)), (0.3, (0.7, 0.2)), (0.8, (0.1, 0.9))])
def test_union_is_the_union_of_the_masks_on_the_model_grid(t_group, t_atoms):
    rng = np.random.default_rng(0)
    group, *atoms = (random_probabilities(rng, (12, 14, 16), 1.5) for _ in range(3))
    edited = union_probability(group, t_group, zip(atoms, t_atoms, strict=True))
    want = group > np.float32(t_group)
    for p, t in zip(atoms, t_atoms, strict=True):
        want |= p > np.float32(t)
    np.testing.assert_array_equal(edited > np.float32(t_group), want)
    assert edited.dtype == np.float32 and 0 <= edited.min() and edited.max() <= 1 and (edited >= group).all()
    # an atom value one float32 step above its threshold still lifts the group above its own
    tight = np.full((1, 1, 2), np.nextafter(np.float32(0.3), np.float32(1)), np.float32)
    assert (union_probability(np.zeros_like(tight), 0.5, [(tight, 0.3)]) > np.float32(0.5)).all()


def test_union_holds_on_a_finer_annotation_grid():
    """Interpolated and thresholded on a finer grid, the group still covers every voxel its atom's decoding marks."""
    rng = np.random.default_rng(1)
    source = Grid(translation_nm=(8.0, 8.0, 8.0), shape_vox=(10, 12, 14), voxel_size_nm=(16.0, 16.0, 16.0))
    target = Grid(translation_nm=(2.0, 2.0, 2.0), shape_vox=(40, 48, 56), voxel_size_nm=(4.0, 4.0, 4.0))
    group, atom = random_probabilities(rng, source.shape_vox, 1.5), random_probabilities(rng, source.shape_vox, 1.0)
    edited = union_probability(group, 0.6, [(atom, 0.35)])
    atom_mask = decode_on_grid("golgi_mem", atom, source=source, target=target, params=SemanticParams(threshold=0.35))
    group_mask = decode_on_grid("golgi", edited, source=source, target=target, params=SemanticParams(threshold=0.6))
    plain = decode_on_grid("golgi", group, source=source, target=target, params=SemanticParams(threshold=0.6))
    assert (atom_mask & ~plain).any()  # the atom reaches outside the plain group
    assert not (atom_mask & ~group_mask).any() and not (plain & ~group_mask).any()


def test_argmax_keeps_the_most_probable_positive_atom():
    rng = np.random.default_rng(2)
    names, thresholds = ("mito_mem", "mito_lum", "er_mem"), (0.4, 0.5, 0.3)
    probs = [random_probabilities(rng, (10, 12, 14), 1.2) for _ in names]
    rivals = Rivals.of(zip(names, probs, thresholds, strict=True))
    masks = np.stack([p > np.float32(t) for p, t in zip(probs, thresholds, strict=True)])
    values = np.where(masks, np.stack(probs), -1.0)
    edited = [argmax_probability(p, t, rivals.best_other(n)) > np.float32(t)
              for n, p, t in zip(names, probs, thresholds, strict=True)]
    for k in range(len(names)):
        others = np.delete(values, k, axis=0).max(axis=0)
        np.testing.assert_array_equal(rivals.best_other(names[k]), others.astype(np.float32))
        np.testing.assert_array_equal(edited[k], masks[k] & (values[k] >= others))
    assert (masks.sum(0) > 1).any() and (np.sum(edited, axis=0) <= 1).all()  # overlaps existed; none is left
    assert (np.any(edited, axis=0) == masks.any(axis=0)).all()  # every positive voxel keeps one atom
    # ties keep both
    same = np.full((1, 1, 1), 0.7, np.float32)
    tie = Rivals.of([("mito_mem", same, 0.5), ("mito_lum", same, 0.5)])
    assert argmax_probability(same, 0.5, tie.best_other("mito_mem")) == 0.7


def test_partners_use_what_the_prediction_holds():
    assert option_for("mito") == "union" and option_for("mito_mem") == "argmax"
    assert partners("mito", ["mito", "mito_lum", "er_mem", "mito_mem"]) == ("mito_mem", "mito_lum")
    assert partners("mito", ["mito", "er"]) == ()
    assert partners("mito_mem", ["mito", "mito_mem", "er_mem", "er"]) == ("er_mem",)  # atoms only
    p = np.full((2, 2, 2), 0.2, np.float32)

    def never(_):
        raise AssertionError("nothing to read")

    same = edited_probability("mito", "union", p, present=["mito", "er"], threshold_of=lambda c: 0.5, read=never,
                              rivals=never)
    assert same is p
    with pytest.raises(ValueError, match="mito_mem is an atom: only 'argmax' applies"):
        check_option("mito_mem", "union")
    with pytest.raises(ValueError, match="mito is a group: only 'union' applies"):
        check_option("mito", "argmax")


def test_params_version_1_loads_with_options_off_and_version_2_round_trips(tmp_path):
    old = tmp_path / "v1.json"
    old.write_text(json.dumps({"format": "cellseg-postprocess-params", "version": 1, "era": "2026",
                               "classes": {"mito": {"kind": "instance", "threshold": 0.4, "score": 0.8},
                                           "er": {"kind": "semantic", "threshold": 0.3}}}))
    loaded = ParamSet.load(old)
    assert loaded.get("mito") == InstanceParams(threshold=0.4) and loaded.get("mito").hierarchy is None
    assert loaded.get("er").hierarchy is None and loaded.scores["mito"] == {"score": 0.8}
    params = ParamSet({"mito": InstanceParams(threshold=0.4, hierarchy="union"),
                       "mito_mem": SemanticParams(hierarchy="argmax"), "er": SemanticParams()},
                      scores={"mito": {"score": 0.9, "default_score": 0.7, "hierarchy_off_score": 0.8,
                                       "hierarchy_on_score": 0.9}}, era="2026")
    path = params.save(tmp_path / "v2.json")
    doc = json.loads(path.read_text())
    assert doc["version"] == 2 and doc["classes"]["mito"]["hierarchy"] == "union"
    assert doc["classes"]["er"]["hierarchy"] is None
    again = ParamSet.load(path)
    assert again.classes == params.classes and again.scores["mito"] == params.scores["mito"]
    doc["classes"]["mito_mem"]["hierarchy"] = "union"
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=r"v2.json: class 'mito_mem': mito_mem: hierarchy option 'union'"):
        ParamSet.load(path)
    with pytest.raises(ValueError, match="hierarchy must be null or one of"):
        SemanticParams(hierarchy="max")
    with pytest.raises(ValueError, match="er is a group"):
        ParamSet({"er": SemanticParams(hierarchy="argmax")}).check_classes(["er"], store="p.zarr")


# ------------------------------------------------------------------- tuning and applying on a synthetic root

CLASSES = ("golgi", "golgi_mem", "golgi_lum")


def _store(root, path, case: str) -> PredictionStore:
    """Probabilities on the label grid of crops 1 and 3, made from their truth (golgi = golgi_mem | golgi_lum).

    "union wins": golgi is missed (0.05 everywhere), its atoms are found (0.9); golgi_lum is also 0.8 on
    golgi_mem, which no threshold separates but golgi_mem's 0.9 there does ("argmax" wins for golgi_lum).
    "union loses": golgi is found, golgi_mem also fires on a slab of background that golgi does not.
    """
    catalog = Catalog.from_dir(root)
    store = PredictionStore.create(path, kind="probabilities", channels=list(CLASSES), instance_channels=[])
    for crop_id in (1, 3):
        g = catalog.train[crop_id].labels["golgi"]
        grid = Grid(translation_nm=g.translation_nm, shape_vox=g.shape_vox, voxel_size_nm=g.voxel_size_nm)
        truth = {c: read_class_truth(split_entry(catalog, crop_id), c, grid)[0] for c in CLASSES}
        mem, lum = truth["golgi_mem"], truth["golgi_lum"]
        if case == "union wins":
            arrays = {"golgi": np.full(mem.shape, 0.05), "golgi_mem": np.where(mem, 0.9, 0.05),
                      "golgi_lum": np.where(lum | mem, 0.8, 0.05)}
        else:
            slab = np.zeros(mem.shape, bool)
            slab[:, :4] = True
            slab &= ~truth["golgi"]
            arrays = {"golgi": np.where(truth["golgi"], 0.9, 0.05), "golgi_mem": np.where(mem | slab, 0.9, 0.05),
                      "golgi_lum": np.where(lum, 0.9, 0.05)}
        store.write_crop(f"crop{crop_id}", grid, {k: v.astype(np.float32) for k, v in arrays.items()})
    return store


def test_tuning_keeps_an_option_only_where_it_wins(tiny_synth_root, tmp_path):
    from cellseg.postprocess.tuning import tune_store

    wins = tune_store(_store(tiny_synth_root, tmp_path / "a.zarr", "union wins"), tiny_synth_root,
                      crops=["1", "3"], progress=False)
    s = wins.scores
    assert wins.get("golgi").hierarchy == "union"
    assert s["golgi"]["hierarchy_off_score"] < 0.01 and s["golgi"]["hierarchy_on_score"] == pytest.approx(1.0)
    assert s["golgi"]["score"] == s["golgi"]["hierarchy_on_score"]
    assert wins.get("golgi_lum").hierarchy == "argmax"
    assert s["golgi_lum"]["hierarchy_on_score"] == pytest.approx(1.0) and s["golgi_lum"]["hierarchy_off_score"] < 0.6
    assert wins.get("golgi_mem").hierarchy is None  # nothing to take from it: a tie keeps it off
    assert s["golgi_mem"]["hierarchy_on_score"] == s["golgi_mem"]["hierarchy_off_score"] == s["golgi_mem"]["score"]

    loses = tune_store(_store(tiny_synth_root, tmp_path / "b.zarr", "union loses"), tiny_synth_root,
                       crops=["1", "3"], progress=False)
    s = loses.scores
    assert loses.get("golgi").hierarchy is None and s["golgi"]["score"] == pytest.approx(1.0)
    assert s["golgi"]["hierarchy_on_score"] < s["golgi"]["hierarchy_off_score"] == s["golgi"]["score"]
    plain = tune_store(_store(tiny_synth_root, tmp_path / "c.zarr", "union wins"), tiny_synth_root,
                       crops=["1", "3"], hierarchy=False, progress=False)
    assert not any(p.hierarchy for p in plain.classes.values()) and "hierarchy_on_score" not in plain.scores["golgi"]
    # the hierarchy options scored in worker processes: the same decisions and scores
    spread = tune_store(_store(tiny_synth_root, tmp_path / "d.zarr", "union wins"), tiny_synth_root,
                        crops=["1", "3"], progress=False, workers=2)
    assert {n: p.hierarchy for n, p in spread.classes.items()} == {n: p.hierarchy for n, p in wins.classes.items()}
    assert spread.scores == wins.scores


@pytest.mark.parametrize("grid", ["annotation", "model"])
def test_postprocess_applies_the_kept_options(tiny_synth_root, tmp_path, grid):
    from cellseg.postprocess.apply import postprocess_store

    pred = _store(tiny_synth_root, tmp_path / "a.zarr", "union wins")
    params = ParamSet({"golgi": SemanticParams(hierarchy="union"), "golgi_lum": SemanticParams(hierarchy="argmax"),
                       "golgi_mem": SemanticParams()})
    seg = postprocess_store(pred, tmp_path / "seg.zarr", params=params, device="cpu", progress=False, grid=grid,
                            data_root=str(tiny_synth_root))
    off = postprocess_store(pred, tmp_path / "off.zarr", params=ParamSet(), device="cpu", progress=False, grid=grid,
                            data_root=str(tiny_synth_root))
    catalog = Catalog.from_dir(tiny_synth_root)
    for crop_id in (1, 3):
        crop = f"crop{crop_id}"
        got = {c: seg.read(crop, c).astype(bool) for c in CLASSES}
        plain = {c: off.read(crop, c).astype(bool) for c in CLASSES}
        truth = read_class_truth(split_entry(catalog, crop_id), "golgi", pred.grid(crop))[0]
        assert not plain["golgi"].any() and (got["golgi"] == truth).all()  # the union of the atoms
        assert (plain["golgi_lum"] & plain["golgi_mem"]).any() and not (got["golgi_lum"] & got["golgi_mem"]).any()
        assert (got["golgi_mem"] == plain["golgi_mem"]).all()
    assert seg.provenance["postprocess"]["classes"]["golgi"]["hierarchy"] == "union"
    assert "hierarchy" not in off.provenance["postprocess"]["classes"]["golgi"]  # as written before the options


def test_cli_tuning_prints_the_hierarchy_decisions(tiny_synth_root, tmp_path, capsys):
    from cellseg.cli import main

    pred = _store(tiny_synth_root, tmp_path / "a.zarr", "union wins")
    out = tmp_path / "seg.zarr"
    assert main(["postprocess", str(pred.path), "--out", str(out), "--tune-on", str(tiny_synth_root), "--crops",
                 "1", "3", "--device", "cpu"]) == 0
    printed = capsys.readouterr().out
    assert "golgi_lum" in printed and "argmax kept" in printed and "union kept: 0.0000 → 1.0000" in printed
    assert "argmax off" in printed
    params = json.loads((tmp_path / "seg.zarr.params.json").read_text())
    assert params["version"] == 2 and params["classes"]["golgi"]["hierarchy"] == "union"
    assert PredictionStore.open(out).read("crop1", "golgi").any()
