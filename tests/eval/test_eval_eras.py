"""Eras as files: the registry, the one scoring path, and a third era added as one module file."""

from __future__ import annotations

import sys
import textwrap

import numpy as np
import pytest
from crop_scores import (
    score_instance_2025,
    score_instance_2026,
    score_instance_2026_07,
    score_semantic_2025,
    score_semantic_2026,
)
from eval_helpers import THREE_BALLS, VS8, balls

from cellseg.eval import eras, evaluate
from cellseg.eval.crop_score import combine, score_class, score_missing, semantic_from_counts
from cellseg.eval.eras import ERA_TITLES, ERAS, ScoringEra, get_era
from cellseg.eval.report import format_table, to_json

OFFICIAL = {"2025": (score_semantic_2025, score_instance_2025), "2026": (score_semantic_2026, score_instance_2026),
            "2026-07": (score_semantic_2026, score_instance_2026_07)}  # 2026-07: reconstructed, not official code

# A whole era in one file: Dice of pooled voxel counts for masks, F1 of "hit" objects for instances.
TOY_ERA = textwrap.dedent('''
    """A toy era: pooled Dice (semantic) and pooled F1 of hit objects (instance), plain means overall."""

    import numpy as np

    from cellseg.eval.eras import ScoringEra
    from cellseg.eval.resample import align_2026
    from cellseg.eval.rules import is_scored_as_instance


    def _counts(scores, label):
        return [sum(s[label][k] for s in scores.values() if label in s) for k in ("tp", "fp", "fn")]


    class ToyEra(ScoringEra):
        name = "toy"
        title = "toy Dice metric"
        repairs_layout = True
        copy_length_bug = False
        class_columns = {"instance": ("f1", "tp", "fp", "fn"), "semantic": ("dice", "tp", "fp", "fn")}
        crop_columns = {"instance": ("tp", "fp", "fn"), "semantic": ("tp", "fp", "fn")}

        def align(self, array, attrs, *, instance, target):
            return align_2026(array, attrs, instance=instance, target=target)

        def semantic_from_counts(self, tp, fp, fn):
            return {"tp": tp, "fp": fp, "fn": fn}

        def score_instance(self, pred_cc, num_pred, truth, voxel_size_nm, *, max_bytes=None):
            hit = np.unique(truth[(pred_cc > 0) & (truth > 0)])
            used = np.unique(pred_cc[(pred_cc > 0) & (truth > 0)])
            return {"tp": int(hit.size), "fp": num_pred - int(used.size),
                    "fn": int(np.count_nonzero(np.unique(truth))) - int(hit.size)}

        def score_missing(self, *, instance, num_voxels, truth):
            values = truth()
            fn = int(np.count_nonzero(np.unique(values))) if instance else int(np.count_nonzero(values))
            return {"tp": 0, "fp": 0, "fn": fn}

        def combine(self, crop_scores):
            labels = sorted({label for scores in crop_scores.values() for label in scores})
            label_scores = {}
            for label in labels:
                tp, fp, fn = _counts(crop_scores, label)
                key = "f1" if is_scored_as_instance(label) else "dice"
                label_scores[label] = {key: 2 * tp / (2 * tp + fp + fn), "tp": tp, "fp": fp, "fn": fn}
            instance = [s["f1"] for s in label_scores.values() if "f1" in s]
            semantic = [s["dice"] for s in label_scores.values() if "dice" in s]
            overall_instance, overall_semantic = float(np.mean(instance)), float(np.mean(semantic))
            return {"label_scores": label_scores, "overall_instance_score": overall_instance,
                    "overall_semantic_score": overall_semantic,
                    "overall_score": (overall_instance + overall_semantic) / 2}


    ERA = ToyEra()
''')


@pytest.fixture
def toy_era(tmp_path, monkeypatch):
    """The toy era, registered by putting its one file into a folder of the package's search path."""
    folder = tmp_path / "more_eras"
    folder.mkdir()
    (folder / "era_toy.py").write_text(TOY_ERA)
    monkeypatch.setattr(eras, "__path__", [*eras.__path__, str(folder)])
    eras.registry.cache_clear()
    yield get_era("toy")
    eras.registry.cache_clear()
    sys.modules.pop("cellseg.eval.eras.era_toy", None)


def test_the_registry_holds_both_official_eras_and_the_reconstruction():
    assert ERAS == ("2025", "2026", "2026-07")
    assert ERA_TITLES == {"2025": "2025 challenge-era metric", "2026": "2026 metric (official code at 6b9ad68)",
                          "2026-07": "2026-07 leaderboard metric (reconstructed)"}
    for name in ERAS:
        era = get_era(name)
        assert isinstance(era, ScoringEra) and era.name == name and get_era(era) is era
        assert set(era.class_columns) == set(era.crop_columns) == {"instance", "semantic"}
    assert get_era("2025").copy_length_bug and not get_era("2026").copy_length_bug
    assert get_era("2026").repairs_layout and not get_era("2025").repairs_layout
    with pytest.raises(ValueError, match="unknown scoring era '2027'; registered eras: 2025, 2026, 2026-07"):
        get_era("2027")


