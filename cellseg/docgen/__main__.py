"""`python -m cellseg.docgen [--check]`: regenerate (or check) docs/config.md and docs/cli.md."""

import sys

from cellseg.docgen import main

sys.exit(main())
