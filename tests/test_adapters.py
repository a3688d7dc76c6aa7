"""Adapters and specs: Hugging Face round trips through hf:DIR, caches, modules, errors."""

from __future__ import annotations

import json
import textwrap
from types import SimpleNamespace

import pytest
import torch

from maskcheck import audit
from maskcheck.harness.adapters.base import AdapterError, Batch, Capabilities, extend
from maskcheck.harness.adapters.hf import HFAdapter
from maskcheck.harness.adapters.module import DeclarationError, ModuleAdapter
from maskcheck.harness.adapters.specs import LoadOptions, SpecError, load_adapter, parse_spec
from maskcheck.reference_models.hf_tiny import TINY_CONFIGS, tiny_model

HF_NAMES = ["gpt2", "llama", "bert", "t5", "bart"]
FAMILY = {"causal-lm": "decoder", "masked-lm": "encoder", "seq2seq": "encoder_decoder"}


def batch_for(family: str, vocab: int, batch: int = 2, length: int = 6) -> Batch:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (batch, length), generator=g)
    mask = torch.ones_like(ids)
    if family == "encoder_decoder":
        return Batch(ids, mask, decoder_input_ids=ids[:, :4], decoder_attention_mask=mask[:, :4])
    return Batch(ids, mask)


@pytest.fixture(scope="module")
def saved_models(tmp_path_factory):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("hf")
    paths = {}
    for name in HF_NAMES:
        model = tiny_model(name)
        model.save_pretrained(root / name, safe_serialization=True)
        paths[name] = (root / name, model)
    return paths


@pytest.mark.parametrize("name", HF_NAMES)
def test_hf_directory_round_trip(saved_models, name: str) -> None:  # type: ignore[no-untyped-def]
    path, original = saved_models[name]
    assert list(path.glob("*.safetensors")), "saved as safetensors"
    adapter = load_adapter(f"hf:{path}")
    family = FAMILY[TINY_CONFIGS[name][1]]
    assert adapter.capabilities.family == family
    assert not adapter.model.training, "the adapter puts models in eval mode"
    batch = batch_for(family, adapter.capabilities.vocab_size)
    logits = adapter.logits(batch)
    assert logits.shape == (*batch.predicted_ids.shape, adapter.capabilities.vocab_size)
    with torch.no_grad():
        expected = original(
            **{k: v for k, v in vars(batch).items() if v is not None and k != "segment_ids" and k != "position_ids"}
        ).logits
    torch.testing.assert_close(logits, expected)


def test_sharded_checkpoint_loads(tmp_path) -> None:  # type: ignore[no-untyped-def]
    model = tiny_model("llama")
    model.save_pretrained(tmp_path, safe_serialization=True, max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    adapter = load_adapter(f"hf:{tmp_path}")
    batch = batch_for("decoder", adapter.capabilities.vocab_size)
    with torch.no_grad():
        torch.testing.assert_close(adapter.logits(batch), model(input_ids=batch.input_ids).logits)


@pytest.mark.parametrize("name", ["gpt2", "llama", "t5", "bart"])
def test_hf_prefill_and_steps_equal_full_forward(name: str) -> None:
    adapter = HFAdapter(tiny_model(name))
    family = adapter.capabilities.family
    batch = batch_for(family, adapter.capabilities.vocab_size, length=7)
    full = adapter.logits(batch)
    tokens = batch.predicted_ids
    first = (
        Batch(batch.input_ids[:, :3], batch.attention_mask[:, :3])
        if family == "decoder"
        else Batch(
            batch.input_ids,
            batch.attention_mask,
            decoder_input_ids=tokens[:, :2],
            decoder_attention_mask=torch.ones_like(tokens[:, :2]),
        )
    )
    split = first.predicted_ids.shape[1]
    logits, state = adapter.prefill(first)
    pieces = [logits]
    for start in range(split, tokens.shape[1]):
        step_logits, state = adapter.step(state, tokens[:, start : start + 1])
        pieces.append(step_logits)
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, atol=1e-5, rtol=1e-4)


