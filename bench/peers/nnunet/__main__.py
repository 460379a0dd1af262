"""`python -m bench.peers.nnunet`: see `cli.py`."""

import sys

from bench.peers.nnunet.cli import main

sys.exit(main())
