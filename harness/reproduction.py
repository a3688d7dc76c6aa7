"""Bundles written by maskcheck 0.2.0 import this path: ``from maskcheck.harness.reproduction
import replay_check, replay_model``. The module lives in :mod:`maskcheck.harness.report.reproduction`."""

from .report.reproduction import BundleError, replay, replay_check, replay_model

__all__ = ["BundleError", "replay", "replay_check", "replay_model"]
