"""decisions.json: every decision of the measured pipeline, made once on tuning crops, for the product commands to
apply (`cellseg predict-ensemble --decisions`, `postprocess --decisions`, `predict-volume --decisions`).

Layout (`"format": "cellseg-decisions"`, `schema_version` 1; docs/decisions.md explains every key):

    {"format": "cellseg-decisions", "schema_version": 1, "created": ISO date, "cellseg_version": "0.1.0",
     "members": [{"name", "run_dir", "architecture", "preset", "checkpoint", "checkpoint_sha256",
                  "voxel_size_nm": [z, y, x], "classes": [...], "channels": [...]}, ...],
     "inference": {"checkpoint": "best", "overlap": 0.5, "tta_transforms": 8},
     "tuning": {"data_root", "crops": [...], "era": "2026", "eras": [...], "metrics": {era: title}, "notes": [...]},
     "best_single": {"run", "ranked_by", "scores": {run: decision score}},
     "weights": {channel: [one weight per member]},
     "classes": {class: {"ensemble": "single" | "uniform" | "fitted", "tta": bool,
                         "postprocess": {era: bool}, "stage": {era: "single" | "uniform" | "weighted" | "tta" |
                         "postprocess"}, "evidence": {switch: {"on", "score", "replaced", ...}}}},
     "postprocess_params": {... `cellseg.postprocess.params` file layout: the tuned parameters ...}}

What a class's prediction is, step by step (each step kept only where it beat the one before on the tuning crops):
the weighted mean of the members' probabilities with `weights` (the best single model alone, the uniform mean or the
fitted weights: `ensemble`), from their 8-transform predictions where `tta` is on (else one pass), decoded with
`postprocess_params` where `postprocess[era]` is on (else the evaluators' plain reading, `p > 0.5` and 26-connected
components). Weights are per channel: a class's `<class>_boundary` channel has its own.

A file is checked against what it is applied to before any prediction (`Decisions.check_runs`): the members' run
directories, checkpoint files (sha256), classes and voxel sizes; a schema version this code does not know is refused.
"""

from __future__ import annotations

import datetime
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cellseg
from cellseg.data.prediction_store import BOUNDARY_SUFFIX
from cellseg.runtime.checkpoint import file_sha256, save_atomic_text

FORMAT = "cellseg-decisions"
SCHEMA_VERSION = 1
ENSEMBLES = ("single", "uniform", "fitted")  # where a class's weights come from, stage 1, 2 or 3
STAGES = ("single", "uniform", "weighted", "tta", "postprocess")  # the report's stage keys, in order


class DecisionsError(ValueError):
    """A decisions file that cannot be applied: unreadable, of an unknown schema, or made for other runs."""


@dataclass(frozen=True, kw_only=True)
class MemberRecord:
    """One run of the ensemble as the decisions were made with it."""

    name: str
    run_dir: str
    architecture: str
    preset: str
    checkpoint: str
    checkpoint_sha256: str
    voxel_size_nm: tuple[float, float, float]
    classes: tuple[str, ...]
    channels: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "run_dir": self.run_dir, "architecture": self.architecture, "preset": self.preset,
                "checkpoint": self.checkpoint, "checkpoint_sha256": self.checkpoint_sha256,
                "voxel_size_nm": list(self.voxel_size_nm), "classes": list(self.classes),
                "channels": list(self.channels)}


@dataclass(frozen=True, kw_only=True)
class ClassChoice:
    """What one class's prediction is made of (module docstring).

    Attributes:
        ensemble: "single" (the best single model alone), "uniform" or "fitted" weights.
        tta: whether its probabilities come from the members' 8-transform predictions.
        postprocess: era → whether the tuned decoding (else the plain one) is applied for that era's leaderboard.
        evidence: switch ("uniform", "weighted", "tta", "postprocess_<era>") → the tuning scores it was decided on.
    """

    ensemble: str
    tta: bool
    postprocess: Mapping[str, bool]
    evidence: Mapping[str, Any] = field(default_factory=dict)

    def stage(self, era: str) -> str:
        """The last stage kept for this class in `era` (`STAGES`)."""
        if self.postprocess.get(era):
            return "postprocess"
        if self.tta:
            return "tta"
        return {"single": "single", "uniform": "uniform", "fitted": "weighted"}[self.ensemble]


