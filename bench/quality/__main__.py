"""`python -m bench.quality`: the quality benchmark (see the package docstring or `--help`)."""

import sys

from bench.quality.cli import main

if __name__ == "__main__":
    sys.exit(main())
