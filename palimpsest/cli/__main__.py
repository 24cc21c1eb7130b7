"""`python -m palimpsest.cli` works where the console script is not on PATH."""

import sys

from palimpsest.cli.cli import main

sys.exit(main())
