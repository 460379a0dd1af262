"""Scoring arms side by side: any probability stores of the test crops (nnU-Net's, a cellseg model's, an ensemble's),
each decoded two ways and scored in every era by cellseg's evaluator, with crop-bootstrap intervals.

- "plain": probability > 0.5 per class, instance classes as 26-connected components — nnU-Net's own decoding of
  region outputs (sigmoid > 0.5, connected components), and the report's stages 1-4 (`cellseg.decide.scoring`).
- "tuned": cellseg's post-processing (thresholds, seeded watershed, hierarchy options) tuned on the arm's own
  predictions of the tuning crops (`cellseg.postprocess.tuning.tune_store`, presence-aware) for each era on its
  own, as cellseg's stage 5 is, then applied to its test crops: an era's tuned score is its own decoding's.

An arm's tuned parameters and stores are kept in OUT/<arm> and reused when scoring again; `arm.json` there names
the stores they were made from, and a folder made from other stores is refused rather than reused.

Every number has a 95 % crop-bootstrap interval, and every arm's difference from the first arm a *paired* one
(the same draws of crops for both: `cellseg.decide.bootstrap`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cellseg.data.prediction_store import PredictionStore
from cellseg.decide.bootstrap import uncertainties, within_noise
from cellseg.decide.scoring import ScoreJob, score_segmentations
from cellseg.decide.truth import build_truth
from cellseg.eval.eras import ERAS
from cellseg.eval.rules import nan_to_none

log = logging.getLogger(__name__)

DECODINGS = ("plain", "tuned")


@dataclass(frozen=True)
class Arm:
    """One arm: a name and its probability stores of the test crops and of the tuning crops."""

    name: str
    test: Path
    tune: Path

    @classmethod
    def parse(cls, text: str) -> Arm:
        """`NAME=TEST.zarr,TUNE.zarr`.

        Raises:
            ValueError: another form, or a store that is not a probability store (named).
        """
        name, sep, stores = text.partition("=")
        parts = stores.split(",")
        if not sep or not name or len(parts) != 2:
            raise ValueError(f"--arm {text!r}: expected NAME=TEST.zarr,TUNE.zarr")
        arm = cls(name, Path(parts[0]), Path(parts[1]))
        for path in (arm.test, arm.tune):
            if PredictionStore.open(path).kind != "probabilities":
                raise ValueError(f"--arm {name}: {path} holds no probabilities")
        return arm


def _tuned(arm: Arm, root: Path, out: Path, era: str, *, device: str, workers: int) -> Path:
    """The arm's test store post-processed with parameters tuned for `era` on its tuning store (resumes a cut
    tuning)."""
    from cellseg.postprocess.apply import postprocess_store
    from cellseg.postprocess.params import ParamSet
    from cellseg.postprocess.tuning import tune_store

    params_path = out / f"params_{era}.json"
    if params_path.is_file():
        params = ParamSet.load(params_path)
    else:
        tune = PredictionStore.open(arm.tune)
        params = tune_store(tune, root, crops=tune.completed(), era=era, device=device, workers=workers,
                            checkpoint=out / f".params_{era}.json.partial")
        params.save(params_path)
    seg = postprocess_store(PredictionStore.open(arm.test), out / f"tuned_{era}.zarr", params=params, device=device,
                            data_root=str(root))
    return seg.path


def _arm_folder(arm: Arm, out: Path) -> Path:
    """OUT/<arm name>, made for this arm's stores (`arm.json`).

    Raises:
        ValueError: the folder holds what other stores gave (named).
    """
    where = out / arm.name
    stores = {"test": str(arm.test.resolve()), "tune": str(arm.tune.resolve())}
    record = where / "arm.json"
    if record.is_file() and json.loads(record.read_text()) != stores:
        raise ValueError(f"{where}: scored before from {json.loads(record.read_text())}, not {stores}: name the arm "
                         "otherwise or choose another --out")
    where.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps(stores, indent=1) + "\n")
    return where


def score_arms(arms: Sequence[Arm], root: Path, out: Path, *, device: str = "cpu", workers: int = 1,
               eras: Sequence[str] = tuple(ERAS), data: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Score every arm both ways (module docstring) on the test crops every arm holds; writes `out/scores.json`
    (with `data`: what the data was, as every record of the run says) and returns it.

    Raises:
        ValueError: arms that predict different test crops or classes (they would not be comparable).
    """
    stores = [PredictionStore.open(a.test) for a in arms]
    crops, classes = stores[0].completed(), stores[0].classes
    for arm, store in zip(arms, stores, strict=True):
        if store.completed() != crops or set(store.classes) != set(classes):
            raise ValueError(f"{arm.name}: {arm.test} holds crops {store.completed()} of {len(store.classes)} "
                             f"classes, {arms[0].name} {crops} of {len(classes)}: not comparable")
    out.mkdir(parents=True, exist_ok=True)
    truth = out / "truth.zarr"
    if not truth.exists():
        build_truth(truth, crops, classes, root)
    jobs, keys = [], []
    for arm in arms:
        where = _arm_folder(arm, out)
        jobs.append(ScoreJob(seg=arm.test, truth=truth, submission=where / "plain.zip", plain=where / "plain.zarr",
                             crops=crops))
        keys.append((arm.name, "plain", None))
        for era in eras:
            jobs.append(ScoreJob(seg=_tuned(arm, root, where, era, device=device, workers=workers), truth=truth,
                                 submission=where / f"tuned_{era}.zip"))
            keys.append((arm.name, "tuned", era))
    scores = score_segmentations(jobs, eras, workers=workers)
    found = dict(zip(keys, scores, strict=True))
    by_key = {(name, decoding): {era: found[(name, decoding, None if decoding == "plain" else era)][era] for era in eras}
              for name, decoding, _ in keys}  # each era's tuned score from the decoding tuned for it
    doc: dict[str, Any] = {"crops": crops, "classes": list(classes), "eras": list(eras), "tuned_for": "each era",
                           "arms": {a.name: {"test": str(a.test), "tune": str(a.tune)} for a in arms},
                           "data": dict(data or {}), "scores": {}}
    for decoding in DECODINGS:
        docs = {era: [by_key[(a.name, decoding)][era].document for a in arms] for era in eras}
        groups = {"arms": docs, **{f"vs {a.name}": {era: [docs[era][0], docs[era][i]] for era in eras}
                                   for i, a in enumerate(arms) if i}}
        noise = uncertainties(groups, workers=workers)
        for era in eras:
            first = by_key[(arms[0].name, decoding)][era]
            for i, arm in enumerate(arms):
                s = by_key[(arm.name, decoding)][era]
                iv = noise[era]["arms"]["stages"][i]["overall"]
                entry = {"overall": s.overall, "instance": s.instance, "semantic": s.semantic,
                         "interval": [iv.low, iv.high], "classes": dict(s.classes)}
                if i:
                    diff = noise[era][f"vs {arm.name}"]["changes"][1]["overall"]  # paired: arm minus the first
                    entry["vs_first"] = {"change": s.overall - first.overall, "interval": [diff.low, diff.high],
                                         "within_noise": within_noise(diff),
                                         "relative": (s.overall / first.overall - 1) if first.overall else None}
                doc["scores"].setdefault(arm.name, {}).setdefault(decoding, {})[era] = entry
    (out / "scores.json").write_text(json.dumps(_clean(doc), indent=1) + "\n")
    return doc


def _clean(value: Any) -> Any:
    """JSON-ready: NaN and infinities as null (`cellseg.eval.rules.nan_to_none`), containers recursively."""
    if isinstance(value, Mapping):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return nan_to_none(value) if isinstance(value, float) else value
