"""Score bars, training curves and benchmark charts from small documents written in the tests."""

import json
import math

import numpy as np
import pytest
from matplotlib.image import imread

from cellseg.viz import (
    bench_figure,
    curves_figure,
    figure_size_px,
    load_bench,
    load_run,
    load_scores,
    save_png,
    scores_figure,
)
from cellseg.viz.palette import KIND_COLORS
from cellseg.viz.scores import class_order

EVAL_2025 = {  # the shape of `cellseg evaluate --json` (cellseg.eval.report.to_json), trimmed
    "metric": "2025", "metric_title": "2025 challenge-era metric",
    "overall_score": 0.5, "overall_instance_score": 0.6, "overall_semantic_score": None,
    "label_scores": {
        "mito": {"combined_score": 0.8, "accuracy": 0.9, "normalized_hausdorff_distance": 0.7,
                 "hausdorff_distance": 12.0},
        "er": {"iou": 0.4, "dice_score": 0.57},
        "nuc": {"combined_score": None, "accuracy": 0.1, "normalized_hausdorff_distance": None,
                "hausdorff_distance": None},
    },
}
OFFICIAL_2026 = {  # an official results_extended.json: no "metric" key
    "overall_score": 0.3,
    "label_scores": {"mito": {"f1": 0.5, "normalized_hausdorff_distance": 0.5, "combined_score": 0.5, "tp": 1,
                              "fp": 1, "fn": 1},
                     "er": {"iou": 0.9, "tp": 9, "fp": 1, "fn": 0}},
}


