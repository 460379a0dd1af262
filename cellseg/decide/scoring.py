"""Scoring one stage: its segmentation, written as a submission at the truth's geometry, through `evaluate`.

A stage without post-processing is scored the way the official evaluator reads a binary prediction, on each
truth array's own grid: the probability interpolated linearly onto that grid and `> 0.5` per class; instance
classes: the 26-connected components of `probability > 0.5` on the store's grid (numbered as the evaluators
number them), carried onto the truth's grid by the same decoder (`cellseg.postprocess.native`, with
`plain_params`). The post-processing stage brings its own masks and object ids, decoded on the same grids by
`postprocess_store`. Either segmentation store then goes through the same path as a real submission:
`cellseg.eval.submit.write_submission` copies every (crop, label) of the truth (already on the truth's grid:
no resampling) and `cellseg.eval.score.evaluate` scores it in each era, so the only difference between the
last two stages is our post-processing.

The truth's grids are looked up in the data root the probability store records (`cellseg.postprocess.annotation`,
the same grids the report's truth store holds); a crop found there nowhere is segmented on the store's grid,
and `write_submission` then upsamples it by nearest neighbour.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cellseg.classes import is_instance
from cellseg.data.crops import Crop
from cellseg.data.prediction_store import PredictionStore
from cellseg.eval.eras import Era
from cellseg.eval.io import open_source
from cellseg.eval.report import to_json
from cellseg.eval.rules import is_scored_as_instance
from cellseg.eval.score import evaluate
from cellseg.eval.submit import default_workers, write_submission
from cellseg.eval.validate import crops_from_truth
from cellseg.pool import one_thread_per_process
from cellseg.postprocess.annotation import AnnotationGrids
from cellseg.postprocess.apply import segment_crop
from cellseg.postprocess.native import plain_params
from cellseg.postprocess.params import ParamSet

log = logging.getLogger(__name__)
# `score_segmentations`: scoring processes per store when several stores are scored side by side (a store's
# (crop, label) pairs are a few dozen, a handful of them slow: more processes per store mostly wait)
SCORING_PROCESSES_PER_STORE = 4
PLAIN_RULE = ("probability interpolated linearly onto the truth's grid > 0.5; instance classes: 26-connected "
              "components on the model's grid, refined on the truth's")


def plain_segmentation(prob: PredictionStore, out: Path, crops: Sequence[str], *, progress: bool = False,
                       targets: Mapping[int, Crop] | None = None) -> PredictionStore:
    """Threshold a probability store at 0.5 on each truth grid (instance classes: 26-connected components; module
    docstring) into a segmentation store of `crops`; crops already written are kept (resume).

    Args:
        targets: the crops' truth geometry (default: looked up in the store's data root).

    Raises:
        ValueError: `prob` is not a probability store, lacks a crop, or `out` holds other channels.
    """
    from tqdm import tqdm

    if prob.kind != "probabilities":
        raise ValueError(f"{prob.path}: holds {prob.kind}, expected probabilities")
    missing = [c for c in crops if c not in prob]
    if missing:
        raise ValueError(f"{prob.path}: crops {missing} are not in the store (it holds {prob.completed()})")
    classes = prob.classes
    seg = PredictionStore.create(out, kind="segmentation", channels=classes,
                                 instance_channels=[c for c in classes if is_instance(c)],
                                 provenance={"source": str(prob.path.resolve()), "rule": PLAIN_RULE},
                                 resume=out.exists())
    params = ParamSet({c: plain_params(c) for c in classes})
    grids = AnnotationGrids(prob.provenance.get("data_root"), targets)
    for crop in tqdm([c for c in crops if c not in seg], desc=f"threshold {prob.path.name}", unit="crop",
                     disable=not progress, leave=False):
        here = [c for c in classes if c in prob.crop_channels(crop)]  # a test crop: the classes it is scored on
        segment_crop(prob, crop, seg, params=params, grids=grids.of(prob, crop, here), device="cpu",
                     attrs={"rule": PLAIN_RULE})
    return seg


def _plain_in_worker(prob: str, out: str, crops: Sequence[str]) -> str:
    """One store's `plain_segmentation`, in a worker process."""
    plain_segmentation(PredictionStore.open(Path(prob)), Path(out), crops)
    return out


def plain_segmentations(jobs: Sequence[tuple[Path, Path, Sequence[str]]], processes: int) -> None:
    """`plain_segmentation` of several probability stores, (store, out, crops) each, in `processes` spawned
    processes (one store at a time each; 1: nothing is done here and each store is segmented when it is
    scored). A crop is segmented by up to `MAX_CLASS_THREADS` threads over its classes, a few of which are
    slow: on a machine with more cores, stores side by side use them. The stores written are those of the
    one-after-the-other path (each crop is the same computation; `plain_segmentation` keeps finished crops)."""
    import concurrent.futures
    import multiprocessing

    if processes <= 1 or len(jobs) <= 1:
        return
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(min(processes, len(jobs)), mp_context=context,
                                                initializer=one_thread_per_process) as pool:
        for future in [pool.submit(_plain_in_worker, str(p), str(o), list(c)) for p, o, c in jobs]:
            future.result()


