"""`python -m vidloom.cli` (torchrun launches ranks this way)."""

import sys

from vidloom.cli import main

sys.exit(main())
