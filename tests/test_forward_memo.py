"""Each distinct forward once (harness/adapters/memo.py): a repeated call is served from the
audit's memo, which changes no verdict, holds a bounded number of bytes, and never serves a
changed model, another path's call settings or a training forward from an eval one."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from maskcheck import audit
from maskcheck.harness.adapters.base import Batch, Capabilities
from maskcheck.harness.adapters.hf import HFAdapter
from maskcheck.harness.adapters.memo import ForwardMemo, forward_memo
from maskcheck.harness.adapters.module import ModuleAdapter
from maskcheck.harness.adapters.paths import TRAINING
from maskcheck.reference_models.hf_tiny import tiny_model


def verdicts(result):  # type: ignore[no-untyped-def]
    """Each check's status, the case and message of a verdict that is not a pass, and the
    paths it ran on with their statuses and case counts. A pass reports its worst case by
    measured ratio among differences at the noise floor, which another stacking of forwards
    reorders (tests/verdict_record.py leaves it out too): of a pass, its case count."""
    return {
        (suite.name, check.name): (
            check.status,
            None if check.status == "pass" else check.case,
            check.message.split(";")[0] if check.status == "pass" else check.message,
            [(run["path"], run["status"], run.get("cases")) for run in check.paths],
        )
        for suite in result.suites
        for check in suite.checks
    }


@pytest.mark.parametrize(
    "build",
    [
        pytest.param(lambda: "ref:tiny-decoder", id="reference-decoder"),
        pytest.param(lambda: HFAdapter(tiny_model("llama", "sdpa")), id="hf-llama"),
        pytest.param(lambda: HFAdapter(tiny_model("gpt2", "eager")), id="hf-gpt2"),
        # T5's train-mode forward draws randomness outside nn.Dropout: the training path's
        # probe (two forwards of one batch) must compute its second forward, not be served it
        pytest.param(lambda: HFAdapter(tiny_model("t5", "sdpa")), id="hf-t5"),
    ],
)
@pytest.mark.call_paths  # the path replays are where calls repeat most
def test_an_audit_with_reuse_gives_the_verdicts_cases_and_messages_of_one_without(build) -> None:  # type: ignore[no-untyped-def]
    suites = ["causal", "padding", "loss_masking", "packing", "kv_cache", "serving"]
    with forward_memo(False):
        without = audit(build(), suites, profile="ci")
    adapter = build()
    with_reuse = audit(adapter, suites, profile="ci")
    assert verdicts(with_reuse) == verdicts(without)
    if not isinstance(adapter, str):
        assert adapter.forward_memo.hits > 0  # something was served, or the test shows nothing


class TrainingSensitive(nn.Module):
    """Logits that depend on the mode: a forward whose training branch differs."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(8, 8)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed(input_ids) * (2.0 if self.training else 1.0)


def test_a_changed_model_or_another_mode_is_never_served_an_earlier_forward() -> None:
    model = TrainingSensitive()
    adapter = ModuleAdapter(model, Capabilities(family="decoder", vocab_size=8, takes_attention_mask=False))
    batch = Batch(torch.tensor([[1, 2, 3]]))
    first = adapter.logits(batch)
    torch.testing.assert_close(adapter.logits(batch), first, rtol=0, atol=0)
    assert adapter.forward_memo.hits == 1
    trained = adapter.on_path(TRAINING).logits(batch)  # the training forward: its own call, never the eval one's
    torch.testing.assert_close(trained, 2 * first, rtol=0, atol=0)
    with torch.no_grad():
        model.embed.weight.add_(1.0)  # an in-place change of the weights: a new model
    torch.testing.assert_close(adapter.logits(batch), first + 1.0, rtol=0, atol=0)


def test_what_the_memo_holds_is_bounded_and_served_as_a_copy() -> None:
    memo = ForwardMemo(limit=3 * 4 * 10)  # three [10] float32 tensors
    for i in range(5):
        memo.put(("call", i), torch.full((10,), float(i)))
    assert memo.held_bytes <= memo.limit and ("call", 0) not in memo and ("call", 4) in memo
    served = memo.get(("call", 4))
    assert served is not None
    served.add_(100.0)  # a check that writes into its logits
    assert float(memo.get(("call", 4))[0]) == 4.0


def test_a_fresh_decode_is_remembered_by_its_prompt_and_the_tokens_fed_after_it() -> None:
    from maskcheck.harness.adapters.specs import load_adapter

    adapter = load_adapter("ref:tiny-decoder")
    prompt = Batch(torch.tensor([[3, 4, 5]]), torch.ones(1, 3, dtype=torch.long))
    steps = [torch.tensor([[6]]), torch.tensor([[7, 8]])]
    first = adapter.decoded(prompt, steps)
    hits = adapter.forward_memo.hits
    again = adapter.decoded(prompt, steps)
    assert adapter.forward_memo.hits == hits + 1
    for one, other in zip(first, again):
        torch.testing.assert_close(other, one, rtol=0, atol=0)
    other_tokens = adapter.decoded(prompt, [torch.tensor([[6]]), torch.tensor([[7, 9]])])
    assert adapter.forward_memo.hits == hits + 1  # other tokens fed: decoded, not served
    torch.testing.assert_close(other_tokens[1], first[1], rtol=0, atol=0)  # the same prefix decodes alike
    assert not torch.equal(other_tokens[2][:, -1], first[2][:, -1])


