"""`python -m bench.test_set`: the test-set benchmark (see the package docstring or `--help`)."""

import sys

from bench.test_set.cli import main

if __name__ == "__main__":
    sys.exit(main())
