"""maskcheck: verify the masking and caching correctness of any Transformer.

The public Python API::

    import maskcheck

    result = maskcheck.audit("hf:./my-checkpoint", ["causal", "padding"])
    print(result.status, result.exit_code)

The repository's ``harness/``, ``suites/`` and ``reference_models/`` folders install as
``maskcheck.harness``, ``maskcheck.suites`` and ``maskcheck.reference_models``: one
namespace, so they never collide with a project's own ``harness`` or ``suites`` package.

Importing maskcheck does not import torch; the names below load on first use, so the
pytest plugin costs a repository that does not use it nothing.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

#: public name -> the module (under maskcheck) that defines it
_EXPORTS = {
    "audit": "harness.audits.runner",
    "AuditResult": "harness.audits.runner",
    "LoadOptions": "harness.adapters.specs",
    "SpecError": "harness.adapters.specs",
    "load_adapter": "harness.adapters.specs",
    "adapter_for": "harness.adapters.specs",
    "Adapter": "harness.adapters.base",
    "Batch": "harness.adapters.base",
    "Capabilities": "harness.adapters.base",
    "LayerAttention": "harness.adapters.layer_attention",
    "replay": "harness.report.reproduction",
    "BundleError": "harness.report.reproduction",
    "maskcheck_tests": "harness.plugin.testing",
    "ModelEntry": "harness.plugin.testing",
    "MaskcheckWarning": "harness.plugin.testing",
    "audit_collator": "harness.audits.collator_audit",
    "CollatorError": "harness.audits.collator_audit",
    "check_gradient_accumulation": "harness.audits.grad_accumulation",
    "assert_gradient_accumulation": "harness.audits.grad_accumulation",
    "run_canary": "harness.audits.canary",
    "assert_no_leak": "harness.audits.canary_api",
    "CanaryFired": "harness.audits.canary_api",
    "CanarySettings": "harness.audits.canary",
    "compare": "harness.compare.run",
    "CompareResult": "harness.compare.run",
    "CompareError": "harness.compare.run",
    "load_weights": "harness.compare.weights",
    "WeightsMismatch": "harness.compare.weights",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'maskcheck' has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{_EXPORTS[name]}"), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
