"""`python -m bench.studies.test_set`: the test-set benchmark (see the package docstring or `--help`)."""

import sys

from bench.studies.test_set.cli import main

if __name__ == "__main__":
    sys.exit(main())