@dataclass(frozen=True, kw_only=True)
class EraScores:
    """One era's scores of one stage: the summary and the whole evaluation document.

    Attributes:
        era: the era's name, e.g. "2025" or "2026".
        overall, instance, semantic: the overall scores (NaN where the era gives none).
        classes: class → its score (instance: combined score; semantic: IoU).
        document: `cellseg.eval.report.to_json` of the evaluation (per crop, per class, notes).
    """

    era: Era
    overall: float
    instance: float
    semantic: float
    classes: Mapping[str, float]
    document: Mapping[str, Any]


def _number(value: Any) -> float:
    return math.nan if value is None else float(value)


def era_scores(doc: Mapping[str, Any]) -> EraScores:
    """The summary of an evaluation document."""
    labels = doc["label_scores"]
    classes = {k: _number(v.get("combined_score" if is_scored_as_instance(k) else "iou"))
               for k, v in labels.items()}
    return EraScores(era=doc["metric"], overall=_number(doc["overall_score"]),
                     instance=_number(doc["overall_instance_score"]), semantic=_number(doc["overall_semantic_score"]),
                     classes=classes, document=doc)


def scores_file(submission: Path, era: Era) -> Path:
    """Where `score_segmentation` keeps one era's evaluation of `submission` (a resumed report reads it back)."""
    return submission.with_name(f"{submission.stem}.{era}.json")


def _read_back(submission: Path, eras: Sequence[Era]) -> dict[str, EraScores] | None:
    """Every era's evaluation of `submission` written after it (by `score_segmentation`), logged; else None."""
    files = [scores_file(submission, era) for era in eras]
    if not submission.is_file() or not all(f.is_file() for f in files):
        return None
    if min(f.stat().st_mtime for f in files) < submission.stat().st_mtime:
        return None  # the submission was written again since
    log.info("%s: scores of %s read back from %s", submission.name, ", ".join(eras), submission.parent)
    return {era: era_scores(json.loads(f.read_text())) for era, f in zip(eras, files, strict=True)}


def score_segmentation(seg: PredictionStore, truth: Path, submission: Path, eras: Sequence[Era], *,
                       workers: int = 1, memory_budget_bytes: int | None = None, progress: bool = False
                       ) -> dict[str, EraScores]:
    """Write `seg` as a submission at the geometry of `truth` and evaluate it in every era (`workers` processes
    scoring (crop, label) pairs within `memory_budget_bytes`; the scores do not depend on them). Each era's
    evaluation is kept next to the submission (`scores_file`) and read back instead while it is newer than the
    submission: a report that was cut resumes its scoring.

    Raises:
        ValueError: the segmentation lacks labels of the truth (they would score 0 silently).
    """
    from cellseg.eval.report import write_json

    cached = _read_back(submission, eras)
    if cached is not None:
        return cached
    crops = crops_from_truth(open_source(truth))
    started = time.perf_counter()
    report = write_submission(seg.path, crops, submission, overwrite=True, progress=progress,
                              workers=max(1, min(default_workers(), workers)))
    if report.missing:
        raise ValueError(f"{seg.path}: no prediction for {report.missing} of the truth {truth}")
    log.info("%s: submission written in %.1f s", seg.path.name, time.perf_counter() - started)
    out = {}
    for era in eras:
        started = time.perf_counter()
        evaluation = evaluate(submission, truth, metric=era, workers=workers, memory_budget_bytes=memory_budget_bytes,
                              progress=progress)
        write_json(evaluation, scores_file(submission, era))
        out[era] = era_scores(to_json(evaluation))
        slowest = ", ".join(f"{key} {s:.1f} s" for key, s in evaluation.slowest())
        log.info("%s: %s overall %.4f (instance %.4f, semantic %.4f); scored in %.1f s, %d scoring process(es) (slowest: "
                 "%s)", seg.path.name, era, out[era].overall, out[era].instance, out[era].semantic,
                 time.perf_counter() - started, workers, slowest)
    return out


@dataclass(frozen=True)
class ScoreJob:
    """One segmentation to score: `seg` (a segmentation store, or a probability store thresholded first into
    `plain` on `crops`) against `truth`, written as `submission`."""

    seg: Path
    truth: Path
    submission: Path
    plain: Path | None = None
    crops: Sequence[str] = ()


def thresholding_of(jobs: Sequence[ScoreJob]) -> list[tuple[Path, Path, Sequence[str]]]:
    """The `plain_segmentations` jobs (probability store, segmentation store, crops) that `jobs` need first."""
    return [(j.seg, j.plain, j.crops) for j in jobs if j.plain is not None]


def _run_job(job: ScoreJob, eras: Sequence[Era], workers: int, budget: int | None, progress: bool
             ) -> dict[str, EraScores]:
    store = PredictionStore.open(job.seg)
    if job.plain is not None:
        store = plain_segmentation(store, job.plain, job.crops, progress=progress)
    return score_segmentation(store, job.truth, job.submission, eras, workers=workers, memory_budget_bytes=budget,
                              progress=progress)


