"""The decisions as a table for the console and docs: one row per class, what it is made of and the tuning score
of the last stage kept (`cellseg decide` prints it)."""

from __future__ import annotations

from cellseg.decide.document import Decisions

ENSEMBLE_TEXT = {"single": "best single", "uniform": "uniform", "fitted": "fitted"}


def _score(value: object) -> str:
    return "–" if value is None else f"{float(value):.4f}"  # type: ignore[arg-type]


def summary(decisions: Decisions) -> str:
    """A markdown table: class, weights, TTA, decoding per era, the tuning score of the choice against what it
    replaced (in the tuning era)."""
    eras = list(decisions.eras)
    head = ["class", "weights", "TTA", *(f"decoding {e}" for e in eras),
            f"tuning score ({decisions.era}), replaced"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, choice in decisions.classes.items():
        stage = choice.stage(decisions.era)
        key = {"postprocess": f"postprocess_{decisions.era}", "tta": "tta", "weighted": "weighted",
               "uniform": "uniform", "single": "uniform"}[stage]
        evidence = choice.evidence.get(key, {})
        shown = evidence.get("replaced" if stage == "single" else "score")
        replaced = "" if stage == "single" else f", {_score(evidence.get('replaced'))}"
        cells = [name, ENSEMBLE_TEXT[choice.ensemble], "on" if choice.tta else "off",
                 *("tuned" if choice.postprocess.get(e) else "plain" for e in eras), _score(shown) + replaced]
        rows.append("| " + " | ".join(cells) + " |")
    members = ", ".join(f"{m.name} ({m.architecture})" for m in decisions.members)
    crops = ", ".join(decisions.tuning.get("crops", []))
    return "\n".join([f"decisions for {members}; tuned on {crops}", "", *rows])
