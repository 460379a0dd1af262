"""`run_report`: what each inference stage adds, measured on crops with truth, in both metric eras.

Stages (each keeps everything of the one before and changes one thing):

1. best single model: each run predicts alone (`predict_run`, no TTA; the runs in parallel processes:
   `cellseg.report.predictions`); in each era, the best of them by its decision score on the tuning crops
   (`cellseg.report.decisions`; the eras may disagree on which run is best), shown with its scores on the
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

Stages 2, 4 and 5 are switched per class (`cellseg.report.switches`): a class the stage does not improve on the
tuning crops keeps the previous stage's prediction, and the report names those classes. Stage 5's switch is made in
every era scored, each era's column (and submission) taking the store its own switch kept.

Stages 1-4 are scored as the official evaluator reads a binary prediction (threshold 0.5, instance
classes as 26-connected components; `cellseg.report.scoring`); stage 5 with its own masks and ids. Every
number comes with a 95 % crop-bootstrap interval, every change with a paired one (`cellseg.report.bootstrap`),
and with the number of crops the era skipped.

Layout of REPORT_DIR (intermediate stores are reused on a re-run with the same settings, so an
interrupted report resumes; `--overwrite` starts over):

    report.md, report.json, *.png      the results
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
    stores/ensemble_uniform_switched.zarr, stores/ensemble_weighted_tta8_switched.zarr,
    stores/postprocessed_switched.zarr: stages 2, 4 and 5 with classes switched off (only when some are);
    stores/postprocessed_switched_<era>.zarr: stage 5 as switched in another era, where its switch differs
    stores/.ensemble_*.zarr.partial    an ensemble a cut report was writing: the next run adds the crops it lacks

A member's store named by `--reuse` (`cellseg predict`'s, holding every crop from the same checkpoint and
settings: `cellseg.report.reuse`) is read where it is instead of predicting into stores/predict_tta*.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cellseg.data.prediction_store import PredictionStore
from cellseg.eval.eras import Era
from cellseg.infer.members import ensemble_grid
from cellseg.infer.weights import WEIGHTS_FILE, members_in_use, restrict_weights_file
from cellseg.postprocess.apply import MAX_CLASS_THREADS
from cellseg.report.bootstrap import uncertainties
from cellseg.report.decisions import choose_best
from cellseg.report.inputs import CropPlan, RunInfo, check_runs, data_root_of, plan_crops, settings_doc
from cellseg.report.predictions import BackgroundPredictions, predict_all, predict_jobs
from cellseg.report.render import write_reports
from cellseg.report.results import SETTINGS_FILE, Layout, Report, ReportOptions, StageResult
from cellseg.report.reuse import open_candidates
from cellseg.report.scoring import (
    Beside,
    ScoreJob,
    plain_segmentations,
    score_segmentations,
    scoring_beside,
    thresholding_of,
)
from cellseg.report.switches import switch_postprocess, switch_tta, switch_uniform
from cellseg.report.truth import build_truth, truth_labels

log = logging.getLogger(__name__)
# what --overwrite removes
TIMINGS_FILE = "timings.json"  # each run's seconds per step so far (`Timings`; report.json: the last run's)
OUTPUTS = ("stores", "truth.zarr", "truth_tuning.zarr", "report.md", "report.json", TIMINGS_FILE, SETTINGS_FILE)
FIGURE_PATTERNS = ("overall.png", "classes_*.png", "overlay_*.png")  # ... and these (cellseg.report.figures)
TTA_TRANSFORMS = 8


class Timings:
    """Log a line when each step starts and record how long it took; with `path`, every run's rows so far are
    rewritten there after each step (`timings.json`: a list with one list of rows per run of the report, the
    earlier ones of a resumed report kept: what a report cut short and resumed spent, per step)."""

    def __init__(self, path: Path | None = None, *, resuming: bool = False) -> None:
        self.rows: list[dict[str, Any]] = []
        self.path = path
        self.earlier: list[Any] = []
        if path is not None and resuming and path.is_file():
            with contextlib.suppress(ValueError):
                earlier = json.loads(path.read_text())
                self.earlier = earlier if isinstance(earlier, list) else []

    @contextlib.contextmanager
    def step(self, name: str, *, resumed: bool = False) -> Iterator[None]:
        """Time one step (a log line at its start and end); `resumed`: its outputs existed before."""
        log.info("==> %s%s", name, " (resuming)" if resumed else "")
        start = time.perf_counter()
        yield
        seconds = time.perf_counter() - start
        self.rows.append({"step": name, "seconds": round(seconds, 2), "resumed": resumed})
        log.info("    %s: %.1f s", name, seconds)
        if self.path is not None:
            _write_text(self.path, json.dumps([*self.earlier, self.rows], indent=1) + "\n")


# --------------------------------------------------------------------------------------------- the directory


def _remove_outputs(root: Path) -> None:
    for name in OUTPUTS:
        path = root / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    for pattern in FIGURE_PATTERNS:
        for png in root.glob(pattern):
            png.unlink()


def prepare_dir(layout: Layout, settings: dict[str, Any], *, overwrite: bool) -> bool:
    """Create the report directory, or reopen one made with the same settings; True when resuming.

    Raises:
        ValueError: the directory holds something else, or a report made with other settings (without
            `overwrite`).
    """
    root = layout.root
    if root.exists() and any(root.iterdir()) and not layout.settings.is_file():
        # Even with --overwrite: only an earlier report is ever deleted, never a directory of other things.
        raise ValueError(f"{root} exists and is not a cellseg report directory (no {SETTINGS_FILE}); choose another "
                         "--out")
    if overwrite and root.exists():
        _remove_outputs(root)
    if layout.settings.is_file():
        old = json.loads(layout.settings.read_text())
        differ = sorted(k for k in set(old) | set(settings) if old.get(k) != settings.get(k))
        if differ:
            lines = "; ".join(f"{k}: then {old.get(k)!r}, now {settings.get(k)!r}" for k in differ)
            raise ValueError(f"{root}: holds a report made with other settings ({lines}); pass --overwrite to "
                             "start over or choose another --out")
        log.info("%s: resuming (stores of the earlier run with the same settings are reused)", root)
        return True
    layout.stores.mkdir(parents=True, exist_ok=True)
    _write_text(layout.settings, json.dumps(settings, indent=2) + "\n")
    return False


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


# ------------------------------------------------------------------------------------------------- stages


def ensemble_once(members: Sequence[Path], out: Path, **kwargs: Any) -> PredictionStore:
    """`cellseg.infer.ensemble.ensemble` into `out` (resuming the crops a cut report wrote), or the store already
    there from the same members.

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
    return ensemble([str(m) for m in members], out, resume=True, **kwargs).store  # a cut report keeps its crops


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


