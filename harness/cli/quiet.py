"""Quiet transformers' load-time output before a command prints its verdicts."""

from __future__ import annotations

import os
import sys


def quiet_transformers() -> None:
    """transformers' load-time progress bars and config warnings drown the verdict table.
    Both are read from the environment when transformers is imported, so an audit that never
    imports it (a reference model's) does not pay its import (1.4 s) to quiet it."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # transformers' bars follow huggingface_hub's
    if "transformers" in sys.modules:  # imported already: it read the environment then
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
