"""Per-class stage switches: a stage of the report that does not help a class on the tuning crops is switched
off for that class, which then keeps the previous stage's prediction.

- Stage 2 (uniform ensemble): the single models and the uniform average, each decoded plainly, are scored on the
  tuning crops in every era; the best single model is chosen there as stage 1 chooses it (in the tuning era),
  and a class the uniform average does not improve takes that model's probabilities.
- Stage 3 (weighted ensemble): the fitted weights, decoded plainly, against stage 2 as switched (the uniform
  average, or the best single model where stage 2 is off), in the tuning era. The fit's own guard keeps its
  shrunk weights unless a candidate beats them beyond the crop-bootstrap noise, so without this switch a class
  where stage 2 had gone back to the best single model could return to a mix that loses to it. A class the
  fitted weights do not improve takes stage 2's probabilities and stage 2's weights (`switched_weights`), which
  stage 4 then uses for its TTA predictions.
- Stage 4 (TTA): stage 3's and stage 4's probabilities, each decoded plainly (`plain_segmentation`), are
  scored on the tuning crops in every era (stage 5's switches compare with them), the choice made in the tuning
  era; a class TTA does not improve takes stage 3's probabilities
  (`cellseg.infer.merge.merge_classes`), and the post-processing of stage 5 is tuned on that merged store.
- Stage 5 (post-processing): the tuned segmentation is scored on the tuning crops against the plain default
  decoding of stage 4 (threshold 0.5, 26-connected components: how stage 4 is scored); a class the tuned
  post-processing does not improve takes that plain decoding. This switch is made in every era the report scores,
  each for its own column of the ablation and its own submission: the eras score objects differently (a watershed
  split the 2026 metric rewards can cost a 2025 instance class most of its score), and switching a class back to
  the plain decoding changes nothing upstream, so an era's leaderboard gets the stage-5 prediction decided with its
  metric for the price of one more merge. The earlier switches and every tuned parameter stay the tuning era's.

"Improve" means a strictly higher class score (IoU, or the combined score of an instance class) through the
official evaluator in decision mode, on the tuning crops with the class's foreground only
(`cellseg.eval.presence`), so the scored crops never take part in the choice and a crop without the class cannot
reward predicting nothing. A tie switches the stage off (it did not help); a class the tuning crops do not score,
or none of them has foreground of (NaN), keeps it.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cellseg.data.prediction_store import BOUNDARY_SUFFIX, PredictionStore
from cellseg.decide.inputs import CropPlan
from cellseg.decide.options import Layout, StageResult
from cellseg.decide.ranking import choose_best, crop_scores_of
from cellseg.decide.scoring import ScoreJob, plain_segmentation, score_segmentations
from cellseg.eval.decision import decide
from cellseg.eval.eras import Era
from cellseg.infer.merge import merge_classes
from cellseg.infer.weights import WEIGHTS_FILE
from cellseg.runtime.checkpoint import save_atomic_text

log = logging.getLogger(__name__)
TOLERANCE = 1e-9  # a gain below this is a tie


def stage_switch(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, dict[str, Any]]:
    """class → {"before", "after", "on"}: on when the stage scores strictly higher on the tuning crops, or when
    either score is missing (NaN: no evidence either way)."""
    out = {}
    for name in after:
        b, a = float(before.get(name, math.nan)), float(after[name])
        on = not (math.isfinite(a) and math.isfinite(b)) or a > b + TOLERANCE
        out[name] = {"before": b, "after": a, "on": on}
    return out


def switched_off(switch: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The classes a stage is switched off for."""
    return [name for name, s in switch.items() if not s["on"]]


def tuning_job(store: PredictionStore, key: str, layout: Layout, plan: CropPlan, truth: Path, *,
               segmented: bool = False) -> ScoreJob:
    """`store` scored on the tuning crops (`truth`) as `tuning_<key>` (thresholded plainly unless `segmented`)."""
    plain = None if segmented else layout.segmentation(f"tuning_{key}")
    return ScoreJob(store.path, truth, layout.submission(f"tuning_{key}"), plain, plan.tuning)


def tuning_scores(jobs: Sequence[ScoreJob], eras: Sequence[Era], *, workers: int = 1, progress: bool = False
                  ) -> list[dict[Era, dict[str, float]]]:
    """era → class → score of each of `jobs` (`tuning_job`) in every one of `eras`, scored side by side
    (`score_segmentations`)."""
    scores = score_segmentations(jobs, eras, workers=workers, progress=progress)
    return [{era: decision_classes(s[era].document, era) for era in eras} for s in scores]


