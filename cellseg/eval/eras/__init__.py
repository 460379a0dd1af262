"""Scoring eras as files: each module of this package holds the rules of one era of the official scorer.

An era module defines `ERA`, an instance of a `ScoringEra` subclass; the registry is every module found in
this package (`pkgutil`, as `cellseg.cli` finds its sub-commands), so adding an era is adding one module
here (docs/scoring.md, "Adding an era"). What an era decides:

- how a submitted array is brought onto the truth grid (`align`, with `copy_length_bug` and
  `repairs_layout` describing its loader for the submission validator and folder discovery);
- the per-crop scores of a semantic label, from a (prediction, truth) pair or from confusion counts;
- the per-crop scores of an instance label, from the 26-connected components of the prediction;
- the scores of a label the submission lacks;
- how per-crop scores combine into class and overall scores;
- which per-crop scores its combining leaves out (`is_skipped`) and what such a crop counts as when cellseg
  makes a decision (`worst_case`, `combine_decision`: the *decision mode*, docs/scoring.md);
- its title and the columns of its tables.

Everything outside this package names an era by its string (`Era`) and asks `get_era(name)` for its rules, and
takes the names it offers (command-line choices, config checks, the eras a report scores) from `registry()`;
which labels take the instance branch is the same official rule in every era
(`cellseg.eval.rules.is_scored_as_instance`). The era that commands and configs default to is
`cellseg.config.fields.DEFAULT_ERA`.
"""

from __future__ import annotations

import abc
import functools
import importlib
import pkgutil
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from cellseg.data.crops import CURRENT_TEST_VERSION
from cellseg.eval.aggregate import CropScores
from cellseg.eval.semantic import confusion

if TYPE_CHECKING:
    from cellseg.eval.resample import Aligned, Target

Era = str  # the name of a registered era, e.g. "2026"
Scores = dict[str, Any]  # metric name -> value, the official key names
__all__ = ["ERAS", "ERA_TITLES", "CropScores", "Era", "Scores", "ScoringEra", "get_era", "registry"]