def test_a_step_with_no_mask_is_a_step_whose_tokens_are_all_real() -> None:
    mask, next_position = torch.tensor([[0, 1, 1], [1, 1, 1]]), torch.tensor([2, 3])  # left-padded row 0
    unmasked = extend(mask, next_position, None, 2)
    all_real = extend(mask, next_position, torch.ones(2, 2, dtype=torch.long), 2)
    for a, b in zip(unmasked, all_real):
        assert torch.equal(a, b)
    assert unmasked[1].tolist() == [[2, 3], [3, 4]] and unmasked[2].tolist() == [4, 5]
    # An appended pad slot takes no position: the real token after it continues the count.
    full, positions, after = extend(mask, next_position, torch.tensor([[0, 1], [1, 1]]), 2)
    assert full.tolist() == [[0, 1, 1, 0, 1], [1, 1, 1, 1, 1]]
    assert positions[0, 1] == 2 and positions[1].tolist() == [3, 4] and after.tolist() == [3, 5]


class OldCacheKeyword(torch.nn.Module):
    """A model whose forward names its cache ``past_key_values``, as early transformers 5.x did."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = tiny_model("llama")
        self.config = self.inner.config

    def forward(
        self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None, use_cache=None, labels=None
    ):  # type: ignore[no-untyped-def]
        out = self.inner(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=past_key_values,
            use_cache=use_cache,
            labels=labels,
        )
        return SimpleNamespace(logits=out.logits, loss=out.loss, past_key_values=out.cache)  # the old output attribute

    def get_output_embeddings(self):  # type: ignore[no-untyped-def]
        return self.inner.get_output_embeddings()


@pytest.mark.parametrize(
    "model_factory, keyword", [(lambda: tiny_model("llama"), "cache"), (OldCacheKeyword, "past_key_values")]
)
def test_cache_keyword_is_read_from_the_forward_signature(model_factory, keyword: str) -> None:  # type: ignore[no-untyped-def]
    adapter = HFAdapter(model_factory(), task="causal-lm")
    assert adapter.cache_keyword == keyword
    batch = batch_for("decoder", adapter.capabilities.vocab_size, length=5)
    full = adapter.logits(batch)
    logits, state = adapter.prefill(Batch(batch.input_ids[:, :3], batch.attention_mask[:, :3]))
    forked = adapter.fork(state)
    step, _ = adapter.step(state, batch.input_ids[:, 3:5])
    torch.testing.assert_close(torch.cat([logits, step], 1), full, atol=1e-5, rtol=1e-4)
    again, _ = adapter.step(forked, batch.input_ids[:, 3:5])  # the fork is untouched by the first branch
    torch.testing.assert_close(again, step)


def test_declared_attention_pattern_from_config() -> None:
    assert HFAdapter(tiny_model("mistral")).capabilities.attention == "sliding_window"
    assert HFAdapter(tiny_model("mistral")).capabilities.window == 4
    assert HFAdapter(tiny_model("llama")).capabilities.attention == "causal"
    assert HFAdapter(tiny_model("bert")).capabilities.attention == "bidirectional"


def test_adapter_refuses_a_model_switched_back_to_train_mode() -> None:
    adapter = HFAdapter(tiny_model("llama"))
    adapter.model.train()
    with pytest.raises(AdapterError, match="train mode"):
        adapter.logits(batch_for("decoder", adapter.capabilities.vocab_size))


def test_module_adapter_translates_key_padding_mask() -> None:
    seen = {}

    def model(input_ids, key_padding_mask):  # type: ignore[no-untyped-def]
        seen["mask"] = key_padding_mask
        return torch.zeros(*input_ids.shape, 5)

    adapter = ModuleAdapter(model, Capabilities(family="decoder", vocab_size=5), mask_convention="ignore")
    adapter.logits(Batch(torch.zeros(1, 3, dtype=torch.long), torch.tensor([[0, 1, 1]])))
    assert seen["mask"].tolist() == [[True, False, False]]


def test_an_output_that_fits_no_kind_is_refused_in_one_line() -> None:
    """Measured at two lengths, a shape that follows neither the batch nor the length is no
    output kind: one line at construction, not an error in every suite."""
    with pytest.raises(DeclarationError, match=r"shape \[1, 2, 3\] for ids \[2, 5\] .* fits no output kind"):
        ModuleAdapter(
            lambda ids, mask: torch.zeros(1, 2, 3), Capabilities(family="decoder", vocab_size=5), mask_convention="keep"
        )


def test_an_output_that_changes_shape_after_measurement_is_an_adapter_error() -> None:
    calls = []

    def model(ids, mask=None):  # type: ignore[no-untyped-def]
        calls.append(ids.shape)
        width = 5 if len(calls) <= 2 else 4  # the measurement's two calls, then another width
        return torch.zeros(ids.shape[0], ids.shape[1], width)

    adapter = ModuleAdapter(model, Capabilities(family="decoder", vocab_size=5), mask_convention="keep")
    with pytest.raises(AdapterError, match=r"expected \[B, T, V\] = \[1, 3, 5\]"):
        adapter.logits(Batch(torch.zeros(1, 3, dtype=torch.long)))


@pytest.mark.parametrize(
    "spec, message",
    [
        ("nonsense", "expected SCHEME:TARGET"),
        ("foo:bar", "unknown spec scheme 'foo'"),
        ("ref:no-such-preset", "unknown reference preset"),
        ("ref:/no/such/file.safetensors", "no checkpoint file"),
        ("mutant:no_such_bug", "unknown mutant"),
        ("hf:/no/such/dir", "no such directory"),
        ("module:nomodule", "module:package.module:factory"),
        ("module:no_such_module_xyz:build", "cannot import"),
    ],
)
def test_bad_specs_are_one_line_errors(spec: str, message: str) -> None:
    with pytest.raises(SpecError, match=message) as info:
        load_adapter(spec)
    assert "\n" not in str(info.value)


def test_hf_directory_errors(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SpecError, match="no config.json"):
        load_adapter(f"hf:{tmp_path}")
    tiny_model("llama").save_pretrained(tmp_path, safe_serialization=True)
    for weights in tmp_path.glob("*.safetensors"):
        weights.unlink()
    (tmp_path / "pytorch_model.bin").write_bytes(b"not really a pickle")
    with pytest.raises(SpecError, match="pickle weights"):
        load_adapter(f"hf:{tmp_path}")
    config = json.loads((tmp_path / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_evil.Evil"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(SpecError, match="--trust-remote-code"):
        load_adapter(f"hf:{tmp_path}")


def test_module_spec_from_the_current_directory(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "my_models.py").write_text(
        textwrap.dedent(
            """
            from maskcheck.reference_models.hf_tiny import tiny_model
            from maskcheck.reference_models import Transformer, preset

            def hf():
                return tiny_model("gpt2")

            def reference():
                return Transformer(preset("tiny-decoder"))

            def broken():
                raise RuntimeError("no weights here")
            """
        )
    )
    monkeypatch.chdir(tmp_path)
    assert load_adapter("module:my_models:hf").capabilities.family == "decoder"
    assert type(load_adapter("module:my_models:reference")).__name__ == "ReferenceAdapter"
    with pytest.raises(SpecError, match="raised RuntimeError: no weights here"):
        load_adapter("module:my_models:broken")


def test_parse_spec_keeps_colons_in_targets() -> None:
    assert parse_spec("hf:/a:b").target == "/a:b"


def test_reference_override_changes_the_layout() -> None:
    adapter = load_adapter("ref:tiny-decoder", LoadOptions(overrides={"norm_layout": "post", "final_norm": "false"}))
    assert adapter.model.config.norm_layout == "post" and adapter.model.config.final_norm is False
    with pytest.raises(SpecError, match="unknown override"):
        load_adapter("ref:tiny-decoder", LoadOptions(overrides={"colour": "blue"}))


@pytest.mark.parametrize("name", sorted(TINY_CONFIGS))
def test_one_rule_gives_a_model_and_its_saved_config_the_same_task(name: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The task of a model handed in (its class's name) and of the directory it saves (its
    config's ``architectures``) come from one rule, and are the task the model was built for."""
    import transformers

    from maskcheck.harness.adapters.hf_loading import infer_task

    model = tiny_model(name)
    model.save_pretrained(tmp_path)
    saved = transformers.AutoConfig.from_pretrained(tmp_path)
    expected = TINY_CONFIGS[name][1]
    assert infer_task(model.config, [type(model).__name__]) == infer_task(saved) == expected
    assert HFAdapter(model).task == expected


