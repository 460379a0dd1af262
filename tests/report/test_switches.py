"""Stage switches: a class that the uniform ensemble, the fitted weights, TTA or post-processing does not improve on
the tuning crops keeps the previous stage's prediction, decided through the evaluator on the tuning crops only."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from crafted import crop_truth

from cellseg.data.prediction_store import PredictionStore
from cellseg.decide.inputs import CropPlan
from cellseg.decide.options import Layout
from cellseg.decide.scoring import ScoreJob, plain_segmentation
from cellseg.decide.switches import (
    stage_switch,
    switch_postprocess,
    switch_tta,
    switch_uniform,
    switch_weighted,
    switched_off,
)
from cellseg.decide.truth import build_truth
from cellseg.infer.weights import WEIGHTS_FILE

CLASSES = ("mito", "er")
CROPS = ("crop1", "crop2", "crop3")
PLAN = CropPlan(scored=("crop1",), tuning=("crop2", "crop3"), scored_spec="1", tuning_spec="2,3")


def test_a_stage_stays_on_only_where_it_scores_strictly_higher():
    switch = stage_switch({"a": 0.5, "b": 0.5, "c": 0.5, "d": math.nan}, {"a": 0.6, "b": 0.5, "c": 0.4, "d": 0.3})
    assert {c: s["on"] for c, s in switch.items()} == {"a": True, "b": False, "c": False, "d": True}
    assert switched_off(switch) == ["b", "c"] and switch["c"] == {"before": 0.5, "after": 0.4, "on": False}


def _store(path: Path, root: Path, make) -> PredictionStore:
    """A probability store of every crop: class → make(class, truth probabilities)."""
    store = PredictionStore.create(path, kind="probabilities", channels=CLASSES, instance_channels=("mito",),
                                   provenance={"data_root": str(root)})
    for crop in CROPS:
        grid, truth = crop_truth(root, crop, CLASSES)
        store.write_crop(crop, grid, {c: make(c, p) for c, p in truth.items()})
    return store


@pytest.fixture
def stages(tiny_synth_root, tmp_path):
    """Stage 3: mito right, er empty (0.3 everywhere); stage 4: mito inverted, er empty as well."""
    empty = lambda p: np.full_like(p, 0.3)  # noqa: E731
    weighted = _store(tmp_path / "weighted.zarr", tiny_synth_root, lambda c, p: p if c == "mito" else empty(p))
    with_tta = _store(tmp_path / "tta.zarr", tiny_synth_root, lambda c, p: 1 - p if c == "mito" else empty(p))
    layout = Layout(tmp_path / "report")
    layout.stores.mkdir(parents=True)
    build_truth(layout.tuning_truth, PLAN.tuning, CLASSES, tiny_synth_root)
    return weighted, with_tta, layout


def test_the_uniform_ensemble_is_switched_off_where_the_best_single_model_is_better(stages, tiny_synth_root,
                                                                                      tmp_path):
    _, wrong, layout = stages  # "wrong": mito inverted, er empty (2026 overall 0)
    # "right": mito right, er found in the half of each crop with the lower x (the better single model)
    half = lambda p: np.where(np.arange(p.shape[-1]) < p.shape[-1] // 2, p, 0.0)  # noqa: E731
    right = _store(tmp_path / "right.zarr", tiny_synth_root, lambda c, p: p if c == "mito" else half(p))
    singles = {name: ScoreJob(store.path, layout.tuning_truth, layout.submission(f"tuning_single_{name}"),
                              layout.segmentation(f"tuning_single_{name}"), PLAN.tuning)
               for name, store in (("wrong", wrong), ("right", right))}
    # A "uniform ensemble": mito at 0.5 (the mean of a right and an inverted model: nothing above the threshold),
    # er decoded from its truth (better than either member's er).
    uniform = _store(tmp_path / "uniform.zarr", tiny_synth_root,
                     lambda c, p: np.full_like(p, 0.5) if c == "mito" else p)
    merged, switch = switch_uniform(uniform, singles, layout, PLAN, layout.tuning_truth, "2026", ["2025", "2026"])
    assert switch["best_single"] == "right" and switch["off"] == ["mito"]
    assert switch["classes"]["er"]["after"] > switch["classes"]["er"]["before"] > 0.0
    assert merged.path == layout.ensemble("uniform_switched")
    assert merged.provenance["merged"] == {"mito": str(right.path), "er": str(uniform.path)}
    for crop in CROPS:
        assert np.array_equal(merged.read(crop, "mito"), right.read(crop, "mito"))
        assert np.array_equal(merged.read(crop, "er"), uniform.read(crop, "er"))
    # The single models' evaluations are kept in both eras, for the report's own scoring to read back.
    for name in singles:
        kept = layout.submission(f"tuning_single_{name}").parent.glob(f"tuning_single_{name}.*.json")
        assert {p.name for p in kept} == {f"tuning_single_{name}.2025.json", f"tuning_single_{name}.2026.json"}


def test_fitted_weights_are_switched_off_where_stage_2_is_better_and_stage_4_gets_stage_2s_weights(
        stages, tiny_synth_root, tmp_path):
    # Stage 2 as switched: mito from the best single model (member 1, stage 2 off for mito), er uniform; its
    # tuning scores are those its switch recorded. The fitted weights (mito inverted, er right) lose mito to it
    # and win er (stage 2's er scored 0 there).
    stage2, _, layout = stages
    weighted = _store(tmp_path / "fitted.zarr", tiny_synth_root, lambda c, p: 1 - p if c == "mito" else p)
    (weighted.path / WEIGHTS_FILE).write_text(json.dumps({"method": "auto", "channels": {
        "mito": [0.7, 0.3], "mito_boundary": [0.7, 0.3], "er": [0.9, 0.1]}, "members": ["a", "b"]}))
    uniform = tmp_path / "uniform_weights.json"
    uniform.write_text(json.dumps({"method": "uniform", "channels": {
        "mito": [0.5, 0.5], "mito_boundary": [1.0, 0.0], "er": [0.5, 0.5]}, "members": ["a", "b"]}))
    recorded = {"classes": {"mito": {"before": 0.9, "after": 0.1, "on": False},
                            "er": {"before": 0.0, "after": 0.0, "on": False}}, "off": ["mito", "er"]}
    merged, switch, weights = switch_weighted(stage2, weighted, recorded, uniform_weights=uniform, best_single=1,
                                              layout=layout, plan=PLAN, truth=layout.tuning_truth, era="2026")
    assert switch["off"] == ["mito"] and switch["classes"]["mito"]["before"] == 0.9
    assert switch["classes"]["er"]["after"] > switch["classes"]["er"]["before"] == 0.0
    assert merged.path == layout.ensemble("weighted_switched")
    for crop in CROPS:
        assert np.array_equal(merged.read(crop, "mito"), stage2.read(crop, "mito"))
        assert np.array_equal(merged.read(crop, "er"), weighted.read(crop, "er"))
    # mito takes stage 2's weights: the best single model alone; its boundary channel, which that model lacks,
    # the uniform ones; er keeps the fitted weights.
    channels = json.loads(weights.read_text())["channels"]
    assert channels == {"mito": [0.0, 1.0], "mito_boundary": [1.0, 0.0], "er": [0.9, 0.1]}
    # Where nothing is switched off (stage 2 without a score: no evidence either way), stage 3 is the fit itself.
    kept = {"classes": {c: {"before": math.nan, "after": math.nan, "on": True} for c in CLASSES}, "off": []}
    again, switch, weights = switch_weighted(weighted, weighted, kept, uniform_weights=uniform, best_single=1,
                                             layout=Layout(tmp_path / "again"), plan=PLAN, truth=layout.tuning_truth,
                                             era="2026")
    assert switch["off"] == [] and again.path == weighted.path and weights == weighted.path / WEIGHTS_FILE


def test_tta_is_switched_off_where_it_does_not_help(stages):
    weighted, with_tta, layout = stages
    merged, switch = switch_tta(weighted, with_tta, layout, PLAN, layout.tuning_truth, "2026", ["2026"])
    # mito: TTA is worse; er: a tie (both empty): neither helps, both keep stage 3's prediction.
    assert sorted(switch["off"]) == ["er", "mito"]
    assert switch["classes"]["mito"]["before"] > switch["classes"]["mito"]["after"]
    assert switch["classes"]["er"]["before"] == switch["classes"]["er"]["after"]
    assert merged.path == layout.ensemble("weighted_tta8_switched")
    for crop in CROPS:
        for c in CLASSES:
            assert np.array_equal(merged.image(crop, c).read_level("s0"), weighted.image(crop, c).read_level("s0"))
    # The other way round TTA helps mito, which keeps it; er still takes the previous stage's.
    other = Layout(layout.root.parent / "other")
    merged, switch = switch_tta(with_tta, weighted, other, PLAN, layout.tuning_truth, "2026", ["2026"])
    assert switch["off"] == ["er"] and switch["classes"]["mito"]["on"]
    assert merged.provenance["merged"] == {"mito": str(weighted.path), "er": str(with_tta.path)}
    for crop in CROPS:
        assert np.array_equal(merged.read(crop, "mito"), weighted.read(crop, "mito"))


def test_post_processing_is_switched_off_where_plain_decoding_is_as_good(stages, tiny_synth_root, tmp_path):
    weighted, with_tta, layout = stages
    stage4, tta_switch = switch_tta(weighted, with_tta, layout, PLAN, layout.tuning_truth, "2026", ["2026"])
    # A "post-processed" segmentation: er decoded from its truth (better than stage 4's empty er), mito the same
    # plain decoding as stage 4 (a tie).
    source = _store(tmp_path / "pp_source.zarr", tiny_synth_root, lambda c, p: p)
    postprocessed = plain_segmentation(source, tmp_path / "postprocessed.zarr", CROPS)
    stores, switch = switch_postprocess(stage4, postprocessed, tta_switch, layout, PLAN, layout.tuning_truth, "2026",
                                        ["2026"])
    merged = stores["2026"]
    assert switch["off"] == ["mito"] and list(stores) == ["2026"]
    assert switch["classes"]["er"]["after"] > switch["classes"]["er"]["before"] == 0.0
    assert switch["classes"]["mito"]["before"] == tta_switch["classes"]["mito"]["before"]  # stage 4's plain score
    plain4 = PredictionStore.open(layout.segmentation("tta"))
    assert merged.completed() == list(PLAN.scored)
    for crop in PLAN.scored:
        assert np.array_equal(merged.read(crop, "mito"), plain4.read(crop, "mito"))
        assert np.array_equal(merged.read(crop, "er"), postprocessed.read(crop, "er"))
        assert merged.read(crop, "er").any() and not plain4.read(crop, "er").any()


def test_post_processing_is_switched_in_each_era_for_its_own_column(stages, tiny_synth_root, tmp_path):
    """Stage 5's switch is made in every era scored: where an era's stage-4 score of a class is not beaten, that
    era's store keeps the plain decoding, while the tuning era keeps the post-processing; eras that agree share one
    store."""
    weighted, with_tta, layout = stages
    stage4, tta_switch = switch_tta(weighted, with_tta, layout, PLAN, layout.tuning_truth, "2026", ["2025", "2026"])
    assert set(tta_switch["kept"]) == {"2025", "2026"}
    assert tta_switch["kept"]["2026"]["mito"] == tta_switch["classes"]["mito"]["before"]  # TTA off: stage 3's
    source = _store(tmp_path / "pp_source.zarr", tiny_synth_root, lambda c, p: p)
    postprocessed = plain_segmentation(source, tmp_path / "postprocessed.zarr", CROPS)
    # As scored, both eras keep post-processing for er (truth against an empty stage 4); a 2025 stage 4 that
    # scored er perfectly on the tuning crops is not beaten there, so 2025 switches er off.
    kept = {"2026": tta_switch["kept"]["2026"], "2025": {**tta_switch["kept"]["2025"], "er": 1.0}}
    stores, switch = switch_postprocess(stage4, postprocessed, {**tta_switch, "kept": kept}, layout, PLAN,
                                        layout.tuning_truth, "2026", ["2025", "2026"])
    assert switch["off"] == ["mito"] and switch["eras"]["2026"]["off"] == ["mito"]
    assert sorted(switch["eras"]["2025"]["off"]) == ["er", "mito"]
    assert stores["2026"].path == layout.postprocessed_switched
    assert stores["2025"].path == layout.stores / "postprocessed_switched_2025.zarr"
    assert stores["2025"].path == layout.postprocessed_in("2025", tuning_era="2026", off=["er", "mito"])
    plain4 = PredictionStore.open(layout.segmentation("tta"))
    for crop in PLAN.scored:
        assert np.array_equal(stores["2025"].read(crop, "er"), plain4.read(crop, "er"))
        assert np.array_equal(stores["2026"].read(crop, "er"), postprocessed.read(crop, "er"))
    # Without the difference the eras share the tuning era's store.
    again, switch = switch_postprocess(stage4, postprocessed, tta_switch, layout, PLAN, layout.tuning_truth, "2026",
                                       ["2025", "2026"])
    assert switch["eras"]["2025"]["off"] == switch["off"] and again["2025"].path == again["2026"].path
