"""A guest leaves the host as it found it: random states and torch's thread count.

An audit seeds torch (reference models and case ids are built from fixed seeds) and may
lower torch's thread count for its own forwards. Around every maskcheck test the plugin
saves what the host's own tests could observe and restores it afterwards, so a host test
that runs next in the same worker sees the random state and the threads it would have
seen without maskcheck: torch's CPU generator (``torch.initial_seed()`` included), every
initialised CUDA device's, Python's ``random``, NumPy's global generator (when NumPy is
loaded) and ``torch.get_num_threads()``.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any


@dataclass
class HostState:
    torch_rng: Any
    cuda_rng: list[Any] | None
    python_rng: Any
    numpy_rng: Any | None
    threads: int

    @classmethod
    def save(cls) -> "HostState":
        import torch

        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
        numpy = sys.modules.get("numpy")
        return cls(
            torch_rng=torch.get_rng_state(),
            cuda_rng=cuda,
            python_rng=random.getstate(),
            numpy_rng=numpy.random.get_state() if numpy is not None else None,
            threads=torch.get_num_threads(),
        )

    def restore(self) -> None:
        import torch

        torch.set_rng_state(self.torch_rng)
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state_all(self.cuda_rng)
        random.setstate(self.python_rng)
        numpy = sys.modules.get("numpy")
        if numpy is not None and self.numpy_rng is not None:
            numpy.random.set_state(self.numpy_rng)
        if torch.get_num_threads() != self.threads:
            torch.set_num_threads(self.threads)


@contextmanager
def as_guest(threads: int | None = None) -> Iterator[None]:
    """Run the block with torch at ``threads`` threads (None: as it is), then put back the
    random states and the thread count the block found."""
    saved = HostState.save()
    try:
        if threads is not None:
            import torch

            torch.set_num_threads(threads)
        yield
    finally:
        saved.restore()
