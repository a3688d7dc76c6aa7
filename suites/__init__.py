"""The invariance suites, registered in the ``maskcheck.suites`` entry-point group."""

if not __name__.startswith("maskcheck."):  # pragma: no cover - a second copy of the package
    # Loaded by its bare name (the repository root on sys.path): a second module object
    # beside maskcheck.suites, and the name a user's own package may have.
    raise ImportError(f"import {__name__} as maskcheck.{__name__} (pip install -e . from the repository root)")
