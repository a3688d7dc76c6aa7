"""The pytest plugin, exercised in a small fake repo with pytester (serial and with -n 2)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ElementTree

import pytest

pytest_plugins = ["pytester"]

MODELS = '''
def good():
    import torch
    from maskcheck.reference_models import PRESETS, Transformer
    torch.manual_seed(0)
    return Transformer(PRESETS["tiny-decoder"])


def buggy():
    from maskcheck.reference_models.mutants import build
    return build("padding_mask_ignored")
'''

PYPROJECT = '''
[tool.pytest.ini_options]
addopts = "-p no:cacheprovider --strict-markers"
maskcheck_models = """
module:models:good
module:models:buggy
"""
maskcheck_suites = "causal,padding"
maskcheck_profile = "dev"
'''


@pytest.fixture
def fake_repo(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(models=MODELS, test_own="def test_own():\n    assert True\n")
    pytester.makefile(".toml", pyproject=PYPROJECT)
    return pytester


def outcomes(result: pytest.RunResult) -> dict[str, int]:
    return result.parseoutcomes()


@pytest.mark.parametrize("workers", [None, "2"])
def test_one_test_per_suite_per_model_and_the_buggy_one_fails(fake_repo: pytest.Pytester, workers: str | None) -> None:
    args = ["-n", workers] if workers else ["-p", "no:xdist"]
    result = fake_repo.runpytest_subprocess(*args, "--junitxml=junit.xml", "-rA")
    assert outcomes(result) == {"passed": 4, "failed": 1}, result.stdout.str()[-3000:]
    out = result.stdout.str()
    assert "FAILED maskcheck::test_maskcheck[padding-module:models:buggy]" in out
    assert "pad_ids: FAIL: changing the ids at left-padded slots changed real logits" in out
    assert "reproduction: pytest " in out and "repro-padding" in out
    # Reports from every worker are merged per model; bundles sit beside them.
    report = json.loads((fake_repo.path / "maskcheck-report" / "module_models_buggy" / "report.json").read_text())
    assert [s["name"] for s in report["suites"]] == ["causal", "padding"]
    assert (fake_repo.path / "maskcheck-report" / "module_models_buggy" / "repro-padding" / "test_repro_padding.py").is_file()
    # Figures go into the JUnit XML as properties.
    properties = {p.get("name"): p.get("value") for p in ElementTree.parse(fake_repo.path / "junit.xml").iter("property")}
    assert "pad_ids.max_diff" in properties and "pad_ids.threshold" in properties


def test_k_selects_generated_tests_and_bundles_are_not_collected(fake_repo: pytest.Pytester) -> None:
    assert outcomes(fake_repo.runpytest_subprocess("-p", "no:xdist")) == {"passed": 4, "failed": 1}
    # The bundle written by that run holds a failing test; the next run must not collect it.
    result = fake_repo.runpytest_subprocess("-p", "no:xdist", "-k", "causal and good")
    assert outcomes(result) == {"passed": 1, "deselected": 4}, result.stdout.str()[-2000:]


def test_command_line_models_and_suites_and_skip_with_reason(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_own="def test_own():\n    assert True\n")
    result = pytester.runpytest_subprocess("-p", "no:xdist", "-p", "no:cacheprovider", "--maskcheck-model", "ref:tiny-encoder", "--maskcheck-suites", "kv_cache,causal", "-rs")
    assert outcomes(result) == {"passed": 2, "skipped": 1}, result.stdout.str()[-2000:]
    assert "the model declares no KV cache" in result.stdout.str()


def test_warn_becomes_a_pytest_warning(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_own="def test_own():\n    assert True\n")
    result = pytester.runpytest_subprocess("-p", "no:xdist", "-p", "no:cacheprovider", "--maskcheck-model", "ref:tiny-decoder", "--maskcheck-suites", "norm_checkpoint")
    assert outcomes(result)["passed"] == 2
    assert "MaskcheckWarning" in result.stdout.str() and "inconclusive" in result.stdout.str()


def test_hook_fixture_and_helper_for_test_authors(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(
        '''
from maskcheck.harness.testing import ModelEntry


def build():
    from maskcheck.reference_models.mutants import build_clean
    return build_clean("kv_cache_appended_twice")


def pytest_maskcheck_models(config):
    return [ModelEntry("my-decoder", build)]
'''
    )
    pytester.makepyfile(
        test_mine='''
from maskcheck.harness.testing import maskcheck_tests
from maskcheck.reference_models.mutants import build

test_buggy_cache = maskcheck_tests(lambda: build("kv_cache_appended_twice"), suites=["kv_cache"], name="buggy", profile="dev")


def test_adapter_fixture(maskcheck_adapter):
    assert maskcheck_adapter.capabilities.has_cache
'''
    )
    result = pytester.runpytest_subprocess("-p", "no:xdist", "-p", "no:cacheprovider", "--maskcheck-suites", "kv_cache", "-v")
    out = result.stdout.str()
    assert outcomes(result) == {"passed": 2, "failed": 1}, out[-3000:]
    assert "test_adapter_fixture[my-decoder] PASSED" in out
    assert "test_maskcheck[kv_cache-my-decoder] PASSED" in out
    assert "test_buggy_cache[kv_cache] FAILED" in out and "cached decoding" in out


def test_unknown_suite_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_own="def test_own():\n    assert True\n")
    result = pytester.runpytest_subprocess("-p", "no:xdist", "--maskcheck-model", "ref:tiny-decoder", "--maskcheck-suites", "nope")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "unknown suite(s) nope" in result.stderr.str()


def test_a_model_that_cannot_load_fails_its_tests_with_one_line(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_own="def test_own():\n    assert True\n")
    result = pytester.runpytest_subprocess("-p", "no:xdist", "-p", "no:cacheprovider", "--maskcheck-model", "hf:./missing", "--maskcheck-suites", "causal")
    assert outcomes(result) == {"passed": 1, "failed": 1}
    assert "cannot load hf:./missing: no such directory" in result.stdout.str()
