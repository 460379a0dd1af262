"""Tuning against the challenge metric on crafted cases, and the parameter file."""

from __future__ import annotations

import json

import numpy as np
import pytest
from blobs import ball

from cellseg.postprocess.params import InstanceParams, ParamSet, SemanticParams
from cellseg.postprocess.tune import Sample, score_samples, tune_class

ISO = (8.0, 8.0, 8.0)


def _semantic_sample(name: str, seed: int) -> Sample:
    """Truth = a ball; the model gives 0.65 inside, 0.45 on a 3-voxel halo, 0.05 elsewhere (+ noise)."""
    rng = np.random.default_rng(seed)
    truth = ball((24, 24, 24), (96, 96, 96), 56.0, ISO)
    halo = ball((24, 24, 24), (96, 96, 96), 80.0, ISO) & ~truth
    prob = np.where(truth, 0.65, np.where(halo, 0.45, 0.05)) + rng.uniform(-0.03, 0.03, truth.shape)
    return Sample(crop=name, prob=prob.astype(np.float32), boundary=None, truth=truth,
                  inside=np.ones_like(truth), voxel_size_nm=ISO)


@pytest.mark.parametrize("era", ["2025", "2026"])
def test_semantic_threshold_beats_a_bad_one(era):
    samples = [_semantic_sample("crop1", 0), _semantic_sample("crop2", 1)]
    best, scores = tune_class("er", samples, era=era)
    assert isinstance(best, SemanticParams)
    assert 0.45 < best.threshold < 0.65
    bad = score_samples("er", samples, SemanticParams(threshold=0.3), era=era)
    assert scores["score"] == pytest.approx(1.0) and bad < 0.5
    assert scores["score"] >= scores["default_score"]


def test_instance_seed_distance_is_tuned_to_split_touching_objects():
    truth = np.zeros((32, 32, 48), dtype=np.uint32)
    a = ball(truth.shape, (128, 128, 120), 80.0, ISO)
    b = ball(truth.shape, (128, 128, 264), 80.0, ISO)
    truth[a] = 1
    truth[b & ~a] = 2
    prob = np.where(truth > 0, 0.9, 0.05).astype(np.float32)
    samples = [Sample(crop="crop1", prob=prob, boundary=None, truth=truth, inside=np.ones(truth.shape, bool),
                      voxel_size_nm=ISO)]
    best, scores = tune_class("mito", samples, era="2026")
    assert isinstance(best, InstanceParams)
    assert best.seed_distance_nm > 0  # the defaults keep the two balls merged
    assert scores["score"] > 0.95 > scores["default_score"]


def test_param_file_round_trip_and_errors(tmp_path):
    params = ParamSet({"mito": InstanceParams(seed_distance_nm=16.0, min_size_nm3=1000.0),
                       "er": SemanticParams(threshold=0.4)},
                      scores={"mito": {"score": 0.9, "default_score": 0.8}}, era="2026")
    path = params.save(tmp_path / "p.json")
    loaded = ParamSet.load(path)
    assert loaded.classes == params.classes and loaded.scores["mito"]["score"] == 0.9 and loaded.era == "2026"
    assert loaded.get("nuc") == InstanceParams() and loaded.get("ecs") == SemanticParams()
    with pytest.raises(FileExistsError):
        params.save(path)

    def write(classes):
        doc = {**json.loads(path.read_text()), "classes": classes}
        (tmp_path / "bad.json").write_text(json.dumps(doc))
        return tmp_path / "bad.json"

    with pytest.raises(ValueError, match=r"'mitochondrion'.*unknown CellMap class"):
        ParamSet.load(write({"mitochondrion": {"threshold": 0.5}}))
    with pytest.raises(ValueError, match=r"unknown keys \['seed_distance'\]"):
        ParamSet.load(write({"mito": {"seed_distance": 3}}))
    with pytest.raises(ValueError, match="scores er as semantic"):
        ParamSet.load(write({"er": {"kind": "instance"}}))
    with pytest.raises(ValueError, match="fill_holes must be true/false"):
        ParamSet.load(write({"er": {"fill_holes": 1}}))
    with pytest.raises(ValueError, match="not a cellseg post-processing parameter file"):
        (tmp_path / "other.json").write_text("{}")
        ParamSet.load(tmp_path / "other.json")
    with pytest.raises(ValueError, match=r"\['nuc'\] are not classes of pred.zarr.*\['mito', 'er'\]"):
        ParamSet({"nuc": InstanceParams()}).check_classes(["mito", "er"], store="pred.zarr")