@dataclass(frozen=True)
class Stores:
    """The stores the stages produced (module docstring)."""

    singles: list[Path]  # each run without TTA
    uniform: PredictionStore
    weighted: PredictionStore
    with_tta: PredictionStore  # TTA switched off for the classes it does not help
    postprocessed: dict[str, PredictionStore]  # era → post-processing switched off for the classes it does not help
    params: Any  # the tuned `ParamSet`
    switches: dict[str, Any]  # "uniform", "tta", "postprocess" → `cellseg.report.switches` documents


def make_stores(runs: Sequence[RunInfo], root: Path, plan: CropPlan, layout: Layout, opts: ReportOptions,
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
                  root: Path, plan: CropPlan, layout: Layout, opts: ReportOptions, timings: Timings,
                  scoring: Beside) -> Stores:
    """Stages 2-5 from the single models' stores `tta1` and their jobs on the tuning crops (`make_stores`);
    `scoring`: the single models' scoring beside the stages, those on the tuning crops first."""
    from cellseg.infer.ensemble_fit import FitOptions
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
            weighted = ensemble_once(tta1, layout.ensemble("weighted"), weights="auto", truth_root=root,
                                     val_crops=list(plan.tuning), fit=FitOptions(metric=era, device=opts.device),
                                     progress=opts.progress)
    except BaseException:
        if background is not None:
            background.abandon()
        raise
    # Stage 4 reuses stage 3's weights: a member with weight 0 for every class adds nothing, so only the others
    # predict with TTA (the same stage-4 store, for a fraction of the GPU time).
    used = tta_members(weighted, tta1, plan.predicted)
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
        weights = weighted.path / WEIGHTS_FILE
        if unused:
            weights = restrict_weights_file(weights, used, layout.stores / "weights_tta8.json")
        with_tta = ensemble_once(tta8, layout.ensemble("weighted_tta8"), weights=weights, progress=opts.progress)
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
    return Stores(singles=tta1, uniform=uniform, weighted=weighted, with_tta=with_tta, postprocessed=segmented,
                  params=params, switches={"era": era, "uniform": uniform_switch, "tta": tta_switch,
                            "postprocess": pp_switch})


def tta_members(weighted: PredictionStore, singles: Sequence[Path], crops: Sequence[str]) -> list[int]:
    """The runs stage 4 predicts with TTA (indices): those with a positive stage-3 weight for some class, and any
    other whose grid the ensemble of all the runs takes on some crop (grid "finest": the stage-4 ensemble then
    has stage 3's grids), judged on the single models' stores `singles`."""
    used = set(members_in_use(weighted.path / WEIGHTS_FILE))
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