def decision_classes(document: Mapping[str, Any], era: Era) -> dict[str, float]:
    """class → its decision-mode score on the tuning crops with its foreground (`cellseg.eval.decision`); NaN
    for a class none of them has foreground of, which therefore keeps its stage (no evidence either way)."""
    decision = decide(crop_scores_of(document), era)
    scores = decision.class_scores(decision=True)
    return {name: scores.get(name, math.nan) for name in decision.official["label_scores"]}


def switch_uniform(uniform: PredictionStore, singles: Mapping[str, ScoreJob], layout: Layout, plan: CropPlan,
                   truth: Path, era: Era, eras: Sequence[Era], *, workers: int = 1, memory_share: float = 1.0,
                   progress: bool = False) -> tuple[PredictionStore, dict[str, Any]]:
    """Stage 2 with the uniform average switched off for the classes it does not help against the best single
    model: (its store, the switch document, which names that model as "best_single").

    Args:
        singles: run name → its single model's job on the tuning crops (as `score_stages` scores it: its
            evaluations, kept next to its submission, are read back there).
        eras: the eras the single models are scored in (the report's); the choice is made in `era`.
        memory_share: the part of the memory budget for this scoring (work running beside it has the rest).
    """
    names = list(singles)
    jobs = [*singles.values(), tuning_job(uniform, "uniform", layout, plan, truth)]
    scores = score_segmentations(jobs, list(dict.fromkeys([*eras, era])), workers=workers,
                                 memory_share=memory_share, progress=progress)
    on_tuning = [StageResult(key=name, title=name, store=str(job.seg), scores=s)
                 for (name, job), s in zip(singles.items(), scores[:-1], strict=True)]
    best = choose_best(on_tuning, [era], names)[era]["index"]
    switch = stage_switch(decision_classes(scores[best][era].document, era),
                          decision_classes(scores[-1][era].document, era))
    off = switched_off(switch)
    log.info("uniform ensemble switched off for %s (they keep %s)", off or "no class", names[best])
    doc = {"classes": switch, "off": off, "best_single": names[best]}
    if not off:
        return uniform, doc
    single = PredictionStore.open(singles[names[best]].seg)
    return merge_classes([uniform, single], dict.fromkeys(off, 1), layout.ensemble("uniform_switched")), doc


def switch_weighted(stage2: PredictionStore, weighted: PredictionStore, uniform_switch: Mapping[str, Any], *,
                    uniform_weights: Path, best_single: int, layout: Layout, plan: CropPlan, truth: Path, era: Era,
                    workers: int = 1, progress: bool = False) -> tuple[PredictionStore, dict[str, Any], Path]:
    """Stage 3 with the fitted weights switched off for the classes they do not help against stage 2 in `era`:
    (its store, the switch document, its weights file: the fitted one, or `switched_weights`).

    Args:
        stage2: stage 2's store as switched; `uniform_switch`: its switch document, whose scores on the tuning
            crops stage 3 is compared with (the uniform average's where on, the best single model's where off).
        uniform_weights: the uniform ensemble's weights file; best_single: the index of the best single model.
    """
    job = tuning_job(weighted, "weighted_fit", layout, plan, truth)
    after = tuning_scores([job], [era], workers=workers, progress=progress)[0][era]
    before = {c: s["after"] if s["on"] else s["before"] for c, s in uniform_switch["classes"].items()}
    switch = stage_switch(before, after)
    off = switched_off(switch)
    log.info("weighted ensemble switched off for %s (they keep stage 2's prediction)", off or "no class")
    doc = {"classes": switch, "off": off}
    fitted = weighted.path / WEIGHTS_FILE
    if not off:
        return weighted, doc, fitted
    merged = merge_classes([weighted, stage2], dict.fromkeys(off, 1), layout.ensemble("weighted_switched"))
    weights = switched_weights(fitted, uniform_weights, off, uniform_switch["off"], best_single,
                               layout.stores / "weights_switched.json")
    return merged, doc, weights


