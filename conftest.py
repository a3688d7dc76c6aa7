"""Repo-level pytest configuration for maskcheck's own tests."""

from __future__ import annotations

import os
import warnings

import pytest

# One torch thread per pytest-xdist worker: with -n auto, every core already runs a worker.
# OMP_NUM_THREADS set by the caller wins (CI runs the tests that compare floats computed
# two ways under 1 and 2 threads: kernels block their sums differently with each).
os.environ.setdefault("OMP_NUM_THREADS", "1")
warnings.filterwarnings("ignore", message=".*bos_token_id.*")


def pytest_configure(config: pytest.Config) -> None:
    import logging

    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))  # .ci/run repeats the float tests with 2
    # torchao (the dev extra's, for torchtune; transformers imports it where installed) logs at import
    # that a CPU torch cannot load its CUDA kernels, and torch's pytree logs a deprecation it triggers:
    # warnings that would land in the captured stderr of whichever test first imports transformers.
    for name in ("torchao", "torch.utils._pytree"):
        logging.getLogger(name).setLevel(logging.ERROR)


@pytest.fixture(autouse=True)
def canonical_path_unless_marked(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Audits in these tests run on the canonical call path only, unless the test is marked
    ``call_paths``: the other paths repeat every check, and what most tests assert (a CLI
    flag, a bundle, the plugin's output) does not depend on them. The tests of the paths,
    of the clean models and of the sweep's verdicts are marked and run every path."""
    if request.node.get_closest_marker("call_paths") is None:
        from maskcheck.harness.engine import profiles

        for profile in profiles.PATH_EXAMPLES:
            monkeypatch.setitem(profiles.PATH_EXAMPLES, profile, 0)


# Bundles that earlier maskcheck versions wrote, kept as data: tests replay them from a copy.
collect_ignore = ["tests/data"]
