"""The stores of the report's stages 1-5 (`cellseg.report.ablation`'s docstring lists the stages and the report
directory): each run predicted alone, the uniform and weighted ensembles, TTA with stage 3's weights and the
post-processing tuned on the tuning crops, every finished store reused by a resumed report.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cellseg.config.inference import EnsembleConfig, FitConfig
from cellseg.data.prediction_store import PredictionStore
from cellseg.decide.inputs import CropPlan, RunInfo
from cellseg.decide.options import DecideOptions, Layout
from cellseg.decide.predictions import BackgroundPredictions, predict_all, predict_jobs
from cellseg.decide.scoring import (
    Beside,
    ScoreJob,
    scoring_beside,
)
from cellseg.decide.switches import switch_postprocess, switch_tta, switch_uniform, switch_weighted
from cellseg.decide.timings import Timings
from cellseg.decide.truth import build_truth
from cellseg.eval.eras import Era
from cellseg.infer.members import ensemble_grid
from cellseg.infer.weights import WEIGHTS_FILE, members_in_use, restrict_weights_file
from cellseg.postprocess.apply import MAX_CLASS_THREADS
from cellseg.runtime.checkpoint import save_atomic_text

log = logging.getLogger(__name__)
TTA_TRANSFORMS = 8


def ensemble_once(members: Sequence[Path], out: Path, *, weights: str | Path = "uniform",
                  fit: FitConfig | None = None, progress: bool = False) -> PredictionStore:
    """`cellseg.infer.ensemble.ensemble` of `members` with `weights` (a method or a weights.json) and, for "auto",
    `fit`, into `out` (resuming the crops a cut report wrote), or the store already there from the same members.

    Raises:
        ValueError: `out` exists but was made from other members.
    """
    from cellseg.infer.ensemble import ensemble

    if out.exists():
        store = PredictionStore.open(out)
        recorded = [m.get("path") for m in store.provenance.get("ensemble", {}).get("members", [])]
        if recorded != [str(m) for m in members]:
            raise ValueError(f"{out}: an ensemble of {recorded}, not of {[str(m) for m in members]}; pass --overwrite")
        log.info("reusing %s", out)
        return store
    config = EnsembleConfig(members=tuple(str(m) for m in members), weights=str(weights), fit=fit or FitConfig())
    return ensemble(config, out, resume=True, progress=progress).store  # a cut report keeps its crops


def tuned_params(store: PredictionStore, layout: Layout, root: Path, plan: CropPlan, *, era: Era, device: str,
                 progress: bool, workers: int = 1) -> Any:
    """Post-processing parameters tuned on the tuning crops (or read back from an earlier run); the instance
    classes in `workers` processes (the report's scoring processes: `tune_store`), each class kept as it is
    tuned, so that a report cut in the tuning resumes it."""
    from cellseg.postprocess.params import ParamSet
    from cellseg.postprocess.tuning import tune_store

    if layout.params.is_file():
        params = ParamSet.load(layout.params)
        if params.era != era or list(params.tuned_on.get("crops", [])) != list(plan.tuning):
            raise ValueError(f"{layout.params}: tuned for {params.era} on {params.tuned_on.get('crops')}, not for "
                             f"{era} on {list(plan.tuning)}; pass --overwrite")
        log.info("reusing %s", layout.params)
        return params
    partial = layout.params.with_name(f"{layout.params.stem}.partial.json")  # the classes tuned so far
    params = tune_store(store, root, crops=list(plan.tuning), era=era, device=device, progress=progress,
                        workers=workers, checkpoint=partial)
    params.save(layout.params)
    partial.unlink(missing_ok=True)
    return params


@dataclass(frozen=True)
class Stores:
    """The stores the stages produced (module docstring)."""

    singles: list[Path]  # each run without TTA
    uniform: PredictionStore
    weighted: PredictionStore  # switched off for the classes the fitted weights do not help
    weights: Path  # stage 3's weights file as switched: stage 4 ensembles its TTA predictions with it
    with_tta: PredictionStore  # TTA switched off for the classes it does not help
    postprocessed: dict[str, PredictionStore]  # era → post-processing switched off for the classes it does not help
    params: Any  # the tuned `ParamSet`
    switches: dict[str, Any]  # "uniform", "weighted", "tta", "postprocess" → `cellseg.decide.switches` documents


def make_stores(runs: Sequence[RunInfo], root: Path, plan: CropPlan, layout: Layout, opts: DecideOptions,
                timings: Timings) -> Stores:
    """Predict, ensemble and post-process: every store of stages 1-5 (reusing finished ones)."""
    with timings.step(f"1. single models: predict {len(plan.predicted)} crops, no TTA",
                      resumed=any(layout.predictions(r, 1).exists() for r in runs)):
        tta1 = predict_all(runs, layout, plan, opts, tta=1)
    truth = tuning_truth(layout, plan, runs, root)  # before the single models are scored on it
    # The single models are thresholded and scored on the CPU while the later stages use the GPU (stage 4's
    # predictions take minutes); stage 2's switch and `score_stages` read their evaluations back. Those on the
    # tuning crops first: the switch waits for them, while the uniform ensemble is written.
    jobs = single_jobs(runs, tta1, layout, plan)
    on_tuning = {r.name: jobs.get(single_key(r, tuning=True), jobs[single_key(r)])[1] for r in runs}
    beside = max(1, opts.scoring_workers // 2)
    with scoring_beside([job for _, job in jobs.values() if job not in on_tuning.values()], opts.eras,
                        workers=beside, plain_processes=max(1, beside // MAX_CLASS_THREADS),
                        first=list(on_tuning.values())) as scoring:
        return _later_stages(runs, tta1, on_tuning, truth, root, plan, layout, opts, timings, scoring)


def _later_stages(runs: Sequence[RunInfo], tta1: list[Path], on_tuning: Mapping[str, ScoreJob], truth: Path,
                  root: Path, plan: CropPlan, layout: Layout, opts: DecideOptions, timings: Timings,
                  scoring: Beside) -> Stores:
    """Stages 2-5 from the single models' stores `tta1` and their jobs on the tuning crops (`make_stores`);
    `scoring`: the single models' scoring beside the stages, those on the tuning crops first."""
    from cellseg.postprocess.apply import postprocess_store, resolve

    era, n = opts.tuning_era, len(plan.predicted)
    tta_resumed = any(layout.predictions(run, TTA_TRANSFORMS).exists() for run in runs)
    background = None
    if not layout.ensemble("weighted").exists() and predict_jobs(opts.predict_jobs, len(runs), opts.device,
                                                                  tta=TTA_TRANSFORMS) > 1:
        # Stage 4's predictions start now, on the GPUs, while stages 2-3 ensemble and fit on the CPU; stage 3
        # then names the members stage 4 needs, and the others are skipped if they have not begun.
        background = BackgroundPredictions(runs, layout, plan, opts, tta=TTA_TRANSFORMS)
    try:
        with timings.step("2. uniform ensemble", resumed=layout.ensemble("uniform").exists()):
            uniform = ensemble_once(tta1, layout.ensemble("uniform"), weights="uniform", progress=opts.progress)
        with timings.step("uniform ensemble: switch it off for the classes it does not help against the best single "
                          "model on the tuning crops", resumed=layout.submission("tuning_uniform").exists()):
            # The single models were scored on the tuning crops beside the uniform ensemble (read back here): the
            # uniform average is scored with every scoring worker and the whole memory budget once the scoring
            # beside the stages is done, else with what it leaves.
            scoring.first.result()
            alone = scoring.all.done()
            uniform, uniform_switch = switch_uniform(
                uniform, on_tuning, layout, plan, truth, era, opts.eras, progress=opts.progress,
                workers=opts.scoring_workers if alone else max(1, opts.scoring_workers - opts.scoring_workers // 2),
                memory_share=1.0 if alone else 0.5)
        with timings.step(f"3. weighted ensemble: fit weights on {len(plan.tuning)} crops ({era} metric)",
                          resumed=layout.ensemble("weighted").exists()):
            fit = FitConfig(metric=era, device=opts.device, truth_root=str(root), crops=",".join(plan.tuning))
            weighted = ensemble_once(tta1, layout.ensemble("weighted"), weights="auto", fit=fit,
                                     progress=opts.progress)
        with timings.step("weighted ensemble: switch it off for the classes it does not help against stage 2 on the "
                          "tuning crops", resumed=layout.submission("tuning_weighted_fit").exists()):
            best = [r.name for r in runs].index(uniform_switch["best_single"])
            weighted, weighted_switch, weights = switch_weighted(
                uniform, weighted, uniform_switch, uniform_weights=layout.ensemble("uniform") / WEIGHTS_FILE,
                best_single=best, layout=layout, plan=plan, truth=truth, era=era, workers=opts.scoring_workers,
                progress=opts.progress)
    except BaseException:
        if background is not None:
            background.abandon()
        raise
    # Stage 4 reuses stage 3's weights: a member with weight 0 for every class adds nothing, so only the others
    # predict with TTA (the same stage-4 store, for a fraction of the GPU time).
    used = tta_members(weights, tta1, plan.predicted)
    unused = [r.name for i, r in enumerate(runs) if i not in used]
    if unused:
        log.info("4. + TTA: %s have weight 0 for every class: not predicted with TTA%s", ", ".join(unused),
                 " unless begun beside stages 2-3" if background is not None else "")
    beside = " begun beside stages 2-3" if background is not None else ""
    with timings.step(f"4. + TTA: predict {n} crops with {TTA_TRANSFORMS} transforms ({len(used)} of {len(runs)} "
                      f"members{beside})", resumed=tta_resumed):
        if background is not None:
            background.keep([runs[i] for i in used])
            every = background.result()
            tta8 = [every[i] for i in used]
        else:
            tta8 = predict_all([runs[i] for i in used], layout, plan, opts, tta=TTA_TRANSFORMS)
    with timings.step("TTA: ensemble with stage 3's weights; switch TTA off for the classes it does not help on "
                      "the tuning crops", resumed=layout.ensemble("weighted_tta8").exists()):
        tta_weights = restrict_weights_file(weights, used, layout.stores / "weights_tta8.json") if unused else weights
        with_tta = ensemble_once(tta8, layout.ensemble("weighted_tta8"), weights=tta_weights, progress=opts.progress)
        with_tta, tta_switch = switch_tta(weighted, with_tta, layout, plan, truth, era, opts.eras,
                                          workers=opts.scoring_workers, progress=opts.progress)
        tta_switch["without_weight"] = unused
    device = resolve(opts.device)
    with timings.step(f"5. + post-processing: tune on {len(plan.tuning)} crops ({era} metric)",
                      resumed=layout.params.exists()):
        params = tuned_params(with_tta, layout, root, plan, era=era, device=device, progress=opts.progress,
                              workers=opts.scoring_workers)
    with timings.step(f"post-processing: apply to {n} crops; switch it off for the classes it does not help on "
                      "the tuning crops", resumed=layout.postprocessed.exists()):
        segmented = postprocess_store(with_tta, layout.postprocessed, params=params, device=device,
                                      progress=opts.progress)
        segmented, pp_switch = switch_postprocess(with_tta, segmented, tta_switch, layout, plan, truth, era,
                                                  opts.eras, workers=opts.scoring_workers, progress=opts.progress)
    return Stores(singles=tta1, uniform=uniform, weighted=weighted, weights=weights, with_tta=with_tta,
                  postprocessed=segmented, params=params,
                  switches={"era": era, "uniform": uniform_switch, "weighted": weighted_switch, "tta": tta_switch,
                            "postprocess": pp_switch})


def make_single_stores(run: RunInfo, root: Path, plan: CropPlan, layout: Layout, opts: DecideOptions,
                       timings: Timings) -> Stores:
    """The stores of one run's decisions (`cellseg decide RUN_DIR`): the run alone (stage 1, no ensemble: stages 2
    and 3 are off for every class), + TTA switched per class (stage 4), + post-processing tuned and switched per
    class in every era (stage 5), on the tuning crops."""
    from cellseg.postprocess.apply import postprocess_store, resolve

    era = opts.tuning_era
    with timings.step(f"1. the run alone: predict {len(plan.predicted)} crops, no TTA",
                      resumed=layout.predictions(run, 1).exists()):
        single = PredictionStore.open(predict_all([run], layout, plan, opts, tta=1)[0])
    truth = tuning_truth(layout, plan, [run], root)
    with timings.step(f"4. + TTA: predict {len(plan.predicted)} crops with {TTA_TRANSFORMS} transforms",
                      resumed=layout.predictions(run, TTA_TRANSFORMS).exists()):
        tta8 = PredictionStore.open(predict_all([run], layout, plan, opts, tta=TTA_TRANSFORMS)[0])
    with timings.step("TTA: switch it off for the classes it does not help on the tuning crops"):
        with_tta, tta_switch = switch_tta(single, tta8, layout, plan, truth, era, opts.eras,
                                          workers=opts.scoring_workers, progress=opts.progress)
    device = resolve(opts.device)
    with timings.step(f"5. + post-processing: tune on {len(plan.tuning)} crops ({era} metric)",
                      resumed=layout.params.exists()):
        params = tuned_params(with_tta, layout, root, plan, era=era, device=device, progress=opts.progress,
                              workers=opts.scoring_workers)
    with timings.step("post-processing: apply; switch it off for the classes it does not help on the tuning crops",
                      resumed=layout.postprocessed.exists()):
        segmented = postprocess_store(with_tta, layout.postprocessed, params=params, device=device,
                                      progress=opts.progress)
        segmented, pp_switch = switch_postprocess(with_tta, segmented, tta_switch, layout, plan, truth, era,
                                                  opts.eras, workers=opts.scoring_workers, progress=opts.progress)
    weights = layout.stores / "weights_single.json"
    save_atomic_text(json.dumps({"method": "single", "channels": {c: [1.0] for c in single.channels},
                                 "members": [{"run_dir": str(run.run_dir)}]}, indent=2) + "\n", weights)
    alone = {"classes": {c: {"before": math.nan, "after": math.nan, "on": False} for c in run.classes},
             "off": list(run.classes), "best_single": run.name, "alone": True}  # no ensemble to switch on
    return Stores(singles=[single.path], uniform=single, weighted=single, weights=weights, with_tta=with_tta,
                  postprocessed=segmented, params=params,
                  switches={"era": era, "uniform": alone, "weighted": {k: v for k, v in alone.items()
                                                                       if k != "best_single"},
                            "tta": tta_switch, "postprocess": pp_switch})


def tta_members(weights: Path, singles: Sequence[Path], crops: Sequence[str]) -> list[int]:
    """The runs stage 4 predicts with TTA (indices): those with a positive stage-3 weight (`weights`, its weights
    file) for some class, and any other whose grid the ensemble of all the runs takes on some crop (grid
    "finest": the stage-4 ensemble then has stage 3's grids), judged on the single models' stores `singles`."""
    used = set(members_in_use(weights))
    stores = [PredictionStore.open(path) for path in singles]
    for crop in crops:
        target, source = ensemble_grid(stores, crop)
        if ensemble_grid([stores[i] for i in sorted(used)], crop)[0] != target:
            used.add(source)
    return sorted(used)


def tuning_truth(layout: Layout, plan: CropPlan, runs: Sequence[RunInfo], root: Path) -> Path:
    """The truth store of the tuning crops (the scored crops' when they are the same; built once)."""
    if set(plan.tuning) == set(plan.scored):
        return layout.truth
    if not layout.tuning_truth.is_dir():
        build_truth(layout.tuning_truth, plan.tuning, runs[0].classes, root)
    return layout.tuning_truth


def single_key(run: RunInfo, *, tuning: bool = False) -> str:
    """The key of a single model's thresholded segmentation and submission (on the tuning crops: `tuning`)."""
    return f"{'tuning_' if tuning else ''}single_{run.name}"


def single_jobs(runs: Sequence[RunInfo], singles: Sequence[Path], layout: Layout, plan: CropPlan
                ) -> dict[str, tuple[str, ScoreJob]]:
    """The single models' segmentations `score_stages` scores, key → (title, job): on the scored crops, and on
    the tuning crops where those differ (the best single model is chosen there)."""
    pairs = list(zip(runs, singles, strict=True))
    jobs = {single_key(r): (f"{r.name} ({r.model})", ScoreJob(p, layout.truth, layout.submission(single_key(r)),
                                                              layout.segmentation(single_key(r)), plan.scored))
            for r, p in pairs}
    if set(plan.tuning) != set(plan.scored):  # else the single models' scores on the scored crops
        for r, p in pairs:
            key = single_key(r, tuning=True)
            jobs[key] = (r.name, ScoreJob(p, layout.tuning_truth, layout.submission(key), layout.segmentation(key),
                                          plan.tuning))
    return jobs
