"""The decisions both ways: ensemble weights fitted and post-processing parameters tuned on the tuning crops,
scored on the model's grid or on each class's annotation grid ("native").

| side | weights (`FitConfig.score_grid`) | parameters (`tune_store(grid=...)`) |
|---|---|---|
| model | "ensemble": the ensemble's 8 nm grid | "model": the store's grid |
| annotation | "annotation": each class's label grid | "annotation": each class's label grid |

Both sides rank candidates in decision mode (`cellseg.eval.crop_score.combine(decision=True)`: a crop the era
skips for too many objects counts as its worst case): neither `fit_weights` nor `tune_store` offers the official
skip rule, so decision mode is common to both and only the grid differs. Both decide in one era
(`DECISION_ERA`, the current one); the rows are scored in both.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DECISION_ERA = "2026"
SIDES = {"model": ("ensemble", "model"), "annotation": ("annotation", "annotation")}  # side → (weights, tuning)


@dataclass(frozen=True)
class Decided:
    """One side's decisions: the weighted ensemble, its parameters, and what was decided on."""

    side: str
    store: Any  # PredictionStore of the weighted ensemble
    params: Any  # ParamSet tuned on it

    def summary(self) -> dict[str, Any]:
        """Weights per class and the tuned parameters, for the JSON."""
        from cellseg.infer.weights import WEIGHTS_FILE

        weights = json.loads((Path(self.store.path) / WEIGHTS_FILE).read_text())
        fit = weights.get("fit", {})
        return {"weights_score_grid": SIDES[self.side][0], "tuning_grid": SIDES[self.side][1],
                "era": DECISION_ERA, "combined": "decision mode",
                "tuning_crops": fit.get("validation_crops"),
                "members": [m.get("path", m) if isinstance(m, dict) else m for m in weights.get("members", [])],
                "weights": {c: r.get("weights") for c, r in fit.get("classes", {}).items()},
                "params": self.params.to_json()["classes"]}


def decide(work: Path, side: str, members: list[Path], root: Path, tuning: list[str]) -> Decided:
    """Fit the weights and tune the parameters of one side on the `tuning` crops (reused when present)."""
    from cellseg.config.inference import EnsembleConfig, FitConfig
    from cellseg.data.prediction_store import PredictionStore
    from cellseg.infer.ensemble import ensemble
    from cellseg.postprocess.params import ParamSet
    from cellseg.postprocess.tuning import tune_store

    score_grid, tuning_grid = SIDES[side]
    out = work / f"ensemble_{side}.zarr"
    if out.is_dir():
        store = PredictionStore.open(out)
    else:
        fit = FitConfig(metric=DECISION_ERA, device="cpu", score_grid=score_grid, truth_root=str(root),
                        crops=",".join(tuning))
        store = ensemble(EnsembleConfig(members=tuple(map(str, members)), weights="auto", fit=fit), out).store
    path = work / f"params_{side}.json"
    if path.is_file():
        return Decided(side, store, ParamSet.load(path))
    params = tune_store(store, root, crops=tuning, era=DECISION_ERA, device="cpu", grid=tuning_grid,
                        progress=False)
    params.save(path)
    return Decided(side, store, params)


def decision_rows(work: Path, members: list[Path], root: Path, tuning: list[str], truth: Path
                  ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Per-crop scores of the three decision rows, and both sides' decisions:

    - `model_grid`: model-grid decisions, decoded on the model grid;
    - `model_grid_native_decoding`: the same decisions decoded on the annotation grid (the decoding alone);
    - `native`: annotation-grid decisions decoded on the annotation grid.
    """
    from bench.studies.native_grids.pipeline import score

    model = decide(work, "model", members, root, tuning)
    native = decide(work, "annotation", members, root, tuning)
    both = score(work, model.store, truth, "model_decisions", params=model.params)
    rows = {"model_grid": both["model"], "model_grid_native_decoding": both["annotation"],
            "native": score(work, native.store, truth, "native", params=native.params,
                            modes=("annotation",))["annotation"]}
    return rows, {"model": model.summary(), "annotation": native.summary()}
