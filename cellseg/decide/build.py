"""`build_decisions`: the decisions file (`cellseg.decide.document`) from what stages 1-5 decided on the tuning
crops (`cellseg.decide.stages.Stores`: their switches, the weights as switched, the tuned parameters)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cellseg.config.inference import InferConfig
from cellseg.decide.document import ClassChoice, Decisions, member_record, now
from cellseg.decide.inputs import CropPlan, RunInfo, checkpoint_file
from cellseg.decide.options import DecideOptions
from cellseg.decide.stages import TTA_TRANSFORMS, Stores
from cellseg.eval.eras import get_era


def _evidence(switch: Mapping[str, Any], name: str, replaced: str) -> dict[str, Any]:
    """One switch's tuning scores of a class: {"on", "score" (with the stage), "replaced" (the score of what it
    would replace), "replaces" (what that is)}."""
    s = switch["classes"].get(name, {})
    return {"on": bool(s.get("on", True)), "score": _number(s.get("after")), "replaced": _number(s.get("before")),
            "replaces": replaced}


def _number(value: Any) -> float | None:
    return None if value is None or not math.isfinite(float(value)) else float(value)


def class_choices(classes: Sequence[str], switches: Mapping[str, Any], eras: Sequence[str]
                  ) -> dict[str, ClassChoice]:
    """Class → its choice, from the stage switches (`cellseg.decide.switches` documents)."""
    best = switches["uniform"]["best_single"]
    out = {}
    for name in classes:
        uniform = switches["uniform"]["classes"][name]["on"]
        fitted = switches["weighted"]["classes"][name]["on"]
        ensemble = "fitted" if fitted else ("uniform" if uniform else "single")
        stage2 = "the uniform mean" if uniform else f"the best single model ({best})"
        evidence = {"uniform": _evidence(switches["uniform"], name, f"the best single model ({best})"),
                    "weighted": _evidence(switches["weighted"], name, stage2),
                    "tta": _evidence(switches["tta"], name, "one pass (no TTA)")}
        pp = switches["postprocess"]["eras"]
        for era in eras:
            evidence[f"postprocess_{era}"] = _evidence(pp[era], name, "the plain decoding (p > 0.5, 26-connected)")
        out[name] = ClassChoice(ensemble=ensemble, tta=bool(switches["tta"]["classes"][name]["on"]),
                                postprocess={era: bool(pp[era]["classes"][name]["on"]) for era in eras},
                                evidence=evidence)
    return out


def build_decisions(runs: Sequence[RunInfo], stores: Stores, plan: CropPlan, opts: DecideOptions, root: Path
                    ) -> Decisions:
    """The decisions of stages 1-5 (`stores`: `cellseg.decide.stages.make_stores` on `plan.tuning`)."""
    switches = stores.switches
    eras = tuple(switches["postprocess"]["eras"])
    members = tuple(member_record(r.name, r.run_dir, checkpoint_file(r.run_dir, opts.checkpoint)) for r in runs)
    weights = json.loads(Path(stores.weights).read_text())["channels"]
    defaults = InferConfig()
    inference = {"checkpoint": opts.checkpoint, "overlap": opts.overlap, "blend": defaults.blend,
                 "tta_transforms": TTA_TRANSFORMS, "dtype": "uint8" if defaults.uint8 else "float16"}
    tuning = {"data_root": str(root.resolve()), "crops": list(plan.tuning),
              "metrics": {era: get_era(era).title for era in eras},
              "rule": "each stage kept for a class only where it scores strictly higher than the stage before on the "
                      "tuning crops, in decision mode (cellseg.eval.decision)"}
    best = {"run": switches["uniform"]["best_single"], "era": switches["era"]}
    return Decisions(members=members, weights={c: tuple(w) for c, w in weights.items()},
                     classes=class_choices(runs[0].classes, switches, eras), params=stores.params.to_json(),
                     era=switches["era"], eras=eras, inference=inference, tuning=tuning, best_single=best,
                     created=now())