def prompt_batch() -> Batch:
    return Batch(torch.tensor([[0, 3, 4, 5], [6, 7, 8, 9]]), torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]]))


def test_a_prefill_is_served_as_its_logits_and_a_copy_of_the_state_it_left() -> None:
    adapter = HFAdapter(tiny_model("gpt2", "eager"))
    prompt, tokens = prompt_batch(), [torch.tensor([[10], [11]]), torch.tensor([[12, 13], [14, 15]])]
    with forward_memo(False):  # each decode as a fresh prefill computes it
        expected = [adapter.step(adapter.prefill(prompt)[1], fed)[0] for fed in tokens]
    logits, state = adapter.prefill(prompt)
    adapter.step(state, tokens[1])  # the caller's state moves on; the kept one must not
    hits = adapter.forward_memo.hits
    for fed, stepped in zip(tokens, expected):  # each serving's step must leave the next one alone too
        served_logits, served_state = adapter.prefill(prompt)
        torch.testing.assert_close(served_logits, logits, rtol=0, atol=0)
        torch.testing.assert_close(adapter.step(served_state, fed)[0], stepped, rtol=0, atol=0)
    assert adapter.forward_memo.hits == hits + 2
    adapter.prefill(prompt, rollback=True)  # prepared for rollback: another state, prefilled
    assert adapter.forward_memo.hits == hits + 2
    with forward_memo(False):  # a repeat made to measure a floor is computed
        adapter.prefill(prompt)
    assert adapter.forward_memo.hits == hits + 2


def test_a_decode_whose_state_a_check_operates_on_is_served_with_a_copy_of_that_state() -> None:
    adapter = HFAdapter(tiny_model("gpt2", "eager"))
    prompt, steps, token = (
        prompt_batch(),
        [torch.tensor([[10], [11]]), torch.tensor([[12], [13]])],
        torch.tensor([[14], [15]]),
    )
    with forward_memo(False):
        _, state = adapter.decoded_state(prompt, steps)
        expected = adapter.step(state, token)[0]
    first, state = adapter.decoded_state(prompt, steps)
    adapter.step(state, token + 2)  # the caller's state moves on; the kept one must not
    hits = adapter.forward_memo.hits
    served, served_state = adapter.decoded_state(prompt, steps)
    assert adapter.forward_memo.hits == hits + 1 and len(served) == 3
    for one, other in zip(first, served):
        torch.testing.assert_close(other, one, rtol=0, atol=0)
    torch.testing.assert_close(adapter.step(served_state, token)[0], expected, rtol=0, atol=0)
    assert len(adapter.decoded_state(prompt, steps[:1])[0]) == 2  # other steps: decoded, from the served prefill
    assert adapter.forward_memo.hits == hits + 2


def test_a_prefill_is_not_served_to_a_model_that_keeps_state_in_its_modules() -> None:
    # RecurrentGemma assigns its recurrent and convolution states to module attributes in
    # every forward: a copy of the returned cache does not reach them
    from maskcheck.reference_models.hf_tiny import shrunk_model

    adapter = HFAdapter(shrunk_model("recurrent_gemma", "causal-lm"))
    hits = adapter.forward_memo.hits
    adapter.prefill(prompt_batch())
    adapter.prefill(prompt_batch())
    assert adapter.forward_memo.hits == hits


def test_a_prefill_is_served_only_to_the_cache_implementation_that_made_it() -> None:
    adapter = HFAdapter(tiny_model("llama", "eager"))
    adapter.prefill(prompt_batch())
    static = adapter.with_cache_implementation("static")
    hits = adapter.forward_memo.hits
    _, state = static.prefill(prompt_batch())
    assert adapter.forward_memo.hits == hits
    assert "Static" in type(static.generation.cache_of(state)[1]).__name__


def test_a_state_the_model_also_holds_is_seen_and_a_state_is_sized_by_its_storages() -> None:
    from types import SimpleNamespace

    from maskcheck.harness.adapters.memo import shared_with_modules, state_bytes

    model = TrainingSensitive()
    cache = SimpleNamespace(keys=[torch.zeros(2, 3)], values=[torch.zeros(2, 3)])
    state = {"cache": cache, "mask": torch.ones(2, 4, dtype=torch.long)}
    assert not shared_with_modules(model, state)
    model._cache = cache  # a model that keeps the cache it hands out, for the next request to reset
    assert shared_with_modules(model, state)
    view = cache.keys[0][:1]  # a view of a storage already counted adds nothing
    assert state_bytes({**state, "view": view}) == 2 * 6 * 4 + 8 * 8
