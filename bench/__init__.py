"""cellseg's benchmark suite: one script per measurement, run from the repository root as `python -m bench.<name>`.

Each writes its record to `bench/results/<bench>_<hardware>.json` (and a `.md` rendering where it has one) unless
`--out` says otherwise, so a re-run overwrites the record of that hardware; earlier records are in the git history.
The research studies (`bench.studies`) live apart from the suite; docs/benchmarks.md lists both.
"""
