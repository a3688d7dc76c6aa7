"""maskcheck's engine: adapters, cases, tolerance, runner, report, CLI and pytest plugin.

Installed as ``maskcheck.harness``. The public API is the top-level ``maskcheck``
package (``from maskcheck import audit``). Importing this package imports nothing
else, so the pytest plugin (``maskcheck.harness.plugin``) stays cheap to load.
"""

if not __name__.startswith("maskcheck."):  # pragma: no cover - a second copy of the package
    # Loaded by its bare name (the repository root on sys.path): a second module object
    # beside maskcheck.harness, and the name a user's own package may have.
    raise ImportError(f"import {__name__} as maskcheck.{__name__} (pip install -e . from the repository root)")