def ensemble_stages(stores: Stores) -> list[tuple[str, str, PredictionStore]]:
    """Stages 2-4 as (key, title, probability store): scored as thresholded probabilities."""
    return [("uniform", "2. uniform ensemble", stores.uniform),
            ("weighted", "3. weighted ensemble (fitted weights)", stores.weighted),
            ("tta", f"4. + TTA ({TTA_TRANSFORMS}×)", stores.with_tta)]


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


def plain_jobs(runs: Sequence[RunInfo], stores: Stores, layout: Layout, plan: CropPlan
               ) -> list[tuple[Path, Path, Sequence[str]]]:
    """The thresholded segmentations `score_stages` scores: (probability store, segmentation store, crops)."""
    return thresholding_of([job for _, job in score_jobs(runs, stores, layout, plan).values()])


def score_stages(runs: Sequence[RunInfo], stores: Stores, layout: Layout, plan: CropPlan, opts: ReportOptions,
                 root: Path, timings: Timings) -> tuple[list[StageResult], list[StageResult], dict[str, Any]]:
    """(single models, stages 1-5, era → the choice of the best single run with its run name), each scored in
    every era; the single models also on the tuning crops, where the best of them is chosen."""
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
    on_tuning = [results.get(single_key(r, tuning=True), results[single_key(r)]) for r in runs]
    chosen = choose_best(on_tuning, opts.eras, [r.name for r in runs])
    best, _ = best_single_stage(scored, opts.eras, chosen)
    stages = [best, *(results[key] for key, _, _ in ensemble_stages(stores)), postprocess_stage(results, opts.eras)]
    return scored, stages, chosen


def postprocess_stage(results: Mapping[str, StageResult], eras: Sequence[str]) -> StageResult:
    """Stage 5: in each era the scores of the store its switch kept in that era (`postprocess_stores`); its
    `store` names the tuning era's first."""
    kept = {era: results.get(f"postprocess_{era}", results["postprocess"]) for era in eras}
    stores = dict.fromkeys([results["postprocess"].store, *(s.store for s in kept.values())])
    return StageResult(key="postprocess", title=results["postprocess"].title, store=", ".join(stores),
                       scores={era: s.scores[era] for era, s in kept.items()})


def run_report(opts: ReportOptions) -> Report:
    """Run every stage (module docstring), score it, and write report.md, report.json and the figures.

    Raises:
        ValueError, FileNotFoundError: bad runs, crops or report directory (checked before any prediction).
    """
    from cellseg.report.figures import write_figures  # matplotlib: imported only when a report is drawn

    runs = check_runs(opts.runs, checkpoint=opts.checkpoint, data_root=opts.data_root)
    root = data_root_of(runs, opts.data_root)
    plan = plan_crops(runs, root, crops=opts.crops, tune_crops=opts.tune_crops, explicit_root=opts.data_root)
    open_candidates(opts.reuse, runs)  # a store named for reuse that is none of the runs': an error now
    layout = Layout(Path(opts.out))
    resuming = prepare_dir(layout, settings_doc(runs, root, plan, checkpoint=opts.checkpoint,
                                                tune_metric=opts.tuning_era, overlap=opts.overlap),
                           overwrite=opts.overwrite)
    log.info("report on %d runs (%s); scored crops: %s; tuning crops: %s", len(runs),
             ", ".join(r.name for r in runs), ", ".join(plan.scored), ", ".join(plan.tuning))
    timings = Timings(layout.root / TIMINGS_FILE, resuming=resuming)
    with timings.step("truth of the scored crops (evaluator layout)", resumed=layout.truth.is_dir()):
        truth = truth_labels(layout.truth) if layout.truth.is_dir() else build_truth(
            layout.truth, plan.scored, runs[0].classes, root)
    stores = make_stores(runs, root, plan, layout, opts, timings)
    singles, stages, chosen = score_stages(runs, stores, layout, plan, opts, root, timings)
    with timings.step("crop-bootstrap intervals"):
        uncertainty = uncertainties({name: {era: [s.scores[era].document for s in rows] for era in opts.eras}
                                     for name, rows in (("stages", stages), ("singles", singles))},
                                    workers=opts.scoring_workers)
    report = Report(options=opts, runs=runs, data_root=root, plan=plan, truth=truth, singles=singles,
                    best_single={era: c["run"] for era, c in chosen.items()}, best_single_choice=chosen,
                    stages=stages, timings=timings.rows,
                    weights=json.loads((stores.weighted.path / WEIGHTS_FILE).read_text()),
                    params=stores.params.to_json(), uncertainty=uncertainty, switches=stores.switches)
    with timings.step("figures"):
        report.figures = write_figures(report, layout.root, progress=opts.progress)
    write_reports(report, layout.root)
    return report
