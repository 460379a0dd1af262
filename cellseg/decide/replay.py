"""The stores of stages 1-5 from a decisions file, on crops where nothing is decided (`cellseg report --decisions`):
what each stage of the decided pipeline predicts, for the report to score.

From the file (`cellseg.decide.document`), on the scored crops only:

1. each run alone, no TTA; the best single model is the file's;
2. the uniform mean, switched per class as the file's uniform switch was (the best single model's prediction
   where it is off);
3. the weighted mean with the file's weights: per class the fitted weights, the uniform mean or the best single
   model alone, as switched;
4. the members that weigh a class with TTA predict with 8 transforms, averaged with the same weights; the classes
   without TTA keep stage 3's prediction;
5. the file's tuned parameters applied to stage 4, the plain decoding for the classes whose post-processing is off
   in an era (each era's store, stores shared by eras that switch off the same classes).

The stores are those `cellseg.decide.stages.make_stores` writes when it decides the same things on its own tuning
crops, so a report of given decisions scores what the report that made them scored on the same crops.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from cellseg.data.prediction_store import PredictionStore
from cellseg.decide.document import Decisions
from cellseg.decide.inputs import CropPlan, RunInfo
from cellseg.decide.options import DecideOptions, Layout
from cellseg.decide.predictions import predict_all
from cellseg.decide.stages import TTA_TRANSFORMS, Stores, ensemble_once
from cellseg.decide.timings import Timings
from cellseg.infer.merge import merge_classes
from cellseg.runtime.checkpoint import save_atomic_text

log = logging.getLogger(__name__)
SWITCH_KEYS = ("uniform", "weighted", "tta")


def _switch(decisions: Decisions, key: str) -> dict[str, Any]:
    """A switch document (`cellseg.decide.switches`) rebuilt from the file's evidence of `key`."""
    classes = {}
    for name, choice in decisions.classes.items():
        e = choice.evidence.get(key, {})
        classes[name] = {"before": _nan(e.get("replaced")), "after": _nan(e.get("score")), "on": bool(e.get("on", True))}
    return {"classes": classes, "off": [c for c, s in classes.items() if not s["on"]]}


def _nan(value: Any) -> float:
    return math.nan if value is None else float(value)


def switches_of(decisions: Decisions) -> dict[str, Any]:
    """The report's `switches` as the file records them (the tuning era's; stage 5's in every era of the file)."""
    out: dict[str, Any] = {"era": decisions.era, **{k: _switch(decisions, k) for k in SWITCH_KEYS}}
    out["uniform"]["best_single"] = decisions.best_single.get("run")
    eras = {e: _switch(decisions, f"postprocess_{e}") for e in decisions.eras}
    out["postprocess"] = {**eras[decisions.era], "eras": eras}
    return out


def _weights_file(decisions: Decisions, members: Sequence[int], out: Path) -> Path:
    """The file's weights for `members` (indices, in order) as an ensemble weights file."""
    doc = {"method": "decisions", "channels": {c: [w[i] for i in members] for c, w in decisions.weights.items()},
           "members": [{"run_dir": decisions.members[i].run_dir} for i in members], "decisions": decisions.source}
    save_atomic_text(json.dumps(doc, indent=2) + "\n", out)
    return out