@pytest.mark.parametrize("era", ERAS)
def test_score_class_is_the_official_scorer_of_the_era(era, three_balls):
    """The official scores, plus the truth's foreground voxels that decisions read (`cellseg.eval.presence`)."""
    semantic, instance = OFFICIAL[era]
    pred = balls(three_balls.shape, [((12, 12, 13), 5), ((30, 30, 14), 4)])
    truth_voxels = {"truth_voxels": int(np.count_nonzero(three_balls))}
    assert score_class(pred, three_balls, label="mito", era=era, voxel_size_nm=VS8) == \
        {**instance(pred, three_balls, VS8), **truth_voxels}
    assert score_class(pred > 0, three_balls > 0, label="er", era=era, voxel_size_nm=VS8) == \
        {**semantic(pred > 0, three_balls > 0), **truth_voxels}
    tp = int(np.count_nonzero((pred > 0) & (three_balls > 0)))
    fp, fn = int(np.count_nonzero(pred)) - tp, int(np.count_nonzero(three_balls)) - tp
    assert semantic_from_counts(tp, fp, fn, era) == {**semantic(pred > 0, three_balls > 0), **truth_voxels}
    missing = score_missing(label="mito", era=era, num_voxels=three_balls.size, truth=lambda: three_balls)
    assert missing == get_era(era).score_missing(instance=True, num_voxels=three_balls.size, truth=lambda: three_balls)


def test_missing_scores_follow_each_era(three_balls):
    assert score_missing(label="er", era="2025", num_voxels=10) == {"iou": 0, "dice_score": 0}
    assert score_missing(label="er", era="2026", num_voxels=10) == {"tp": 0, "fp": 0, "fn": 10, "status": "missing"}
    assert score_missing(label="mito", era="2026", num_voxels=10, truth=lambda: three_balls)["n_hausdorff"] == 3
    assert score_missing(label="mito", era="2025", num_voxels=10)["combined_score"] == 0


def test_a_third_era_is_one_module_file(toy_era, stores):
    """The toy era scores a real evaluation end to end: registry, alignment, per-crop scores, combining,
    missing labels (with their truth read) and the report."""
    assert toy_era.name == "toy" and "toy" in eras.registry()
    mito1 = balls((48, 48, 48), THREE_BALLS)
    mito2 = balls((48, 48, 48), [((20, 20, 20), 6)])
    er1 = balls((48, 48, 48), [((24, 24, 24), 9)], dtype=np.uint8) > 0
    er2 = balls((48, 48, 48), [((10, 30, 20), 4)], dtype=np.uint8) > 0
    truth = stores.truth({"crop1": {"mito": mito1, "er": er1.astype(np.uint8)},
                          "crop2": {"mito": mito2, "er": er2.astype(np.uint8)}})
    er_pred = er1.copy()
    er_pred[:2] = True  # 2 × 48 × 48 false positives
    sub = stores.submission({"crop1": {"mito": np.where(mito1 == 3, 0, mito1).astype(np.uint16),  # a ball lost
                                       "er": er_pred.astype(np.uint8)}})
    ev = evaluate(sub, truth, metric="toy")
    mito, er = ev.label_scores["mito"], ev.label_scores["er"]
    assert (mito["tp"], mito["fp"], mito["fn"]) == (2, 0, 1 + 1)  # crop2 is missing: its ball is a false negative
    assert mito["f1"] == pytest.approx(4 / 6)
    tp, fp, fn = int(er1.sum()), 2 * 48 * 48 - int(er1[:2].sum()), int(er2.sum())
    assert (er["tp"], er["fp"], er["fn"]) == (tp, fp, fn)
    assert er["dice"] == pytest.approx(2 * tp / (2 * tp + fp + fn))
    assert ev.overall_score == pytest.approx((mito["f1"] + er["dice"]) / 2)
    assert ev.crop_scores["crop2"]["mito"]["is_missing"]
    assert to_json(ev)["metric_title"] == "toy Dice metric"
    table = format_table(ev, per_crop=True)
    assert table.startswith("cellseg evaluate: toy Dice metric") and "f1=0.6667" in table
    assert combine(ev.crop_scores, "toy")["label_scores"] == ev.label_scores


def test_a_toy_era_leaves_the_registry_when_its_file_goes(toy_era):
    eras.registry.cache_clear()
    eras.__path__.pop()  # the fixture's folder (restored by monkeypatch afterwards anyway)
    with pytest.raises(ValueError, match=r"registered eras: 2025, 2026, 2026-07$"):
        get_era("toy")