@dataclass(frozen=True, kw_only=True)
class Decisions:
    """A decisions file in memory (module docstring); `Decisions.load` reads and checks one."""

    members: tuple[MemberRecord, ...]
    weights: Mapping[str, tuple[float, ...]]
    classes: Mapping[str, ClassChoice]
    params: Mapping[str, Any]  # the `cellseg.postprocess.params` file layout
    era: str  # the era stages 2-4 and the tuned parameters were decided in
    eras: tuple[str, ...]  # the eras with a stage-5 choice
    inference: Mapping[str, Any]
    tuning: Mapping[str, Any] = field(default_factory=dict)
    best_single: Mapping[str, Any] = field(default_factory=dict)
    created: str = ""
    cellseg_version: str = cellseg.__version__
    source: str = ""  # the file it was read from (for messages; not written)

    # ------------------------------------------------------------------------------------------ reading it
    def tta_transforms(self) -> int:
        """The transforms of a TTA class's predictions."""
        return int(self.inference.get("tta_transforms", 8))

    def tta_classes(self) -> list[str]:
        """The classes predicted with TTA, in channel order."""
        return [c for c, choice in self.classes.items() if choice.tta]

    def plain_classes(self, era: str) -> list[str]:
        """The classes decoded plainly for `era`'s leaderboard.

        Raises:
            DecisionsError: no stage-5 choice was made for `era`.
        """
        if era not in self.eras:
            raise DecisionsError(f"{self.where}: no post-processing choice for the {era} metric (it has "
                                 f"{', '.join(self.eras)}); run `cellseg decide --metric all` or pick one of these")
        return [c for c, choice in self.classes.items() if not choice.postprocess.get(era, False)]

    def members_for(self, classes: Sequence[str]) -> list[int]:
        """The members with a positive weight on some channel of `classes` (indices)."""
        wanted = set(classes)
        return sorted({i for ch, w in self.weights.items() if ch.removesuffix(BOUNDARY_SUFFIX) in wanted
                       for i, v in enumerate(w) if v > 0})

    def pass_weights(self, classes: Sequence[str], members: Sequence[int]) -> dict[str, list[float]]:
        """Channel → weights over `members` (in that order) for one prediction pass that serves `classes`: their
        own weights; any other channel (predicted by the same forward passes, then not used) the uniform mean of
        the members that have it."""
        wanted, out = set(classes), {}
        for channel, weights in self.weights.items():
            if channel.removesuffix(BOUNDARY_SUFFIX) in wanted:
                out[channel] = [weights[i] for i in members]
            else:
                having = [i for i in members if channel in self.members[i].channels]
                out[channel] = [1.0 / len(having) if i in having else 0.0 for i in members]
        return out

    @property
    def where(self) -> str:
        return self.source or "decisions"

    # ------------------------------------------------------------------------------------------ checking it
    def check_runs(self, run_dirs: Sequence[str | os.PathLike[str]] | None = None, *, checkpoint: str | None = None
                   ) -> list[Path]:
        """The members' run directories, each checked against the run it now is: the same directory (when
        `run_dirs` are given: the same set), checkpoint file contents (sha256), classes and voxel size.

        Raises:
            DecisionsError: naming the file, the member and what differs.
        """
        from cellseg.decide.inputs import checkpoint_file

        recorded = [Path(m.run_dir).resolve() for m in self.members]
        if run_dirs:
            given = [Path(r).resolve() for r in run_dirs]
            if sorted(map(str, given)) != sorted(map(str, recorded)):
                raise DecisionsError(
                    f"{self.where}: made for the runs {[str(r) for r in recorded]}, but given "
                    f"{[str(r) for r in given]}; give the same runs (or none: the file names them)")
        chosen = checkpoint or str(self.inference.get("checkpoint", "best"))
        for member, run_dir in zip(self.members, recorded, strict=True):
            try:
                ckpt = checkpoint_file(run_dir, chosen)
            except FileNotFoundError as err:
                raise DecisionsError(f"{self.where}: member {member.name}: {err}") from None
            now = {"checkpoint_sha256": file_sha256(ckpt), **run_identity(run_dir)}
            then = {"checkpoint_sha256": member.checkpoint_sha256, "classes": list(member.classes),
                    "channels": list(member.channels), "voxel_size_nm": list(member.voxel_size_nm)}
            differ = [f"{k} {then[k]!r} when decided, {now[k]!r} now" for k in then if then[k] != now[k]]
            if differ:
                what = "; ".join(differ)
                hint = (" (the checkpoint changed since the decisions were made: run `cellseg decide` again)"
                        if "checkpoint_sha256" in what else "")
                raise DecisionsError(f"{self.where}: member {member.name} ({run_dir}, {ckpt.name}): {what}{hint}")
        return recorded

    # ------------------------------------------------------------------------------------------ the file
    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "schema_version": SCHEMA_VERSION, "created": self.created,
                "cellseg_version": self.cellseg_version, "members": [m.to_json() for m in self.members],
                "inference": dict(self.inference), "tuning": {**self.tuning, "era": self.era, "eras": list(self.eras)},
                "best_single": dict(self.best_single), "weights": {c: list(w) for c, w in self.weights.items()},
                "classes": {c: {"ensemble": ch.ensemble, "tta": ch.tta, "postprocess": dict(ch.postprocess),
                                "stage": {e: ch.stage(e) for e in self.eras}, "evidence": _clean(ch.evidence)}
                            for c, ch in self.classes.items()},
                "postprocess_params": dict(self.params)}

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the file atomically (a killed write leaves the previous file or none)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        save_atomic_text(json.dumps(self.to_json(), indent=2) + "\n", path)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Decisions:
        """Read and check a decisions file (a folder: its decisions.json, e.g. an exported ensemble's).

        Raises:
            DecisionsError: not readable, not a decisions file, an unknown schema version, or inconsistent
                (naming the file and the key).
        """
        path = Path(path)
        if path.is_dir():
            path = path / "decisions.json"
        try:
            doc = json.loads(path.read_text())
        except FileNotFoundError:
            raise DecisionsError(f"{path}: no such decisions file (written by `cellseg decide`)") from None
        except (OSError, json.JSONDecodeError, UnicodeDecodeError) as err:
            raise DecisionsError(f"{path}: not a readable decisions file: {err}") from None
        for member in doc.get("members", ()) if isinstance(doc, dict) else ():
            # `cellseg decide` records absolute run directories; an exported ensemble's are relative to the file
            if isinstance(member, dict) and isinstance(member.get("run_dir"), str) \
                    and not Path(member["run_dir"]).is_absolute():
                member["run_dir"] = str(path.parent.resolve() / member["run_dir"])
        return cls.from_json(doc, source=str(path))

    @classmethod
    def from_json(cls, doc: Any, *, source: str = "decisions") -> Decisions:
        """A decisions document, checked (`load`)."""
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise DecisionsError(f"{source}: not a cellseg decisions file (no \"format\": \"{FORMAT}\")")
        version = doc.get("schema_version")
        if version != SCHEMA_VERSION:
            raise DecisionsError(f"{source}: schema_version {version!r}; this cellseg ({cellseg.__version__}) reads "
                                 f"version {SCHEMA_VERSION}: make the decisions again with this version's "
                                 "`cellseg decide`")
        try:
            members = tuple(MemberRecord(
                name=m["name"], run_dir=m["run_dir"], architecture=m["architecture"], preset=m["preset"],
                checkpoint=m["checkpoint"], checkpoint_sha256=m["checkpoint_sha256"],
                voxel_size_nm=tuple(float(v) for v in m["voxel_size_nm"]), classes=tuple(m["classes"]),
                channels=tuple(m["channels"])) for m in doc["members"])
            tuning = dict(doc["tuning"])
            classes = {c: ClassChoice(ensemble=e["ensemble"], tta=bool(e["tta"]),
                                      postprocess={k: bool(v) for k, v in e["postprocess"].items()},
                                      evidence=e.get("evidence", {})) for c, e in doc["classes"].items()}
            out = cls(members=members, weights={c: tuple(float(v) for v in w) for c, w in doc["weights"].items()},
                      classes=classes, params=doc["postprocess_params"], era=tuning.pop("era"),
                      eras=tuple(tuning.pop("eras")), inference=doc["inference"], tuning=tuning,
                      best_single=doc.get("best_single", {}), created=doc.get("created", ""),
                      cellseg_version=doc.get("cellseg_version", ""), source=source)
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise DecisionsError(f"{source}: incomplete or malformed decisions file ({type(err).__name__}: "
                                 f"{err})") from None
        out.check_consistent()
        return out

    def check_consistent(self) -> None:
        """Raise unless the parts agree: at least one member, weights for every member's channel, one per member,
        non-negative with a positive sum, a known ensemble kind per class and a choice for every era.

        Raises:
            DecisionsError: naming the file and the first inconsistency.
        """
        where = self.where
        if not self.members:
            raise DecisionsError(f"{where}: no members")
        channels = dict.fromkeys(ch for m in self.members for ch in m.channels)
        missing = [ch for ch in channels if ch not in self.weights]
        if missing:
            raise DecisionsError(f"{where}: no weights for channels {missing}")
        for channel, weights in self.weights.items():
            if len(weights) != len(self.members):
                raise DecisionsError(f"{where}: weights of {channel}: {len(weights)} values for "
                                     f"{len(self.members)} members")
            if any(not math.isfinite(w) or w < 0 for w in weights) or sum(weights) <= 0:
                raise DecisionsError(f"{where}: weights of {channel} {list(weights)}: need non-negative numbers "
                                     "with a positive sum")
        for name, choice in self.classes.items():
            if choice.ensemble not in ENSEMBLES:
                raise DecisionsError(f"{where}: class {name}: ensemble {choice.ensemble!r}, expected one of "
                                     f"{ENSEMBLES}")
            lacking = [e for e in self.eras if e not in choice.postprocess]
            if lacking:
                raise DecisionsError(f"{where}: class {name}: no post-processing choice for {lacking}")
        if self.era not in self.eras:
            raise DecisionsError(f"{where}: the tuning era {self.era} is not among its eras {list(self.eras)}")


