"""`python -m clients.pal` works where the console script is not on PATH."""

import sys

from clients.pal.cli import main

sys.exit(main())
