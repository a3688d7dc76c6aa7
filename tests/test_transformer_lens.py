"""TransformerLens's HookedTransformer (3.9), wrapped as the README's "your own nn.Module"
says: its token embedding (an ``Embed`` module with its own ``W_E``, no ``nn.Embedding``)
is measured, so the gradient checks and the training backward run; its KV cache, an object
the forward updates in place, is audited through the six-line recipe of examples/third_party.py."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest

from maskcheck import adapter_for, audit

pytest.importorskip("transformer_lens")  # the dev extra installs it

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
import third_party  # noqa: E402

GRADIENT_CHECKS = ("future_gradients", "padded_gradients")


@pytest.fixture(autouse=True)
def _quiet() -> None:
    warnings.filterwarnings("ignore", "HookedTransformer is deprecated", DeprecationWarning)


def checks(result) -> dict:  # type: ignore[no-untyped-def]
    return {c.name: c for suite in result.suites for c in suite.checks}


def test_its_embedding_is_measured_and_the_gradient_checks_run() -> None:
    model = third_party.hooked_transformer()
    assert adapter_for(model).embedding_module() is model.embed
    found = checks(audit(model, ["causal", "padding"]))
    for name in GRADIENT_CHECKS:
        assert found[name].status == "pass", (name, found[name].status, found[name].message)
        assert found[name].paths[0]["path"] == "training_backward"


def test_a_leak_through_its_hooks_fails_forward_and_backward() -> None:
    """A hook that unmasks the next position's attention score: the gradient checks, which
    ran n/a before the embedding was measured, now see it backward as well as forward."""
    model = third_party.hooked_transformer()

    def next_token_visible(scores, hook):  # type: ignore[no-untyped-def]  # [B, H, T, T], future at -inf
        diagonal = scores.diagonal(offset=1, dim1=-2, dim2=-1)
        diagonal.copy_(scores.diagonal(dim1=-2, dim2=-1)[..., 1:])
        return scores

    model.add_perma_hook("blocks.0.attn.hook_attn_scores", next_token_visible)
    found = checks(audit(model, ["causal"]))
    assert found["future_tokens"].status == "fail", found["future_tokens"].message
    assert found["future_gradients"].status == "fail", found["future_gradients"].message


def test_its_cache_is_audited_through_the_recipe_and_named_without_it() -> None:
    cached = checks(audit(third_party.cached_hooked_transformer(), ["kv_cache"]))
    assert {cached[n].status for n in ("incremental", "greedy_generation")} == {"pass"}
    bare = audit(third_party.hooked_transformer(), ["kv_cache"]).suite("kv_cache").checks[0]
    assert bare.status == "not_applicable" and "past_kv_cache=" in bare.message and "prefill()" in bare.message