def _write_metrics(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _run(tmp_path, name="run_a", *, mfu=False, resumed=False):
    run = tmp_path / name
    run.mkdir()
    records = []
    for step in range(2, 21, 2):
        train = {"loss": 2.0 / step, "grad_norm": 1.0, "lr": 1e-3 * step / 20, "samples_per_s": 10.0 + step,
                 "mvox_per_s": 1.0, "micro_batch": 2}
        if mfu:
            train.update(mfu=0.2, tflops_per_gpu=100.0, gpu_mem_gb=10.0)
        records.append({"step": step, "time": float(step), "train": train})
        if step % 10 == 0:
            records.append({"step": step, "time": float(step), "val": {
                "metric": "2026", "overall_score": step / 40, "overall_instance_score": step / 30,
                "overall_semantic_score": step / 50, "class_scores": {"mito": step / 25, "er": step / 45},
                "label_scores": {"mito": {"combined_score": step / 25}, "er": {"iou": step / 45}}}})
    if resumed:  # a resumed run logs steps 12-20 again; the later records win
        records += [{"step": s, "time": 100.0 + s, "train": {"loss": 5.0, "lr": 1e-3, "samples_per_s": 1.0}}
                    for s in range(12, 21, 2)]
    _write_metrics(run / "metrics.jsonl", records)
    return run


def test_scores_from_every_accepted_source(tmp_path):
    doc = tmp_path / "eval.json"
    doc.write_text(json.dumps(EVAL_2025))
    s = load_scores(doc)
    assert s.era == "2025" and s.scores["mito"] == 0.8 and s.scores["er"] == 0.4 and math.isnan(s.scores["nuc"])
    assert math.isnan(s.overall_semantic) and s.kind("mito") == "instance" and s.kind("er") == "semantic"
    assert load_scores(OFFICIAL_2026).era == "2026"  # era read off the keys
    run = _run(tmp_path)
    last = load_scores(run)
    assert last.era == "2026" and last.scores["mito"] == pytest.approx(20 / 25) and "step 20" in last.source
    assert load_scores(run / "metrics.jsonl", step=10).scores["er"] == pytest.approx(10 / 45)
    with pytest.raises(ValueError, match=r"no validation at step 3; steps: \[10, 20\]"):
        load_scores(run, step=3)


@pytest.mark.parametrize(("content", "message"), [
    ("{not json", "not JSON"),
    ('{"rows": []}', "no 'label_scores' or 'class_scores'"),
    ('{"label_scores": {"er": {"weird": 1}}}', "cannot tell the metric era"),
    ('{"metric": "2024", "label_scores": {"er": {"iou": 1}}}', "metric era '2024'"),
])
def test_score_errors(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        load_scores(path)


def test_score_bars_sorted_and_coloured_by_kind(tmp_path):
    a, b = load_scores(EVAL_2025), load_scores(OFFICIAL_2026)
    assert class_order([a, b]) == ["mito", "er", "nuc"]  # by the first evaluation, missing score last
    fig = scores_figure([a, b])
    bars = fig.axes[0].patches
    assert [round(p.get_width(), 3) for p in bars] == [0.8, 0.4, 0.0]
    assert [p.get_facecolor()[:3] for p in bars[:2]] == [
        pytest.approx(tuple(int(KIND_COLORS[k][i:i + 2], 16) / 255 for i in (1, 3, 5))) for k in ("instance", "semantic")]
    assert "2025 challenge-era metric" in fig.axes[0].get_title()
    assert "2026 metric (official code at 6b9ad68)" in fig.axes[1].get_title()
    out = save_png(fig, tmp_path / "scores.png")
    assert imread(out).shape[:2] == figure_size_px(fig)[::-1]


def test_curves_panels_and_resumed_runs(tmp_path):
    run = load_run(_run(tmp_path, resumed=True))
    steps, loss = run.series("loss")
    assert list(steps) == list(range(2, 21, 2)) and loss[-1] == 5.0  # the resumed record of step 20 wins
    fig = curves_figure(run, classes=["mito"])
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert titles[0] == "validation (2026 metric (official code at 6b9ad68))"
    assert "MFU (% of bf16 peak)" not in titles  # CPU runs log no MFU
    labels = fig.axes[0].get_legend_handles_labels()[1]
    assert labels == ["mito", "overall", "instance", "semantic"]
    out = save_png(fig, tmp_path / "curves.png")
    assert imread(out).shape[:2] == figure_size_px(fig)[::-1]


def test_curves_overlay_several_runs_with_mfu(tmp_path):
    runs = [load_run(_run(tmp_path, "gpu_a", mfu=True)), load_run(_run(tmp_path, "gpu_b", mfu=True))]
    fig = curves_figure(runs)
    mfu_ax = next(ax for ax in fig.axes if ax.get_title().startswith("MFU"))
    assert [line.get_label() for line in mfu_ax.get_lines()] == ["gpu_a", "gpu_b"]
    np.testing.assert_allclose(mfu_ax.get_lines()[0].get_ydata(), 20.0)  # fraction drawn as percent
    assert fig.get_suptitle() == "gpu_a vs gpu_b"


def test_curve_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no metrics\.jsonl"):
        load_run(tmp_path)
    bad = _write_metrics(tmp_path / "metrics.jsonl", [{"time": 1.0}])
    with pytest.raises(ValueError, match="line 1: not a metrics record"):
        load_run(bad)


TRAIN_STEP = {"env": {"gpu": "GPU-X", "date": "2026-01-01", "peak_tflops": 800.0}, "rows": [
    {"name": "unet_3d", "batch": 8, "patch": [128, 128, 128],
     "stock": {"step_ms": 1500.0, "mvox_per_s": 11.0, "mfu": 0.02},
     "cellseg": {"step_ms": 150.0, "mvox_per_s": 110.0, "mfu": 0.2}},
    {"name": "vit_3d", "batch": 2, "patch": [128, 128, 128],
     "stock": {"step_ms": 250.0, "mfu": 0.01}, "cellseg": {"step_ms": 40.0, "mfu": 0.07}},
]}
MODELS = {"environment": {"device": "GPU-X", "date": "2026-01-01"}, "models": [
    {"name": "unet_2d", "batch_size": 64, "patch_vox": [256, 256],
     "settings": {"bf16": {"status": "ok", "step_ms": 100.0, "mfu": 0.1},
                  "bf16-cl": {"status": "oom"}}},
]}
LOADER = {"date": "2026-01-01", "cpus": 2, "gpu": "none",
          "runs": [{"shape": "3d", "workers": 2, "augment": False, "batch": 2, "patches_per_s": 20.0, "rss_GB": 1.5},
                   {"shape": "3d", "workers": 0, "augment": True, "batch": 2, "patches_per_s": 5.0, "rss_GB": 1.0}],
          "peer": [{"shape": "3d", "workers": 0, "batch": 2, "patches_per_s": 0.5, "library": "cellmap-data"}]}


def _json(tmp_path, name, doc):
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


def test_train_step_bench_bars(tmp_path):
    table = load_bench(_json(tmp_path, "train_step.json", TRAIN_STEP))
    assert table.series == ["stock", "cellseg"]
    assert table.values["samples_per_s"][(table.categories[0], "cellseg")] == pytest.approx(8 * 1000 / 150)
    fig = bench_figure(table)
    ms_ax, mfu_ax = fig.axes[:2]
    assert [round(p.get_height(), 3) for p in ms_ax.patches] == [1500.0, 250.0, 150.0, 40.0]
    assert [round(p.get_height(), 3) for p in mfu_ax.patches] == [2.0, 1.0, 20.0, 7.0]  # percent
    out = save_png(bench_figure(table, metrics=["samples_per_s"]), tmp_path / "bench.png")
    assert imread(out).ndim == 3


def test_models_and_loader_bench(tmp_path):
    models = load_bench(_json(tmp_path, "models.json", MODELS))
    assert models.notes == {(models.categories[0], "bf16-cl"): "oom"}
    assert "oom" in [t.get_text() for t in bench_figure(models).axes[0].texts]
    loader = load_bench(_json(tmp_path, "loader.json", LOADER))
    assert loader.categories == ["0 workers", "2 workers"]
    assert loader.series == ["cellseg 3d augment", "cellmap-data 3d", "cellseg 3d"]
    fig = bench_figure(loader)
    assert fig.axes[0].get_ylabel() == "patches/s" and fig.axes[1].get_ylabel() == "resident memory (GB)"


def test_bench_merges_files_of_one_kind_and_refuses_mixtures(tmp_path):
    other = {**TRAIN_STEP, "rows": [{**TRAIN_STEP["rows"][0], "name": "resnet_3d"}]}
    table = load_bench([_json(tmp_path, "a.json", TRAIN_STEP), _json(tmp_path, "b.json", other)])
    assert len(table.categories) == 3
    with pytest.raises(ValueError, match="cannot draw train_step and loader"):
        load_bench([_json(tmp_path, "a.json", TRAIN_STEP), _json(tmp_path, "c.json", LOADER)])
    with pytest.raises(ValueError, match="not a train-step, models or loader benchmark"):
        load_bench(_json(tmp_path, "d.json", {"machine": "x"}))
    with pytest.raises(ValueError, match=r"metric\(s\) \['tflops'\] not in these results"):
        bench_figure(table, metrics=["tflops"])


@pytest.mark.parametrize(("width", "height"), [(870, 333), (1001, 207), (480, 1290)])
def test_png_size_is_exact_and_notebooks_get_a_png(width, height, tmp_path):
    from io import BytesIO

    from cellseg.viz.figure import new_figure

    fig = new_figure(width, height)
    fig.add_subplot().plot([0, 1], [1, 0])
    assert figure_size_px(fig) == (width, height)
    assert imread(save_png(fig, tmp_path / "f.png")).shape[:2] == (height, width)
    png = fig._repr_png_()  # what Jupyter shows for a figure left as a cell's value
    assert png.startswith(b"\x89PNG") and imread(BytesIO(png)).shape[:2] == (height, width)