def _score_in_process(level: int, job: ScoreJob, eras: Sequence[Era], workers: int, budget: int
                      ) -> dict[str, EraScores]:
    """One store's `_run_job` in a spawned process, logging at the report's `level`."""
    from cellseg import logs

    logs.configure(level, force=True)
    return _run_job(job, eras, workers, budget, False)


def score_segmentations(jobs: Sequence[ScoreJob], eras: Sequence[Era], *, workers: int, progress: bool = False,
                        memory_share: float = 1.0) -> list[dict[str, EraScores]]:
    """`score_segmentation` of every job, in job order: with `workers` ≥ 2 × `SCORING_PROCESSES_PER_STORE`,
    several stores at a time, each in a spawned process of its own (evaluating with its own
    `SCORING_PROCESSES_PER_STORE`-or-more processes and an equal share of the memory budget). A store's scoring
    waits on its slowest (crop, label) pairs (large instance classes) with most of its processes idle; stores side
    by side fill those gaps. Each store has a process, not a thread, because writing a submission is Python work
    under one interpreter lock: four submissions written in threads of one process took 5.6 times as long as one
    (2 cores). `memory_share`: the part of the memory budget these stores may use together (the rest is left to
    work running beside them). The scores are those of one store at a time (each evaluation is the same
    computation)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    from tqdm import tqdm

    from cellseg.pool import default_budget

    done = {i: cached for i, job in enumerate(jobs) if (cached := _read_back(job.submission, eras)) is not None}
    todo = [i for i in range(len(jobs)) if i not in done]
    at_once = max(1, min(len(todo), workers // SCORING_PROCESSES_PER_STORE))
    shared = int(default_budget() * memory_share) if memory_share < 1 else None  # None: each evaluation's default
    if at_once == 1:
        done.update({i: _run_job(jobs[i], eras, workers, shared, progress) for i in todo})
        return [done[i] for i in range(len(jobs))]
    each, budget = workers // at_once, (shared or default_budget()) // at_once
    log.info("scoring %d stores, %d at a time with %d processes each", len(todo), at_once, each)
    level = logging.getLogger("cellseg").getEffectiveLevel()
    context = multiprocessing.get_context("spawn")  # no inherited threads or CUDA state
    with ProcessPoolExecutor(at_once, mp_context=context, initializer=one_thread_per_process) as pool, \
            tqdm(total=len(todo), desc=f"scoring, {at_once} at a time", unit="store", disable=not progress) as bar:
        futures = {pool.submit(_score_in_process, level, jobs[i], list(eras), each, budget): i for i in todo}
        try:
            for future in as_completed(futures):
                done[futures[future]] = future.result()  # the first failure, as soon as it happens
                bar.update()
        except BaseException:
            for future in futures:  # no store starts after it; those being scored finish
                future.cancel()
            raise
    return [done[i] for i in range(len(jobs))]




@dataclass(frozen=True)
class Beside:
    """The scoring beside the stages (`scoring_beside`): `first` resolves when its first jobs are scored (their
    evaluations on disk), `all` when every job is; each raises what that scoring raised."""

    first: Future[None]
    all: Future[None]


@contextlib.contextmanager
def scoring_beside(jobs: Sequence[ScoreJob], eras: Sequence[Era], *, workers: int, plain_processes: int,
                   first: Sequence[ScoreJob] = ()) -> Iterator[Beside]:
    """Threshold and score `first`, then `jobs`, in a background thread with half the memory budget while the
    `with` block runs (the report's GPU stages leave the cores idle). The block gets a `Beside`: a stage that needs
    the `first` jobs' scores waits on `first` and reads their evaluations back (`score_segmentations` does), and
    `all.done()` says the cores are free again. Evaluations are kept next to their submissions (`scores_file`),
    so scoring them again afterwards reads them back. On leaving: waits for the thread and raises what it raised
    (an error of the block itself wins; the thread's is then only logged)."""
    from concurrent.futures import ThreadPoolExecutor

    first_scored: Future[None] = Future()

    def score(batch: Sequence[ScoreJob]) -> None:
        plain_segmentations(thresholding_of(batch), plain_processes)
        score_segmentations(batch, eras, workers=workers, memory_share=0.5)

    def work() -> None:
        started = time.perf_counter()
        try:
            score(first)
        except BaseException as error:
            first_scored.set_exception(error)
            raise
        first_scored.set_result(None)
        score(jobs)
        log.info("%d segmentations scored beside the other stages in %.1f s (%d processes)", len(first) + len(jobs),
                 time.perf_counter() - started, workers)

    with ThreadPoolExecutor(1, thread_name_prefix="score-beside") as pool:
        future = pool.submit(work)
        try:
            yield Beside(first=first_scored, all=future)
        except BaseException:
            error = future.exception()  # waits: its processes must not outlive the report's error
            if error is not None:
                log.error("scoring beside the stages failed too: %s", error)
            raise
        if not future.done():
            log.info("waiting for the %d segmentations scored beside the stages", len(first) + len(jobs))
        future.result()