def test_the_task_rule_reads_heads_then_the_bert_family_fallback() -> None:
    from maskcheck.harness.adapters.hf_loading import infer_task

    def config(**fields):  # type: ignore[no-untyped-def]
        return SimpleNamespace(**fields)

    assert infer_task(config(architectures=["BertForPreTraining"])) == "masked-lm"
    assert infer_task(config(architectures=["GPTNeoXForCausalLM"])) == "causal-lm"
    assert infer_task(config(is_encoder_decoder=True), ["SomethingForCausalLM"]) == "seq2seq"
    assert infer_task(config(model_type="roberta", is_decoder=False)) == "masked-lm"
    assert infer_task(config(model_type="roberta", is_decoder=True)) == "causal-lm"
    # a head's name is read before the family: a base model is loaded as one, never with a random LM head
    assert infer_task(config(model_type="roberta", is_decoder=False, architectures=["RobertaModel"])) == (
        "feature-extraction"
    )
    assert infer_task(config(is_encoder_decoder=True), ["BartForSequenceClassification"]) == "sequence-classification"
    assert infer_task(config(), ["GPT2ForTokenClassification"]) == "token-classification"
    # a decoder-only multimodal class is not an encoder-decoder: its name does not make it one
    assert infer_task(config(architectures=["Gemma3ForConditionalGeneration"])) == "causal-lm"


