"""Collator bundles written by maskcheck 0.2.0 import this path: ``from
maskcheck.harness.collator_audit import replay_collator_case``. The module lives in
:mod:`maskcheck.harness.audits.collator_audit`."""

from .audits.collator_audit import replay_collator_case

__all__ = ["replay_collator_case"]
