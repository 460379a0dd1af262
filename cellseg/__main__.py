"""`python -m cellseg ...` (also what `torchrun -m cellseg train ...` runs)."""

import sys

from cellseg.cli import main

sys.exit(main())