def test_logits_to_keep_is_used_where_it_measures_right() -> None:
    """The first request for the last positions runs the model with and without
    logits_to_keep; a model whose kept logits are the full forward's keeps it, and the
    report says so."""
    adapter = HFAdapter(tiny_model("gpt2"))
    batch = batch_for("decoder", adapter.capabilities.vocab_size)
    full = adapter.logits(batch)  # [2, 6, V]
    torch.testing.assert_close(adapter.logits(batch, keep=2), full[:, -2:], atol=1e-5, rtol=0)
    assert adapter.logits_to_keep.right is True
    on_path = adapter.on_path(adapter.paths()[1].path)  # the paths share the measurement
    assert on_path.logits_to_keep is adapter.logits_to_keep
    assert adapter.describe_kept_logits().startswith("logits_to_keep: only the compared last positions")


def test_a_wrong_logits_to_keep_is_measured_and_not_used() -> None:
    """A model whose logits_to_keep keeps the first positions, not the last: the adapter
    answers from the full forward every time, the serving checks (which compare a full
    forward's last positions) pass, and the report says why logits_to_keep was not used.
    (kv_cache's greedy_generation fails on this model, rightly: transformers' own
    generate() asks the prefill for logits_to_keep=1.)"""
    model = tiny_model("gpt2")
    forward = type(model).forward

    class FirstPositions(type(model)):  # type: ignore[misc]
        def forward(self, *args, logits_to_keep=0, **kwargs):  # type: ignore[no-untyped-def]
            out = forward(self, *args, **kwargs)
            if logits_to_keep:
                out.logits = out.logits[:, :logits_to_keep]
            return out

    model.__class__ = FirstPositions
    adapter = HFAdapter(model)
    result = audit(adapter, ["serving"])
    assert adapter.logits_to_keep.right is False
    assert {s.status for s in result.suites} == {"pass"}, [(c.name, c.message) for s in result.suites for c in s.checks]
    assert result.environment["logits_to_keep"].startswith("computed for every position, the compared ones sliced")
    assert "measured wrong" in result.environment["logits_to_keep"]
