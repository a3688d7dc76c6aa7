"""``python -m maskcheck.harness.cli``: the same command line as ``maskcheck``."""

import sys

from .main import main

sys.exit(main())
