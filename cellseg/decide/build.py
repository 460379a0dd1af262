"""`build_decisions`: the decisions file (`cellseg.decide.document`) from what stages 1-5 decided on the tuning
crops (`cellseg.decide.stages.Stores`: their switches, the weights as switched, the tuned parameters), each
per-class choice with its tuning scores and the paired crop-bootstrap interval of its gain
(`cellseg.decide.evidence`)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cellseg.config.inference import InferConfig
from cellseg.decide.document import ClassChoice, Decisions, member_record, now
from cellseg.decide.evidence import switch_intervals
from cellseg.decide.inputs import CropPlan, RunInfo, checkpoint_file
from cellseg.decide.options import DecideOptions, Layout
from cellseg.decide.stages import TTA_TRANSFORMS, Stores, single_key
from cellseg.eval.eras import get_era
from cellseg.eval.noise import DRAWS, LEVEL, SEED


def _evidence(switch: Mapping[str, Any], name: str, replaced: str, interval: Sequence[float | None]
              ) -> dict[str, Any]:
    """One switch's tuning scores of a class: {"on", "score" (with the stage), "replaced" (the score of what it
    would replace), "replaces" (what that is), "gain_interval" (the paired crop-bootstrap interval of score −
    replaced)}."""
    s = switch["classes"].get(name, {})
    return {"on": bool(s.get("on", True)), "score": _number(s.get("after")), "replaced": _number(s.get("before")),
            "replaces": replaced, "gain_interval": list(interval)}


def _number(value: Any) -> float | None:
    return None if value is None or not math.isfinite(float(value)) else float(value)


def class_choices(classes: Sequence[str], switches: Mapping[str, Any], eras: Sequence[str],
                  intervals: Mapping[str, Mapping[str, Sequence[float | None]]]) -> dict[str, ClassChoice]:
    """Class → its choice, from the stage switches (`cellseg.decide.switches` documents) and the intervals of their
    gains (`cellseg.decide.evidence.switch_intervals`)."""
    best = switches["uniform"]["best_single"]
    out = {}
    for name in classes:
        uniform = switches["uniform"]["classes"][name]["on"]
        fitted = switches["weighted"]["classes"][name]["on"]
        ensemble = "fitted" if fitted else ("uniform" if uniform else "single")
        stage2 = "the uniform mean" if uniform else f"the best single model ({best})"
        gains = intervals[name]
        evidence = {"uniform": _evidence(switches["uniform"], name, f"the best single model ({best})",
                                         gains["uniform"]),
                    "weighted": _evidence(switches["weighted"], name, stage2, gains["weighted"]),
                    "tta": _evidence(switches["tta"], name, "one pass (no TTA)", gains["tta"])}
        pp = switches["postprocess"]["eras"]
        for era in eras:
            evidence[f"postprocess_{era}"] = _evidence(pp[era], name, "the plain decoding (p > 0.5, 26-connected)",
                                                       gains[f"postprocess_{era}"])
        out[name] = ClassChoice(ensemble=ensemble, tta=bool(switches["tta"]["classes"][name]["on"]),
                                postprocess={era: bool(pp[era]["classes"][name]["on"]) for era in eras},
                                evidence=evidence)
    return out


def build_decisions(runs: Sequence[RunInfo], stores: Stores, plan: CropPlan, opts: DecideOptions, root: Path,
                    layout: Layout) -> Decisions:
    """The decisions of stages 1-5 (`stores`: `cellseg.decide.stages.make_stores` on `plan.tuning`, in `layout`)."""
    switches = stores.switches
    eras = tuple(switches["postprocess"]["eras"])
    best = next(r for r in runs if r.name == switches["uniform"]["best_single"])
    single = single_key(best, tuning=set(plan.tuning) != set(plan.scored))  # as the stages scored it
    intervals = switch_intervals(layout, single, switches, runs[0].classes, eras)
    members = tuple(member_record(r.name, r.run_dir, checkpoint_file(r.run_dir, opts.checkpoint)) for r in runs)
    weights = json.loads(Path(stores.weights).read_text())["channels"]
    defaults = InferConfig()
    inference = {"checkpoint": opts.checkpoint, "overlap": opts.overlap, "blend": defaults.blend,
                 "tta_transforms": TTA_TRANSFORMS, "dtype": "uint8" if defaults.uint8 else "float16"}
    tuning = {"data_root": str(root.resolve()), "crops": list(plan.tuning),
              "metrics": {era: get_era(era).title for era in eras},
              "rule": "each stage kept for a class only where it scores strictly higher than the stage before on the "
                      "tuning crops, in decision mode (cellseg.eval.decision)",
              "gain_intervals": {"level": LEVEL, "draws": DRAWS, "seed": SEED, "paired": True}}
    best = {"run": switches["uniform"]["best_single"], "era": switches["era"]}
    return Decisions(members=members, weights={c: tuple(w) for c, w in weights.items()},
                     classes=class_choices(runs[0].classes, switches, eras, intervals), params=stores.params.to_json(),
                     era=switches["era"], eras=eras, inference=inference, tuning=tuning, best_single=best,
                     created=now())
