"""`python -m bench.studies.quality`: the quality benchmark (see the package docstring or `--help`)."""

import sys

from bench.studies.quality.cli import main

if __name__ == "__main__":
    sys.exit(main())
