"""What the product commands do with a decisions file (`cellseg.decide.document`): the probabilities and the
decoding the measured pipeline chose, class by class, for crops without truth.

- `predict_decided` (`cellseg predict-ensemble --decisions`, `cellseg predict --decisions`): at most two passes over
  the crops, each by the members that carry weight for its classes: the classes with TTA from the members'
  8-transform predictions, the others from one pass, each pass a weighted mean with the decided weights
  (`cellseg.infer.fused`; one member: `cellseg.infer.predict`), then one store, class by class
  (`cellseg.infer.merge.merge_classes`). The passes are kept beside the output (`OUT.parts/`) until it is complete,
  so a killed job resumes where it stopped.
- `postprocess_decided` (`cellseg postprocess --decisions`): the tuned parameters for the classes whose
  post-processing was kept in the chosen era, the plain decoding for the others
  (`cellseg.postprocess.apply.postprocess_store` with `plain`).

The result equals the report's stage 5 on the same crops (tested): the same weighted means (the fused pass equals
`cellseg predict` + `cellseg ensemble` bit for bit, and a member alone at weight 1 is its own store), the same
per-class merge, the same decoding.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cellseg.data.prediction_store import PredictionStore
from cellseg.decide.document import Decisions, DecisionsError, file_sha256
from cellseg.runtime.checkpoint import save_atomic_text

if TYPE_CHECKING:
    from cellseg.config.inference import InferConfig

log = logging.getLogger(__name__)
PARTS_SUFFIX = ".parts"  # OUT.parts/: the passes of `predict_decided` until OUT is complete


def applied(decisions: Decisions, **extra: Any) -> dict[str, Any]:
    """What a store records of the decisions it applied (`"decisions"` in its provenance)."""
    source = decisions.source
    digest = file_sha256(source) if source and Path(source).is_file() else None
    return {"file": str(Path(source).resolve()) if source else None, "sha256": digest, "era": decisions.era, **extra}


def check_inference(decisions: Decisions, opts: InferConfig) -> None:
    """Log where the inference settings differ from those the decisions were measured with (allowed: a user may
    trade accuracy for time, e.g. a smaller overlap on a whole cell; the decisions then were not measured so)."""
    measured = {"overlap": decisions.inference.get("overlap"), "blend": decisions.inference.get("blend"),
                "checkpoint": decisions.inference.get("checkpoint")}
    now = {"overlap": opts.overlap, "blend": opts.blend, "checkpoint": opts.checkpoint}
    differ = {k: (v, now[k]) for k, v in measured.items() if v is not None and v != now[k]}
    if differ:
        log.warning("%s: predicting with %s; the decisions were measured with %s", decisions.where,
                    ", ".join(f"{k}={b!r}" for k, (_, b) in differ.items()),
                    ", ".join(f"{k}={a!r}" for k, (a, _) in differ.items()))


def _write_weights(decisions: Decisions, members: Sequence[int], classes: Sequence[str], path: Path) -> Path:
    """A weights file (`cellseg.infer.weights` layout) for one pass of `members` serving `classes`."""
    doc = {"method": "decisions", "channels": decisions.pass_weights(classes, members),
           "members": [{"run_dir": decisions.members[i].run_dir, "name": decisions.members[i].name}
                       for i in members], "decisions": applied(decisions)}
    path.parent.mkdir(parents=True, exist_ok=True)
    save_atomic_text(json.dumps(doc, indent=2) + "\n", path)
    return path


def _one_pass(decisions: Decisions, classes: Sequence[str], tta: int, crops: str, out: Path,
              opts: InferConfig) -> PredictionStore:
    """The weighted mean of the members that carry weight for `classes`, each predicting with `tta` transforms,
    into `out` (every channel is written; only those of `classes` are used)."""
    members = decisions.members_for(classes)
    runs = [decisions.members[i].run_dir for i in members]
    opts = replace(opts, tta=tta)
    log.info("%d classes with %d transform(s): %s, by %s", len(classes), tta, ", ".join(classes),
             ", ".join(decisions.members[i].name for i in members))
    if len(members) == 1:  # the weighted mean of one member at weight 1 is its own prediction
        from cellseg.infer.predict import predict_run

        predict_run(runs[0], crops, out, opts)
    else:
        from cellseg.infer.fused import predict_ensemble

        weights = _write_weights(decisions, members, classes, out.with_name(f"{out.stem}.weights.json"))
        predict_ensemble(runs, crops, out, weights=str(weights), opts=opts)
    return PredictionStore.open(out)


def predict_decided(decisions: Decisions, crops: str, out: str | os.PathLike[str], opts: InferConfig
                    ) -> PredictionStore:
    """Predict `crops` ("val", "test" or ids) as the decisions say (module docstring) into the probability store
    `out`; crops already in `out` are kept.

    Raises:
        DecisionsError: the members' runs no longer match the file (`Decisions.check_runs`), checked first.
        ValueError: `out` holds another store.
    """
    decisions.check_runs(checkpoint=opts.checkpoint)
    check_inference(decisions, opts)
    out = Path(out)
    with_tta = decisions.tta_classes()
    without = [c for c in decisions.classes if c not in with_tta]
    passes = [(decisions.tta_transforms(), with_tta), (1, without)]
    passes = [(tta, classes) for tta, classes in passes if classes]
    if len(passes) == 1:  # every class the same way: straight into `out`
        tta, classes = passes[0]
        return _one_pass(decisions, classes, tta, crops, out, opts)
    parts = out.with_name(out.name + PARTS_SUFFIX)
    stores = [_one_pass(decisions, classes, tta, crops, parts / f"tta{tta}.zarr", opts) for tta, classes in passes]
    from cellseg.infer.merge import merge_classes

    names = [c for c in stores[0].completed() if c in stores[1]]
    merged = merge_classes(stores, dict.fromkeys(without, 1), out, crops=names)
    log.info("%s: %d crops, TTA for %s, one pass for %s", out, len(merged.completed()), ", ".join(with_tta),
             ", ".join(without))
    shutil.rmtree(parts)  # this command's own passes, complete in `out` now
    return merged


def postprocess_decided(decisions: Decisions, pred: PredictionStore, out: str | os.PathLike[str], *, era: str,
                        device: str = "auto", overwrite: bool = False, progress: bool = True,
                        data_root: str | None = None) -> PredictionStore:
    """Decode `pred` as the decisions say for `era`'s leaderboard (module docstring) into the segmentation store
    `out`.

    Raises:
        DecisionsError: no choice for `era`, or `pred`'s classes are not the decisions' classes.
    """
    from cellseg.postprocess.apply import postprocess_store
    from cellseg.postprocess.params import ParamSet

    plain = decisions.plain_classes(era)
    if sorted(pred.classes) != sorted(decisions.classes):
        raise DecisionsError(f"{decisions.where}: decided for the classes {sorted(decisions.classes)}, but "
                             f"{pred.path} holds {sorted(pred.classes)}")
    params = ParamSet.from_json(decisions.params, source=decisions.where)
    log.info("post-processing for the %s metric: tuned for %s; plain (p > 0.5) for %s", era,
             ", ".join(c for c in decisions.classes if c not in plain) or "no class", ", ".join(plain) or "no class")
    return postprocess_store(pred, out, params=params, device=device, overwrite=overwrite, progress=progress,
                             data_root=data_root, plain=plain, provenance={"decisions": applied(decisions, era=era)})
