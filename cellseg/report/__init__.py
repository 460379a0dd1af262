"""The ablation report: what each inference stage adds, on crops with truth, in both metric eras.

    best single model → uniform ensemble → weighted ensemble → + TTA (8×) → + post-processing

- `plan`: checks the runs, resolves the scored (report) and tuning crops, states the biases;
- `truth`: the scored crops' truth in the evaluator's layout;
- `scoring`: a stage's segmentation (threshold 0.5 and 26-connected components without post-processing)
  written as a submission and scored by `cellseg.eval.evaluate`;
- `decisions`: the best single model chosen on the tuning crops in decision mode; skipped counts;
- `bootstrap`: 95 % crop-bootstrap intervals of every number, paired ones of every change;
- `ablation`: `run_report`, the stages and the report directory (resumable);
- `render` (report.md, report.json, the console table) and `figures` (PNGs through `cellseg.viz`).

Example:
    >>> from cellseg.report import ReportOptions, run_report
    >>> report = run_report(ReportOptions(runs=("runs/unet_3d", "runs/resnet_3d"), out="report"))  # doctest: +SKIP
"""

from cellseg.report.ablation import run_report
from cellseg.report.results import Report, ReportOptions

__all__ = ["Report", "ReportOptions", "run_report"]