def run_identity(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """What a run directory says it predicts: its classes and output channels (meta.json) and voxel size (nm)."""
    from cellseg.config import load_run_config

    run_dir = Path(run_dir)
    cfg = load_run_config(run_dir / "config.yaml")
    meta = json.loads((run_dir / "meta.json").read_text())
    channels = list(meta["channels"])
    return {"classes": [c for c in channels if c in cfg.data.classes], "channels": channels,
            "voxel_size_nm": [float(v) for v in cfg.data.voxel_size_nm]}


def member_record(name: str, run_dir: Path, checkpoint: Path) -> MemberRecord:
    """A run as the decisions are made with it (its checkpoint hashed)."""
    from cellseg.config import load_run_config

    cfg = load_run_config(run_dir / "config.yaml")
    ident = run_identity(run_dir)
    return MemberRecord(name=name, run_dir=str(run_dir.resolve()), architecture=cfg.model.name,
                        preset=cfg.model.preset, checkpoint=str(checkpoint.resolve()),
                        checkpoint_sha256=file_sha256(checkpoint), voxel_size_nm=tuple(ident["voxel_size_nm"]),
                        classes=tuple(ident["classes"]), channels=tuple(ident["channels"]))


def now() -> str:
    """The current time, for `created`."""
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def _clean(value: Any) -> Any:
    """JSON-ready: non-finite floats as null, tuples as lists."""
    if isinstance(value, Mapping):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
