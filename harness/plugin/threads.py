"""How many threads torch uses inside a test process that runs maskcheck audits.

torch starts with one thread per core in every process. Under pytest-xdist every worker
does, so two workers on a loaded 2-core machine each run four threads on two cores: an
audit that takes 1.3 s alone took 41 s that way. Under the plugin, each process takes a
fair share of the cores instead, unless the user said otherwise:

| setting | what happens |
|---|---|
| ``auto`` (default) | if neither ``OMP_NUM_THREADS`` nor ``MKL_NUM_THREADS`` is set, lower torch's thread count to ``cores // workers`` (at least 1); never raise it |
| ``keep`` | leave torch's thread count alone |
| ``N`` | ``torch.set_num_threads(N)`` |

The count holds only while a maskcheck test runs: it is restored afterwards
(``harness/plugin/host_state.py``), so the host repo's own tests see the threads they had.
"""

from __future__ import annotations

import os
from typing import Mapping

THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


class ThreadSettingError(ValueError):
    pass


def parse_threads(value: object) -> str | int:
    """``auto``, ``keep`` or a positive integer, from an option, an ini value or a config file."""
    text = str(value).strip().lower() if value is not None else "auto"
    if text in ("auto", "keep"):
        return text
    if text.isdigit() and int(text) > 0:
        return int(text)
    raise ThreadSettingError(f"threads must be auto, keep or a positive integer, got {value!r}")


def fair_share(cores: int, workers: int) -> int:
    return max(1, cores // max(1, workers))


def threads_to_use(
    setting: str | int, current: int, cores: int, workers: int, environ: Mapping[str, str]
) -> int | None:
    """The thread count to set in this process, or None to leave torch as it is."""
    if setting == "keep":
        return None
    if isinstance(setting, int):
        return setting if setting != current else None
    if any(environ.get(name) for name in THREAD_VARIABLES):
        return None  # the user chose, through the variables torch itself reads
    share = fair_share(cores, workers)
    return share if current > share else None


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS and Windows have no affinity call
        return os.cpu_count() or 1


def xdist_workers(environ: Mapping[str, str] = os.environ) -> int:
    """How many pytest-xdist workers share the machine (1 without xdist)."""
    count = environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    return int(count) if count.isdigit() else 1


def audit_threads(setting: str | int) -> int | None:
    """The thread count for a maskcheck test in this process, or None to leave torch's."""
    import torch

    return threads_to_use(setting, torch.get_num_threads(), usable_cores(), xdist_workers(), os.environ)