class ScoringEra(abc.ABC):
    """The rules of one era of the official scorer (one module of `cellseg.eval.eras` each).

    Attributes:
        name: the era's name, as users give it (`--metric 2026`, `val.metric`).
        title: how tables and figures name it ("2026 metric (official code at 6b9ad68)").
        repairs_layout: its loader repairs a store zipped inside a folder, bare crop numbers and crop
            folders without `.zgroup` (else it rejects them and reads crop folders at the root only).
        copy_length_bug: its loader drops the last voxels of a prediction smaller than the crop that
            starts inside it (docs/scoring.md quirk 11); `align` must agree, the submission validator reads
            the flag.
        class_columns: per kind ("instance", "semantic"), the class-score keys a table shows.
        crop_columns: per kind, the per-crop keys a table shows.
        skip_statuses: per-crop `status` values its combining leaves out (the crop counts for nothing).
        test_manifest: the version of the packaged test crop manifest its leaderboard scores
            (`cellseg.data.crops.TEST_MANIFESTS`; default the current one): what `cellseg submit --metric`
            writes a submission for.

    Example:
        >>> era = get_era("2026")
        >>> era.semantic_from_counts(3, 1, 0)
        {'tp': 3, 'fp': 1, 'fn': 0, 'status': 'scored'}
    """

    name: ClassVar[str]
    title: ClassVar[str]
    repairs_layout: ClassVar[bool]
    copy_length_bug: ClassVar[bool]
    class_columns: ClassVar[Mapping[str, tuple[str, ...]]]
    crop_columns: ClassVar[Mapping[str, tuple[str, ...]]]
    skip_statuses: ClassVar[frozenset[str]] = frozenset()
    test_manifest: ClassVar[str] = CURRENT_TEST_VERSION

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.skip_statuses and cls.worst_case is ScoringEra.worst_case:
            raise TypeError(f"scoring era {cls.__name__} skips crops ({sorted(cls.skip_statuses)}) but does not "
                            "define worst_case: decisions would have nothing to count a skipped crop as")

    def __repr__(self) -> str:
        return f"<scoring era {self.name!r}: {self.title}>"

    @abc.abstractmethod
    def align(self, array: Any, attrs: dict[str, Any], *, instance: bool, target: Target) -> Aligned:
        """A submitted (z, y, x) array (numpy or zarr, read lazily) brought onto the truth grid.

        Raises:
            BadAttributes: voxel size / translation attributes it cannot use, or an array that is not 3-D.
        """

    @abc.abstractmethod
    def semantic_from_counts(self, tp: int, fp: int, fn: int) -> Scores:
        """Per-crop semantic scores from the voxel counts of `pred > 0` against `truth > 0`."""

    def score_semantic(self, pred: np.ndarray, truth: np.ndarray) -> Scores:
        """Per-crop semantic scores of a prediction against its truth (same grid; `> 0` is foreground)."""
        return self.semantic_from_counts(*confusion(pred, truth))

    @abc.abstractmethod
    def score_instance(self, pred_cc: np.ndarray, num_pred: int, truth: np.ndarray,
                       voxel_size_nm: Sequence[float], *, max_bytes: int | None = None) -> Scores:
        """Per-crop instance scores of a prediction already relabelled by `relabel_26` into components
        1..`num_pred`, against truth object ids (0: background) on the same grid.

        Raises:
            MatrixTooLarge: the era's matching would need more than `max_bytes` of memory.
        """

    def truth_failure(self, truth: np.ndarray) -> str | None:
        """Why this era's official evaluator fails on an instance truth (None: it does not)."""
        return None

    @abc.abstractmethod
    def score_missing(self, *, instance: bool, num_voxels: int,
                      truth: Callable[[], np.ndarray] | None) -> Scores:
        """Per-crop scores of a label the submission lacks; `truth` reads its truth ids when the era
        needs them (None: not available, counted as no object)."""

    @abc.abstractmethod
    def combine(self, crop_scores: CropScores) -> Scores:
        """Class and overall scores from per-crop scores (each with `num_voxels` and `voxel_size`):
        `{"label_scores", "overall_instance_score", "overall_semantic_score", "overall_score"}`."""

    def is_skipped(self, scores: Mapping[str, Any]) -> bool:
        """True when `combine` leaves these per-crop scores out (their `status` is a skip status)."""
        return scores.get("status") in self.skip_statuses

    def worst_case(self, scores: Mapping[str, Any]) -> Scores:
        """What a skipped crop counts as in a decision: no match, every truth object missed and every
        predicted object a false positive (only called where `is_skipped`). An era that skips crops defines
        it (checked when its class is defined); one that skips none never has a crop to count, and this one
        returns the scores as they are."""
        return dict(scores)

    def combine_decision(self, crop_scores: CropScores) -> Scores:
        """`combine` with every skipped crop counted as its `worst_case`: the score cellseg ranks
        checkpoints, ensemble weights and post-processing settings by, which a prediction cannot raise by
        getting a poor crop skipped (shattering it into more objects than the era's cutoff)."""
        return self.combine({crop: {label: self.worst_case(s) if self.is_skipped(s) else s
                                    for label, s in labels.items()}
                             for crop, labels in crop_scores.items()})

    def skipped(self, crop_scores: CropScores) -> list[tuple[str, str]]:
        """(crop, label) of every per-crop score `combine` leaves out, in sorted order."""
        return [(crop, label) for crop in sorted(crop_scores) for label in sorted(crop_scores[crop])
                if self.is_skipped(crop_scores[crop][label])]


@functools.cache
def registry() -> Mapping[str, ScoringEra]:
    """Every era of this package, by name in sorted order (each module defines `ERA`).

    Raises:
        ValueError: a module without a `ScoringEra` named `ERA`, or two eras of one name.
    """
    eras: dict[str, ScoringEra] = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        era = getattr(module, "ERA", None)
        if not isinstance(era, ScoringEra):
            raise ValueError(f"{module.__file__}: an era module must define ERA, an instance of ScoringEra")
        if era.name in eras:
            raise ValueError(f"{module.__file__}: era {era.name!r} is already defined by another module")
        eras[era.name] = era
    return dict(sorted(eras.items()))


def get_era(name: Era | ScoringEra) -> ScoringEra:
    """The rules of the era called `name` (an era is returned as it is).

    Raises:
        ValueError: no era of that name is registered.
    """
    if isinstance(name, ScoringEra):
        return name
    eras = registry()
    if name not in eras:
        raise ValueError(f"unknown scoring era {name!r}; registered eras: {', '.join(eras)}")
    return eras[name]


# Names and titles of the eras registered at import (for argument choices and labels).
ERAS: tuple[Era, ...] = tuple(registry())
ERA_TITLES: dict[Era, str] = {name: era.title for name, era in registry().items()}
