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
    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))  # .ci/run repeats the float tests with 2


# Bundles that earlier maskcheck versions wrote, kept as data: tests replay them from a copy.
collect_ignore = ["tests/data"]
