"""`run_report`: what each inference stage adds, measured on crops with truth, in both metric eras.

Stages (each keeps everything of the one before and changes one thing):

1. best single model: each run predicts alone (`predict_run`, no TTA; the runs in parallel processes:
   `cellseg.decide.predictions`); in each era, the best of them by its decision score on the tuning crops
   (`cellseg.decide.ranking`; the eras may disagree on which run is best), shown with its scores on the
   scored crops;
2. uniform ensemble: the mean of every run's probabilities (`ensemble`, weights "uniform"), for the classes
   where it beats the best single model on the tuning crops (the others keep that model's);
3. weighted ensemble: per-class weights fitted on the tuning crops (`ensemble`, weights "auto");
4. + TTA: every run with a positive stage-3 weight for some class predicts with the 8 test-time transforms,
   combined with stage 3's weights (refitting them would change two things at once; a run of weight 0 for
   every class would add nothing); with the members in several processes these predictions begin beside stages
   2-3 (GPU work beside CPU work), and a member stage 3 leaves out is skipped if it has not begun;
5. + post-processing: parameters tuned on the tuning crops (`tune_store`), applied to stage 4
   (`postprocess_store`).

Stages 2-5 are switched per class (`cellseg.decide.switches`): a class the stage does not improve on the
tuning crops keeps the previous stage's prediction (stage 3 also the previous stage's weights, for stage 4), and
the report names those classes. Stage 5's switch is made in
every era scored, each era's column (and submission) taking the store its own switch kept.

Stages 1-4 are scored as the official evaluator reads a binary prediction (threshold 0.5, instance
classes as 26-connected components; `cellseg.decide.scoring`); stage 5 with its own masks and ids. Every
number comes with a 95 % crop-bootstrap interval, every change with a paired one (`cellseg.decide.bootstrap`),
and with the number of crops the era skipped.

Layout of REPORT_DIR (intermediate stores are reused on a re-run with the same settings, so an
interrupted report resumes; `--overwrite` starts over):

    report.md, report.json, *.png      the results
    decisions.json                     every decision the stages made on the tuning crops, as the product commands
                                       apply it (`cellseg.decide.document`; `cellseg decide` writes the same file)
    timings.json                       seconds per step of every run so far (rewritten as each step ends)
    report_settings.json               what the stores depend on (runs, crops, data root, tuning era)
    truth.zarr                         the scored crops' truth in the evaluator's layout
    truth_tuning.zarr                  the tuning crops' truth (the best single model is chosen on it)
    stores/predict_tta1/<run>.zarr     stage 1 (and 2, 3) members;  stores/predict_tta8/<run>.zarr: stage 4
                                       (weights_tta8.json: stage 3's weights of those runs, when some are left out)
    stores/ensemble_{uniform,weighted,weighted_tta8}.zarr, stores/postprocess_params.json (while tuning:
                                       postprocess_params.partial.json, the classes tuned so far),
    stores/postprocessed.zarr, stores/segmentation/<stage>.zarr, stores/submissions/<stage>.zip and
    stores/submissions/<stage>.<era>.json (its evaluation: a resumed report does not score it again)
    stores/ensemble_uniform_switched.zarr, stores/ensemble_weighted_switched.zarr (its weights:
    stores/weights_switched.json), stores/ensemble_weighted_tta8_switched.zarr,
    stores/postprocessed_switched.zarr: stages 2-5 with classes switched off (only when some are);
    stores/postprocessed_switched_<era>.zarr: stage 5 as switched in another era, where its switch differs
    stores/.ensemble_*.zarr.partial    an ensemble a cut report was writing: the next run adds the crops it lacks

With `--decisions FILE` nothing is decided: the stages are what the file says (`cellseg.decide.replay`), predicted
on the scored crops alone, and the best single model is the file's in every era.

A member's store named by `--reuse` (`cellseg predict`'s, holding every crop from the same checkpoint and
settings: `cellseg.decide.reuse`) is read where it is instead of predicting into stores/predict_tta*.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from cellseg.data.prediction_store import PredictionStore
from cellseg.decide.apply import applied
from cellseg.decide.bootstrap import uncertainties
from cellseg.decide.build import build_decisions
from cellseg.decide.document import Decisions
from cellseg.decide.inputs import CropPlan, RunInfo, check_runs, data_root_of, plan_crops, settings_doc
from cellseg.decide.options import SETTINGS_FILE, Layout, StageResult
from cellseg.decide.ranking import choose_best
from cellseg.decide.replay import best_single_choice, members_in_order, replay_stores
from cellseg.decide.reuse import open_candidates
from cellseg.decide.run import prepare_dir
from cellseg.decide.scoring import (
    ScoreJob,
    plain_segmentations,
    score_segmentations,
    thresholding_of,
)
from cellseg.decide.stages import TTA_TRANSFORMS, Stores, make_stores, single_jobs, single_key
from cellseg.decide.timings import TIMINGS_FILE, Timings
from cellseg.decide.truth import build_truth, truth_labels
from cellseg.postprocess.apply import MAX_CLASS_THREADS
from cellseg.report.render import write_reports
from cellseg.report.results import Report, ReportOptions

log = logging.getLogger(__name__)
# what --overwrite removes
OUTPUTS = ("stores", "truth.zarr", "truth_tuning.zarr", "decisions.json", "report.md", "report.json", TIMINGS_FILE,
           SETTINGS_FILE)
FIGURE_PATTERNS = ("overall.png", "classes_*.png", "overlay_*.png")  # ... and these (cellseg.report.figures)


def best_single_stage(singles: Sequence[StageResult], eras: Sequence[str], chosen: Mapping[str, Mapping[str, Any]]
                      ) -> tuple[StageResult, dict[str, str]]:
    """Stage 1: in each era the scores of the run `chosen` on the tuning crops (`decisions.choose_best`); and
    era → its run name."""
    best = {era: singles[chosen[era]["index"]] for era in eras}
    names = {era: s.key.removeprefix("single_") for era, s in best.items()}
    if len(set(names.values())) == 1:
        title = f"1. best single model: {best[eras[0]].title}"
    else:
        title = "1. best single model (" + "; ".join(f"{era}: {n}" for era, n in names.items()) + ")"
    stores = dict.fromkeys(s.store for s in best.values())
    return StageResult(key="best_single", title=title, store=", ".join(stores),
                       scores={era: s.scores[era] for era, s in best.items()}), names


def ensemble_stages(stores: Stores) -> list[tuple[str, str, PredictionStore]]:
    """Stages 2-4 as (key, title, probability store): scored as thresholded probabilities."""
    return [("uniform", "2. uniform ensemble", stores.uniform),
            ("weighted", "3. weighted ensemble (fitted weights)", stores.weighted),
            ("tta", f"4. + TTA ({TTA_TRANSFORMS}×)", stores.with_tta)]


def score_jobs(runs: Sequence[RunInfo], stores: Stores, layout: Layout, plan: CropPlan
               ) -> dict[str, tuple[str, ScoreJob]]:
    """Every segmentation `score_stages` scores, key → (title, job): the single models on the scored crops (and
    on the tuning crops where those differ), stages 2-4 as thresholded probabilities, stage 5 as it is."""
    jobs = single_jobs(runs, stores.singles, layout, plan)
    for key, title, store in ensemble_stages(stores):
        jobs[key] = (title, ScoreJob(store.path, layout.truth, layout.submission(key), layout.segmentation(key),
                                     plan.scored))
    for key, store in postprocess_stores(stores).items():
        jobs[key] = ("5. + post-processing (tuned)", ScoreJob(store.path, layout.truth, layout.submission(key)))
    return jobs


def postprocess_stores(stores: Stores) -> dict[str, PredictionStore]:
    """Stage 5's stores to score, key → store: "postprocess" (the tuning era's), and "postprocess_<era>" for an
    era whose per-class switch kept another store (`switch_postprocess`)."""
    tuning = stores.postprocessed[stores.switches["era"]]
    out = {"postprocess": tuning}
    out.update({f"postprocess_{era}": store for era, store in stores.postprocessed.items() if store.path != tuning.path})
    return out


def score_stages(runs: Sequence[RunInfo], stores: Stores, layout: Layout, plan: CropPlan, opts: ReportOptions,
                 root: Path, timings: Timings, chosen: Mapping[str, Any] | None = None
                 ) -> tuple[list[StageResult], list[StageResult], dict[str, Any]]:
    """(single models, stages 1-5, era → the choice of the best single run with its run name), each scored in
    every era; the single models also on the tuning crops, where the best of them is chosen (unless `chosen`, a
    decisions file's choice, is given)."""
    eras = ", ".join(opts.eras)
    jobs = score_jobs(runs, stores, layout, plan)
    plain = thresholding_of([job for _, job in jobs.values()])
    processes = max(1, opts.scoring_workers // MAX_CLASS_THREADS)
    if processes > 1:
        with timings.step(f"thresholding {len(plain)} predictions in {processes} processes"):
            plain_segmentations(plain, processes)
    with timings.step(f"scoring {len(jobs)} segmentations in {eras}"):
        scores = score_segmentations([job for _, job in jobs.values()], opts.eras, workers=opts.scoring_workers,
                                     progress=opts.progress)
    results = {key: StageResult(key=key, title=title, store=str(job.seg), scores=s)
               for (key, (title, job)), s in zip(jobs.items(), scores, strict=True)}
    scored = [results[single_key(r)] for r in runs]
    if chosen is None:
        on_tuning = [results.get(single_key(r, tuning=True), results[single_key(r)]) for r in runs]
        chosen = choose_best(on_tuning, opts.eras, [r.name for r in runs])
    best, _ = best_single_stage(scored, opts.eras, chosen)
    stages = [best, *(results[key] for key, _, _ in ensemble_stages(stores)), postprocess_stage(results, opts.eras)]
    return scored, stages, dict(chosen)


def postprocess_stage(results: Mapping[str, StageResult], eras: Sequence[str]) -> StageResult:
    """Stage 5: in each era the scores of the store its switch kept in that era (`postprocess_stores`); its
    `store` names the tuning era's first."""
    kept = {era: results.get(f"postprocess_{era}", results["postprocess"]) for era in eras}
    stores = dict.fromkeys([results["postprocess"].store, *(s.store for s in kept.values())])
    return StageResult(key="postprocess", title=results["postprocess"].title, store=", ".join(stores),
                       scores={era: s.scores[era] for era, s in kept.items()})


def _given_decisions(opts: ReportOptions) -> Decisions | None:
    """`--decisions`: the file, checked against the runs (before anything is predicted); None without it.

    Raises:
        DecisionsError: another schema, other runs or checkpoints, or an era it has no stage-5 choice for.
    """
    if opts.decisions is None:
        return None
    decisions = Decisions.load(opts.decisions)
    decisions.check_runs(opts.runs, checkpoint=opts.checkpoint)
    for era in opts.eras:
        decisions.plain_classes(era)  # an era without a stage-5 choice: named now
    return decisions


def run_report(opts: ReportOptions) -> Report:
    """Run every stage (module docstring), score it, and write report.md, report.json and the figures.

    Raises:
        ValueError, FileNotFoundError: bad runs, crops or report directory (checked before any prediction).
    """
    from cellseg.report.figures import write_figures  # matplotlib: imported only when a report is drawn

    decisions = _given_decisions(opts)
    runs = check_runs(opts.runs, checkpoint=opts.checkpoint, data_root=opts.data_root)
    if decisions is not None:
        runs = members_in_order(runs, decisions)
    root = data_root_of(runs, opts.data_root)
    tune_crops = opts.tune_crops if decisions is None else ",".join(decisions.tuning["crops"])
    plan = plan_crops(runs, root, crops=opts.crops, tune_crops=tune_crops, explicit_root=opts.data_root)
    open_candidates(opts.reuse, runs)  # a store named for reuse that is none of the runs': an error now
    layout = Layout(Path(opts.out))
    settings = settings_doc(runs, root, plan, checkpoint=opts.checkpoint, tune_metric=opts.tuning_era,
                            overlap=opts.overlap)
    if decisions is not None:
        settings["decisions"] = applied(decisions)
    resuming = prepare_dir(layout, settings, overwrite=opts.overwrite, outputs=OUTPUTS, patterns=FIGURE_PATTERNS)
    log.info("report on %d runs (%s); scored crops: %s; tuning crops: %s", len(runs),
             ", ".join(r.name for r in runs), ", ".join(plan.scored), ", ".join(plan.tuning))
    timings = Timings(layout.root / TIMINGS_FILE, resuming=resuming)
    with timings.step("truth of the scored crops (evaluator layout)", resumed=layout.truth.is_dir()):
        truth = truth_labels(layout.truth) if layout.truth.is_dir() else build_truth(
            layout.truth, plan.scored, runs[0].classes, root)
    if decisions is None:
        stores = make_stores(runs, root, plan, layout, opts, timings)
        build_decisions(runs, stores, plan, opts, root, layout).save(layout.decisions)  # what the product commands apply
        singles, stages, chosen = score_stages(runs, stores, layout, plan, opts, root, timings)
    else:  # decided elsewhere: the stages as the file says, on the scored crops alone
        stores = replay_stores(runs, decisions, plan, layout, opts, timings)
        singles, stages, chosen = score_stages(runs, stores, layout, replace(plan, tuning=plan.scored), opts, root,
                                               timings, chosen=best_single_choice(decisions, runs, opts.eras))
    with timings.step("crop-bootstrap intervals"):
        uncertainty = uncertainties({name: {era: [s.scores[era].document for s in rows] for era in opts.eras}
                                     for name, rows in (("stages", stages), ("singles", singles))},
                                    workers=opts.scoring_workers)
    report = Report(options=opts, runs=runs, data_root=root, plan=plan, truth=truth, singles=singles,
                    best_single={era: c["run"] for era, c in chosen.items()}, best_single_choice=chosen,
                    stages=stages, timings=timings.rows,
                    weights=json.loads(stores.weights.read_text()),
                    params=stores.params.to_json(), uncertainty=uncertainty, switches=stores.switches)
    with timings.step("figures"):
        report.figures = write_figures(report, layout.root, progress=opts.progress)
    write_reports(report, layout.root)
    return report
