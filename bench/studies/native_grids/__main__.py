"""`python -m bench.studies.native_grids`: the native-grids ablation (see the package docstring or `--help`)."""

from bench.studies.native_grids.cli import main

if __name__ == "__main__":
    main()
