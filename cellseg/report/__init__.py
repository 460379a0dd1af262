"""The ablation report: what each inference stage adds, on crops with truth, in both metric eras.

    best single model → uniform ensemble → weighted ensemble → + TTA (8×) → + post-processing

- `inputs`: checks the runs, resolves the scored (report) and tuning crops, states the biases;
- `truth`: the scored crops' truth in the evaluator's layout;
- `scoring`: a stage's segmentation (threshold 0.5 and 26-connected components without post-processing)
  written as a submission and scored by `cellseg.eval.evaluate`;
- `decisions`: the best single model chosen on the tuning crops in decision mode; skipped counts;
- `bootstrap`: 95 % crop-bootstrap intervals of every number, paired ones of every change;
- `predictions`: every run's predictions of a stage, the runs in parallel processes (`--predict-jobs`);
- `ablation`: `run_report`, the stages and the report directory (resumable);
- `render` (report.md, report.json, the console table) and `figures` (PNGs through `cellseg.viz`).

Example:
    >>> from cellseg.report import ReportOptions, run_report
    >>> report = run_report(ReportOptions(runs=("runs/unet_3d", "runs/resnet_3d"), out="report"))  # doctest: +SKIP
"""

from typing import Any

__all__ = ["Report", "ReportOptions", "run_report"]


def __getattr__(name: str) -> Any:
    """The public names, imported on first use: a process that needs only a light submodule (the bootstrap's
    pool workers import `cellseg.decide.bootstrap`) does not import torch and the whole report."""
    if name == "run_report":
        from cellseg.report.ablation import run_report

        return run_report
    if name in ("Report", "ReportOptions"):
        from cellseg.report import results

        return getattr(results, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
