"""maskcheck as a guest in another repository: its package names never collide with the host's.

The host repo below has its own ``harness``, ``suites`` and ``reference_models`` packages
(common names). With maskcheck installed and its plugin active, the host's tests import
their own packages, and maskcheck's generated tests still run.
"""

from __future__ import annotations

import pytest
from test_plugin import MODELS, PYPROJECT

pytest_plugins = ["pytester"]

HOST_TESTS = """
import harness, suites, reference_models


def test_host_packages_are_the_hosts_own():
    assert (harness.OWNER, suites.OWNER, reference_models.OWNER) == ("host", "host", "host")
"""

HOST_PYPROJECT = PYPROJECT.replace('"causal,padding"', '"padding"')

HOST_CONFTEST = """
from harness import OWNER  # the host's conftest imports its own harness package first

assert OWNER == "host"
"""


@pytest.mark.parametrize("with_conftest", [pytest.param(False, marks=pytest.mark.slow), True])
def test_host_packages_named_like_ours_keep_working(pytester: pytest.Pytester, with_conftest: bool) -> None:
    for package in ("harness", "suites", "reference_models"):
        pytester.mkpydir(package).joinpath("__init__.py").write_text('OWNER = "host"\n')
    pytester.makepyfile(models=MODELS, test_host=HOST_TESTS)  # a good decoder and one that ignores its padding mask
    pytester.makefile(".toml", pyproject=HOST_PYPROJECT)
    if with_conftest:
        pytester.makeconftest(HOST_CONFTEST)
    result = pytester.runpytest_subprocess("-p", "no:xdist", "-rA")
    out = result.stdout.str()
    assert "Error while loading plugin" not in out + result.stderr.str()
    assert result.parseoutcomes() == {"passed": 2, "failed": 1}, out[-3000:]
    assert "PASSED test_host.py::test_host_packages_are_the_hosts_own" in out
    assert "PASSED maskcheck::test_maskcheck[padding-module:models:good]" in out
    assert "FAILED maskcheck::test_maskcheck[padding-module:models:buggy]" in out


def test_our_packages_refuse_their_bare_names(pytester: pytest.Pytester) -> None:
    """From maskcheck's own repository root, ``import reference_models`` would be a second
    copy of maskcheck.reference_models; each package refuses to load under its bare name."""
    import pathlib
    import sys

    import maskcheck.reference_models

    root = pathlib.Path(maskcheck.reference_models.__file__).resolve().parent.parent
    for package in ("harness", "suites", "reference_models"):
        code = f"import sys; sys.path.insert(0, {str(root)!r}); import {package}"
        result = pytester.run(sys.executable, "-c", code)
        assert result.ret != 0 and f"import {package} as maskcheck.{package}" in result.stderr.str()


def test_the_tests_import_maskcheck_only() -> None:
    """Every import of our packages in tests, scripts and examples names maskcheck.*."""
    import pathlib
    import re

    import maskcheck

    root = pathlib.Path(maskcheck.__file__).resolve().parent.parent
    bare = re.compile(r"^\s*(from|import)\s+(harness|suites|reference_models)\b", re.M)
    offenders = [
        str(path.relative_to(root))
        for folder in ("tests", "scripts", "benchmarks", "examples", "harness", "suites", "reference_models")
        for path in (root / folder).rglob("*.py")
        if path != pathlib.Path(__file__) and bare.search(path.read_text())
    ]
    assert offenders == []
