"""nnU-Net v2 on cellseg's data, for the same GPU time, scored by cellseg's evaluator (docs/quality.md, "Against
nnU-Net"). Steps: `env`, `data`, `train`, `predict`, `score` (and `--quick`); see `cli.py`."""
