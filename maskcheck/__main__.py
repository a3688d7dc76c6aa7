"""``python -m maskcheck``: the same command line as ``maskcheck``."""

from maskcheck.harness.cli import main

raise SystemExit(main())