def switched_weights(fitted: Path, uniform: Path, off: Sequence[str], stage2_off: Sequence[str], best: int,
                     out: Path) -> Path:
    """The weights of stage 3 as switched, written to `out`: `fitted`'s, and for each class of `off` (its
    boundary channel too) stage 2's: the best single model `best` alone where stage 2 is off as well and that
    model has the channel, else `uniform`'s."""
    doc = json.loads(Path(fitted).read_text())
    flat = json.loads(Path(uniform).read_text())["channels"]
    channels = dict(doc["channels"])
    for channel, weights in doc["channels"].items():
        name = channel.removesuffix(BOUNDARY_SUFFIX)
        if name not in off:
            continue
        even = flat[channel]
        alone = name in stage2_off and even[best] > 0
        channels[channel] = [float(i == best) for i in range(len(weights))] if alone else list(even)
    save_atomic_text(json.dumps({**doc, "channels": channels, "switched_from": str(fitted), "switched_off": list(off)},
                                indent=2) + "\n", out)
    return out


def switch_tta(weighted: PredictionStore, with_tta: PredictionStore, layout: Layout, plan: CropPlan, truth: Path,
               era: Era, eras: Sequence[Era], *, workers: int = 1, progress: bool = False
               ) -> tuple[PredictionStore, dict[str, Any]]:
    """Stage 4 with TTA switched off for the classes it does not help in `era`: (its store, the switch document,
    which keeps the switched store's tuning scores in each of `eras` as "kept": stage 5's switch compares with
    them). The two stores are scored on the tuning crops side by side (`score_segmentations`)."""
    jobs = [tuning_job(store, key, layout, plan, truth) for store, key in ((weighted, "weighted"), (with_tta, "tta"))]
    every = list(dict.fromkeys([era, *eras]))
    before, after = tuning_scores(jobs, every, workers=workers, progress=progress)
    switch = stage_switch(before[era], after[era])
    off = switched_off(switch)
    log.info("TTA switched off for %s", off or "no class")
    # the switched store's tuning scores in every era: the stage's where it is on, stage 3's where it is off
    kept = {e: {c: (after[e] if c not in off else before[e]).get(c, math.nan) for c in after[e]} for e in every}
    doc = {"classes": switch, "off": off, "kept": kept}
    if not off:
        return with_tta, doc
    merged = merge_classes([with_tta, weighted], dict.fromkeys(off, 1), layout.ensemble("weighted_tta8_switched"))
    return merged, doc


def switch_postprocess(stage4: PredictionStore, postprocessed: PredictionStore, stage4_switch: Mapping[str, Any],
                       layout: Layout, plan: CropPlan, truth: Path, era: Era, eras: Sequence[Era], *,
                       workers: int = 1, progress: bool = False
                       ) -> tuple[dict[Era, PredictionStore], dict[str, Any]]:
    """Stage 5 with post-processing switched off, in each of `eras`, for the classes it does not help in that era
    against the plain decoding of stage 4 (`stage4_switch["kept"]`: stage 4's plain scores in every era): (era →
    its store, the switch document: `era`'s switch as "classes" and "off", every era's in "eras"). Eras that
    switch off the same classes share a store."""
    every = list(dict.fromkeys([era, *eras]))
    job = tuning_job(postprocessed, "postprocess", layout, plan, truth, segmented=True)
    scores = tuning_scores([job], every, workers=workers, progress=progress)[0]
    switches = {e: stage_switch(stage4_switch["kept"][e], scores[e]) for e in every}
    offs = {e: switched_off(switch) for e, switch in switches.items()}
    for e in every:
        log.info("post-processing switched off in %s for %s", e, offs[e] or "no class")
    decoded = None
    by_off: dict[tuple[str, ...], PredictionStore] = {(): postprocessed}
    for e in every:  # the tuning era first: its store keeps stage 5's own name
        off = tuple(offs[e])
        if off not in by_off:
            if decoded is None:
                decoded = plain_segmentation(stage4, layout.segmentation("tta"), plan.scored, progress=progress)
            by_off[off] = merge_classes([postprocessed, decoded], dict.fromkeys(off, 1),
                                        layout.postprocessed_in(e, tuning_era=era, off=off), crops=plan.scored)
    stores = {e: by_off[tuple(offs[e])] for e in every}
    doc = {"classes": switches[era], "off": offs[era],
           "eras": {e: {"classes": switches[e], "off": offs[e]} for e in every}}
    return stores, doc
