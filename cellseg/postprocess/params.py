"""Per-class post-processing parameters and the JSON file that holds them (written by `tune`, read by
`cellseg postprocess --params`).

File layout (`"format": "cellseg-postprocess-params"`, version 2):

    {"format": "cellseg-postprocess-params", "version": 2,
     "era": "2026",                                   # metric the scores refer to (null if untuned)
     "tuned_on": {"data_root": ..., "crops": [...]},   # provenance (free form)
     "classes": {
        "mito": {"kind": "instance", "threshold": 0.5, "boundary_threshold": 0.5, "use_boundary": true,
                 "seed_distance_nm": 16.0, "min_size_nm3": 32000.0, "fill_holes": true,
                 "hierarchy": "union", "score": 0.91, "default_score": 0.88,
                 "hierarchy_off_score": 0.90, "hierarchy_on_score": 0.91},
        "er":   {"kind": "semantic", "threshold": 0.4, "min_size_nm3": 0.0, "fill_holes": false,
                 "hierarchy": null, "score": 0.63, "default_score": 0.61}}}

`score` is the validation score the parameters achieved (class IoU for semantic classes, class combined
score for instance classes, in `era`), `default_score` that of the defaults on the same crops. `hierarchy` is
the class's hierarchy option (`cellseg.postprocess.hierarchy`: "union" for a group, "argmax" for an atom, null
for none); `hierarchy_off_score` / `hierarchy_on_score` are the scores without and with it where tuning tried
it. `positive_crops` / `crops` count the tuning crops with the class's foreground (the only ones it was tuned on)
and all of them: with no positive crop the defaults stand and `score` is null. Instance classes also record the
chosen setting's `objects` and `foreground_voxels` beside the truth's (`truth_objects`, `truth_voxels`), how many
candidate settings were `rejected` as degenerate, and whether the chosen one is `bounded`
(`cellseg.postprocess.tune`). Version 1 files (no hierarchy) still load, every option off.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cellseg.classes import get_class, is_instance
from cellseg.postprocess.hierarchy import OPTIONS, check_option
from cellseg.postprocess.spec import float32_threshold

FORMAT = "cellseg-postprocess-params"
VERSION = 2
READABLE_VERSIONS = (1, 2)
# what tuning measured beside the parameters: scores, the crops it decided on, the chosen setting's objects
SCORE_KEYS = ("score", "default_score", "hierarchy_off_score", "hierarchy_on_score", "positive_crops", "crops",
              "objects", "truth_objects", "foreground_voxels", "truth_voxels", "rejected", "bounded")


@dataclass(frozen=True, kw_only=True)
class SemanticParams:
    """A semantic class: `probability > threshold`, then optional hole filling and small-component removal."""

    threshold: float = 0.5
    min_size_nm3: float = 0.0  # 26-connected components smaller than this are removed (0: keep all)
    fill_holes: bool = False  # fill background pockets (6-connected) that do not touch the crop border
    hierarchy: str | None = None  # "union" (groups) or "argmax" (atoms): `cellseg.postprocess.hierarchy`

    kind = "semantic"

    def __post_init__(self) -> None:
        float32_threshold(self.threshold)
        _check_hierarchy(self.hierarchy)
        if not self.min_size_nm3 >= 0:
            raise ValueError(f"min_size_nm3 must be ≥ 0, got {self.min_size_nm3}")


@dataclass(frozen=True, kw_only=True)
class InstanceParams:
    """An instance class: seeds from the distance transform and/or the boundary channel, seeded growth,
    hole filling, small-object removal (the algorithm is in `cellseg.postprocess.instances`)."""

    threshold: float = 0.5
    boundary_threshold: float = 0.5
    use_boundary: bool = True  # use the `<class>_boundary` channel when the store has one
    seed_distance_nm: float = 0.0  # seeds lie farther than this from the object's edge (0: the whole core)
    min_size_nm3: float = 0.0  # objects smaller than this are removed (0: keep all)
    fill_holes: bool = True
    hierarchy: str | None = None  # "union" (groups) or "argmax" (atoms): `cellseg.postprocess.hierarchy`

    kind = "instance"

    def __post_init__(self) -> None:
        float32_threshold(self.threshold)
        _check_hierarchy(self.hierarchy)
        float32_threshold(self.boundary_threshold, name="boundary_threshold")
        for name in ("seed_distance_nm", "min_size_nm3"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be ≥ 0, got {getattr(self, name)}")


ClassParams = SemanticParams | InstanceParams


def _check_hierarchy(option: str | None) -> None:
    if option is not None and option not in OPTIONS:
        raise ValueError(f"hierarchy must be null or one of {OPTIONS}, got {option!r}")


def default_params(class_name: str) -> ClassParams:
    """The defaults of a class: instance or semantic as the challenge scores it."""
    return InstanceParams() if is_instance(class_name) else SemanticParams()


@dataclass(frozen=True)
class ParamSet:
    """Parameters of several classes plus their validation scores.

    Example:
        >>> ps = ParamSet({"mito": InstanceParams(seed_distance_nm=16.0)})
        >>> ps.get("mito").seed_distance_nm, ps.get("er").threshold
        (16.0, 0.5)
    """

    classes: Mapping[str, ClassParams] = field(default_factory=dict)
    scores: Mapping[str, Mapping[str, float | None]] = field(default_factory=dict)
    era: str | None = None
    tuned_on: Mapping[str, Any] = field(default_factory=dict)
    source: str = ""  # the file it was loaded from (for messages; not written)

    def get(self, class_name: str) -> ClassParams:
        """The parameters of a class (its defaults when the set does not name it)."""
        return self.classes.get(class_name) or default_params(class_name)

    def check_classes(self, available: Sequence[str], *, store: str) -> None:
        """Every class named here must be one of `available`, the classes of `store` (being processed).

        Raises:
            ValueError: naming the parameter file, the unknown classes, the store and its classes; or a hierarchy
                option the class cannot take.
        """
        unknown = sorted(set(self.classes) - set(available))
        if unknown:
            raise ValueError(f"{self.source or 'parameters'}: classes {unknown} are not classes of {store} "
                             f"(its classes are {list(available)})")
        for name, p in self.classes.items():
            try:
                check_option(name, p.hierarchy)
            except ValueError as err:
                raise ValueError(f"{self.source or 'parameters'}: {err}") from err

    def to_json(self) -> dict[str, Any]:
        """The JSON document (see the module docstring)."""
        classes = {}
        for name in sorted(self.classes):
            p = self.classes[name]
            classes[name] = {"kind": p.kind, **dataclasses.asdict(p), **dict(self.scores.get(name, {}))}
        return {"format": FORMAT, "version": VERSION, "era": self.era, "tuned_on": dict(self.tuned_on),
                "classes": classes}

    def save(self, path: str | os.PathLike[str], *, overwrite: bool = False) -> Path:
        """Write the JSON file atomically (temp + rename).

        Raises:
            FileExistsError: `path` exists and `overwrite` is not set.
        """
        path = Path(path)
        if path.exists() and not overwrite:
            raise FileExistsError(f"{path} exists (use --overwrite to replace it)")
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=2) + "\n")
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> ParamSet:
        """Read and validate a parameter file.

        Raises:
            FileNotFoundError: no such file.
            ValueError: not a parameter file, an unknown class name, a kind that contradicts the class,
                unknown or ill-typed keys; the message names the file and the class.
        """
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such parameter file")
        try:
            doc = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: not JSON ({err})") from err
        return cls.from_json(doc, source=str(path))

    @classmethod
    def from_json(cls, doc: Any, *, source: str) -> ParamSet:
        """A parameter document (`to_json`), validated as `load` validates a file; `source` names it in errors.

        Raises:
            ValueError: as `load`.
        """
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise ValueError(f"{source}: not a cellseg post-processing parameter file (no \"format\": \"{FORMAT}\")")
        if doc.get("version") not in READABLE_VERSIONS:
            raise ValueError(f"{source}: version {doc.get('version')!r} is not supported (expected one of "
                             f"{READABLE_VERSIONS})")
        classes, scores = {}, {}
        for name, entry in dict(doc.get("classes") or {}).items():
            classes[name], scores[name] = _parse_class(source, name, entry)
        return cls(classes=classes, scores=scores, era=doc.get("era"), tuned_on=dict(doc.get("tuned_on") or {}),
                   source=source)


def _parse_class(path: Path | str, name: str, entry: Any) -> tuple[ClassParams, dict[str, float | None]]:
    where = f"{path}: class {name!r}"
    try:
        get_class(name)
    except (KeyError, ValueError) as err:
        raise ValueError(f"{where}: {err}") from err
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: expected an object of parameters, got {type(entry).__name__}")
    entry = dict(entry)
    expected = "instance" if is_instance(name) else "semantic"
    kind = entry.pop("kind", expected)
    if kind != expected:
        raise ValueError(f"{where}: kind {kind!r}, but the challenge scores {name} as {expected}")
    scores = {k: entry.pop(k) for k in SCORE_KEYS if k in entry}
    kind_cls = InstanceParams if expected == "instance" else SemanticParams
    allowed = {f.name: f.type for f in dataclasses.fields(kind_cls)}
    unknown = sorted(set(entry) - set(allowed))
    if unknown:
        raise ValueError(f"{where}: unknown keys {unknown} (valid for {expected} classes: {sorted(allowed)})")
    hierarchy = entry.pop("hierarchy", None)
    try:
        check_option(name, hierarchy)
    except ValueError as err:
        raise ValueError(f"{where}: {err}") from err
    for key, value in entry.items():
        want_bool = allowed[key] in ("bool", bool)
        if want_bool != isinstance(value, bool) or not isinstance(value, bool | int | float):
            raise ValueError(f"{where}: {key} must be {'true/false' if want_bool else 'a number'}, got {value!r}")
    try:
        return kind_cls(**entry, hierarchy=hierarchy), scores
    except ValueError as err:
        raise ValueError(f"{where}: {err}") from err
