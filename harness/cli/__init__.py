"""The ``maskcheck`` command line (entry point ``maskcheck.harness.cli:main``).

:mod:`.main` parses the commands and prints what they find; the work itself is done by
the layers below (``audits``, ``report``), so every command is also a Python call.
"""

from .main import build_parser, main

__all__ = ["build_parser", "main"]
