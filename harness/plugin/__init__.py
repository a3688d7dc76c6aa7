"""The pytest plugin: maskcheck's suites as tests of a host repository.

This package is the ``pytest11`` entry point (``maskcheck.harness.plugin``). Its hooks,
options and fixture live in :mod:`.hooks`; they are named here because pytest registers
the entry point's module and reads its hooks from that module's attributes. Loading it
imports pytest and nothing heavier: a host that does not configure maskcheck pays for a
few small modules.

- :mod:`.hooks`: the pytest hooks: options, configuration, collection, the fixture
- :mod:`.settings`: every setting, one record each, and how a run reads them
- :mod:`.items`: the generated tests (a suite on a model, a compared pair, a collator)
- :mod:`.tracker`: the run's bookkeeping, its summary line, and ``require``
- :mod:`.hookspec`: the hooks a host implements (``maskcheck_models``)
- :mod:`.testing`: the test items' bodies, and ``maskcheck_tests`` for hand-written test files
- :mod:`.run_report`: which tests this run selected and finished; merging their reports
- :mod:`.threads`: torch's thread count while maskcheck's tests run
"""

from .hooks import (
    maskcheck_adapter,
    pytest_addhooks,
    pytest_addoption,
    pytest_collection_modifyitems,
    pytest_configure,
    pytest_generate_tests,
    pytest_ignore_collect,
)

__all__ = [
    "maskcheck_adapter",
    "pytest_addhooks",
    "pytest_addoption",
    "pytest_collection_modifyitems",
    "pytest_configure",
    "pytest_generate_tests",
    "pytest_ignore_collect",
]
