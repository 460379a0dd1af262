"""Research studies beside the benchmark suite: the quality ablation (`bench.studies.quality`), the test-set
projection (`bench.studies.test_set`) and decisions and decoding on the annotation grid (`bench.studies.native_grids`).
Run as `python -m bench.studies.<name>` from the repository root; their tests are in `bench/studies/tests/`.
"""