def replay_stores(runs: Sequence[RunInfo], decisions: Decisions, plan: CropPlan, layout: Layout,
                  opts: DecideOptions, timings: Timings) -> Stores:
    """Stages 1-5 on `plan.scored` as `decisions` says (module docstring); `runs` in the file's member order."""
    from cellseg.postprocess.apply import postprocess_store, resolve
    from cellseg.postprocess.params import ParamSet

    scored = replace(plan, tuning=plan.scored)  # nothing is decided here: the scored crops alone are predicted
    names = [r.name for r in runs]
    best = names.index(str(decisions.best_single["run"]))
    switches = switches_of(decisions)
    with timings.step(f"1. single models: predict {len(plan.scored)} crops, no TTA"):
        tta1 = predict_all(runs, layout, scored, opts, tta=1)
    with timings.step("2. uniform ensemble, switched as decided"):
        uniform = ensemble_once(tta1, layout.ensemble("uniform"), weights="uniform", progress=opts.progress)
        off = switches["uniform"]["off"]
        if off:
            uniform = merge_classes([uniform, PredictionStore.open(tta1[best])], dict.fromkeys(off, 1),
                                    layout.ensemble("uniform_switched"))
    with timings.step("3. weighted ensemble with the decided weights"):
        every = list(range(len(runs)))
        weights = _weights_file(decisions, every, layout.stores / "weights_decided.json")
        weighted = ensemble_once(tta1, layout.ensemble("weighted_switched"), weights=weights, progress=opts.progress)
    with_tta_classes = decisions.tta_classes()
    used = decisions.members_for(with_tta_classes) if with_tta_classes else []
    with timings.step(f"4. + TTA: predict {len(plan.scored)} crops with {TTA_TRANSFORMS} transforms ({len(used)} of "
                      f"{len(runs)} members)"):
        if used:
            tta8 = predict_all([runs[i] for i in used], layout, scored, opts, tta=TTA_TRANSFORMS)
            restricted = _restricted(decisions, used, layout.stores / "weights_decided_tta8.json")
            with_tta = ensemble_once(tta8, layout.ensemble("weighted_tta8"), weights=restricted, progress=opts.progress)
            without = [c for c in decisions.classes if c not in with_tta_classes]
            if without:
                with_tta = merge_classes([with_tta, weighted], dict.fromkeys(without, 1),
                                         layout.ensemble("weighted_tta8_switched"))
        else:
            with_tta = weighted
    params = ParamSet.from_json(decisions.params, source=decisions.where)
    device = resolve(opts.device)
    postprocessed: dict[str, PredictionStore] = {}
    by_plain: dict[tuple[str, ...], PredictionStore] = {}
    with timings.step(f"5. + post-processing as decided, {len(decisions.eras)} eras"):
        for era in dict.fromkeys([decisions.era, *decisions.eras]):
            plain = tuple(decisions.plain_classes(era))
            if plain not in by_plain:
                out = layout.postprocessed_in(era, tuning_era=decisions.era, off=plain)
                by_plain[plain] = postprocess_store(with_tta, out, params=params, device=device, plain=plain,
                                                    progress=opts.progress)
            postprocessed[era] = by_plain[plain]
    return Stores(singles=tta1, uniform=uniform, weighted=weighted, weights=weights, with_tta=with_tta,
                  postprocessed=postprocessed, params=params, switches=switches)


def _restricted(decisions: Decisions, members: Sequence[int], out: Path) -> Path:
    """The file's weights of `members` only: the other members weigh no TTA class, but may weigh the classes
    without TTA, whose channels of this ensemble are not used (they are averaged uniformly here)."""
    channels = decisions.pass_weights(decisions.tta_classes(), members)
    doc = {"method": "decisions", "channels": channels,
           "members": [{"run_dir": decisions.members[i].run_dir} for i in members], "decisions": decisions.source}
    save_atomic_text(json.dumps(doc, indent=2) + "\n", out)
    return out


def best_single_choice(decisions: Decisions, runs: Sequence[RunInfo], eras: Sequence[str]) -> dict[str, Any]:
    """Era → the best single model as the file decided it (one choice, the tuning era's, for every era)."""
    names = [r.name for r in runs]
    name = str(decisions.best_single["run"])
    return {era: {"index": names.index(name), "run": name, "ranked_by": f"decided in {decisions.era}",
                  "scores": {}} for era in eras}


def members_in_order(runs: Sequence[RunInfo], decisions: Decisions) -> list[RunInfo]:
    """`runs` in the file's member order (checked to be its members by `Decisions.check_runs`)."""
    by_dir: Mapping[Path, RunInfo] = {r.run_dir.resolve(): r for r in runs}
    return [by_dir[Path(m.run_dir).resolve()] for m in decisions.members]
