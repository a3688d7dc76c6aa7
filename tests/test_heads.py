"""Models that do not end in a vocabulary head: what they return is measured, compared in its
own units, and audited with the verdict that matches what each really does."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from maskcheck import audit
from maskcheck.harness.adapters.base import Batch, Capabilities
from maskcheck.harness.adapters.module import DeclarationError, ModuleAdapter
from maskcheck.harness.adapters.outputs import PROBE_LENGTHS
from maskcheck.harness.adapters.specs import LoadOptions, SpecError, adapter_for, load_adapter
from maskcheck.harness.engine.tolerance import compare_rows
from maskcheck.reference_models import heads
from maskcheck.reference_models.hf_tiny import VOCAB, tiny_config

HEADS = "module:maskcheck.reference_models.heads"


@pytest.mark.parametrize(
    "factory, kind, width, units",
    [
        (heads.gpt2_reward_model, "row_scalars", 1, "raw"),
        (heads.bert_sequence_classifier, "row_scores", 3, "log_probabilities"),
        (heads.llama_sequence_classifier, "row_scores", 3, "log_probabilities"),
        (heads.bert_token_classifier, "label_scores", 5, "log_probabilities"),
        (heads.bert_base_model, "position_values", 32, "raw"),
        (heads.mean_pooled_encoder, "row_values", 3, "raw"),
        (heads.value_head, "position_scalars", 1, "raw"),
        (
            lambda: heads.tiny_head("bert", "sequence-classification", 4, "multi_label_classification"),
            "row_values",  # independent sigmoids, not one distribution: compared raw
            4,
            "raw",
        ),
    ],
)
def test_what_a_model_returns_is_measured_and_named(factory, kind: str, width: int, units: str) -> None:  # type: ignore[no-untyped-def]
    output = adapter_for(factory()).capabilities.output_kind
    assert (output.name, output.width, output.units) == (kind, width, units), output.describe()


@pytest.mark.parametrize("labels", PROBE_LENGTHS)
def test_a_label_count_equal_to_a_probe_length_is_not_taken_for_the_sequence(labels: int) -> None:
    """Measured at two lengths: ``num_labels`` equal to one of them cannot pass for a sequence dimension."""
    output = adapter_for(heads.tiny_head("bert", "sequence-classification", labels)).capabilities.output_kind
    assert (output.name, output.width, output.per_position) == ("row_scores", labels, False)


def test_a_single_value_is_never_compared_as_log_probabilities() -> None:
    """log_softmax over one value is 0 whatever the value: it would pass every leak."""
    with pytest.raises(ValueError, match="single value"):
        compare_rows(torch.zeros(3, 1), torch.ones(3, 1), normalise=True)
    diff, max_diff, _ = compare_rows(torch.zeros(3, 1), torch.ones(3, 1), normalise=False)
    assert max_diff == 1.0


class ShiftedByPadding(nn.Module):
    """An embedding whose every component moves by the number of padded slots: a leak that a
    log-softmax over the vector cannot see (it is a constant shift), and raw comparison does."""

    def __init__(self, declared: str | None = None) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(VOCAB, 4)
        self.maskcheck_capabilities = {"family": "encoder", "vocab_size": VOCAB, "pad_token_id": 0}
        if declared is not None:
            self.maskcheck_output_kind = declared

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        real = torch.ones_like(input_ids) if attention_mask is None else attention_mask  # [B, T]
        pooled = (self.embed(input_ids) * real[..., None]).sum(1) / real.sum(1, keepdim=True)  # [B, 4]
        return pooled + (real.shape[1] - real.sum(1, keepdim=True))  # [B, 4], + padded slots


def test_outputs_are_compared_in_their_own_units() -> None:
    """A vector is compared raw unless declared class scores: the same shift fails raw and,
    declared as scores, passes as log-probabilities (so the declaration is what decides)."""
    raw = audit(ShiftedByPadding(), ["padding"], profile="quick")
    assert raw.suite("padding").status == "fail"
    assert "max |d output|" in next(c.message for c in raw.suite("padding").checks if c.name == "padded_vs_unpadded")
    as_scores = audit(ShiftedByPadding(declared="row_scores"), ["padding"], profile="quick")
    assert as_scores.suite("padding").status in ("pass", "warn"), as_scores.suite("padding").checks


def test_a_declaration_the_output_contradicts_is_one_line() -> None:
    model = ShiftedByPadding(declared="position_scalars")
    with pytest.raises(SpecError, match=r"maskcheck_output_kind='position_scalars'.*returns \[2, 4\]"):
        adapter_for(model, "module:shifted")


def test_a_plain_module_returning_one_score_per_row_is_audited() -> None:
    """A ``[B]`` output was an IndexError in the mask measurement; it is a reward head."""
    adapter = ModuleAdapter(lambda ids, attention_mask=None: ids.float().mean(1), Capabilities("encoder", VOCAB))
    assert adapter.capabilities.output_kind.name == "row_scalars"
    out = adapter.logits(Batch(torch.ones(2, 3, dtype=torch.long)))
    assert out.shape == (2, 3, 1)  # the row's one value at each of its positions


def test_one_row_as_wide_as_the_vocabulary_asks_for_a_declaration() -> None:
    """[B, V]: most likely a language model's last position, which a per-row audit would judge
    without its causal pattern; one line asks which it is."""
    with pytest.raises(DeclarationError, match="one position's logits of a language model"):
        ModuleAdapter(lambda ids, attention_mask=None: torch.zeros(ids.shape[0], VOCAB), Capabilities("decoder", VOCAB))
    declared = ModuleAdapter(
        lambda ids, attention_mask=None: torch.zeros(ids.shape[0], VOCAB),
        Capabilities("decoder", VOCAB),
        output_kind="row_values",
    )
    assert declared.capabilities.output_kind.name == "row_values" and declared.capabilities.output_kind.declared


def test_an_output_without_a_readable_tensor_is_one_line() -> None:
    with pytest.raises(DeclarationError, match=r"returned a dict \{'scores': 'str'\}"):
        ModuleAdapter(lambda ids, attention_mask=None: {"scores": "x"}, Capabilities("encoder", VOCAB))


def test_a_classifier_checkpoint_is_loaded_with_its_own_head(tmp_path: Path) -> None:
    """config.json names LlamaForSequenceClassification: it is loaded as that class, so the
    checkpoint fit judges its score head (loaded as a causal LM, score.weight was unread)."""
    heads.llama_sequence_classifier().save_pretrained(tmp_path)
    adapter = load_adapter(f"hf:{tmp_path}", LoadOptions())
    assert adapter.task == "sequence-classification"
    assert adapter.describe()["architecture"] == "LlamaForSequenceClassification"
    assert adapter.loading_info.missing == () and adapter.loading_info.unexpected == ()
    result = audit(adapter, ["norm_checkpoint"], profile="quick")
    assert next(c for c in result.suite("norm_checkpoint").checks if c.name == "load").status == "pass"


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: _transformers("BertForMultipleChoice", tiny_config("bert")), "BertForMultipleChoice takes inputs"),
        (lambda: _transformers("BartForSequenceClassification", tiny_config("bart")), "of an encoder-decoder"),
    ],
)
def test_heads_maskcheck_does_not_audit_are_refused_in_one_line(build, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SpecError, match=message):
        adapter_for(build(), "module:x")


def _transformers(name: str, config):  # type: ignore[no-untyped-def]
    import transformers

    return getattr(transformers, name)(config)


# -- verdicts, each written down with its reason before it was run --------------------------------

#: (spec, suite) -> (expected status, a phrase the suite's reason must hold), and why
EXPECTED = {
    # transformers' decoder classifiers score the last token that is not pad_token_id: right for
    # either padding side, so long as every padded slot holds the pad id; other ids there move it.
    ("gpt2_reward_model", "padding"): ("warn", "every padded slot holds the pad id"),
    ("llama_sequence_classifier", "padding"): ("warn", "every padded slot holds the pad id"),
    # BERT's classifier pools the first slot ([CLS]): right padding (an encoder's default side)
    # keeps it there; under left padding the first slot is padding.
    ("bert_sequence_classifier", "padding"): ("warn", "padded on the right (an encoder's default)"),
    ("cls_pooled_encoder", "padding"): ("warn", "padded on the right (declared padding_side)"),
    # A mean over real tokens and a decoder reward reading the last real token by the mask hold on
    # both sides; they take position ids without deriving them from the mask, which only warns.
    ("mean_pooled_encoder", "padding"): ("warn", "does not derive positions from attention_mask"),
    ("last_token_reward", "padding"): ("warn", "does not derive positions from attention_mask"),
    # sentence-transformers 6's Pooling finds its tokens by the mask: cls gathers the first real
    # token (attention_mask.argmax), so it holds on either side; BERT underneath takes position
    # ids without deriving them, which only warns.
    ("mean_sentence_transformer", "padding"): ("warn", "does not derive positions from attention_mask"),
    ("cls_sentence_transformer", "padding"): ("warn", "does not derive positions from attention_mask"),
    # Per-position outputs of an encoder read both ways, and of a decoder only the past.
    ("bert_token_classifier", "causal"): ("pass", ""),
    ("bert_base_model", "causal"): ("pass", ""),
    ("value_head", "causal"): ("pass", ""),
    ("gpt2_token_classifier", "causal"): ("pass", ""),
    # A tagger's loss scores each token against its own label (never shifted, whatever the
    # family), -100 at padding as DataCollatorForTokenClassification pads and at sub-word
    # continuations as word_ids alignment leaves them.
    ("bert_token_classifier", "loss_masking"): ("pass", ""),
    ("gpt2_token_classifier", "loss_masking"): ("pass", ""),
    ("token_tagger", "loss_masking"): ("pass", ""),
}


@pytest.mark.parametrize("name, suite", sorted(EXPECTED))
def test_clean_heads_get_the_verdict_their_behaviour_earns(name: str, suite: str) -> None:
    status, phrase = EXPECTED[(name, suite)]
    result = audit(f"{HEADS}:{name}", [suite])
    found = result.suite(suite)
    reasons = " | ".join(c.message for c in found.checks)
    assert found.status == status, (name, [(c.name, c.status, c.message) for c in found.checks])
    assert phrase in reasons, reasons


def test_the_pad_id_condition_says_what_an_eos_pad_id_means() -> None:
    """A pad id that is also the EOS id: a row ending in EOS is scored at the token before it,
    measured (the same output as the row without its EOS), not assumed from the config."""
    model = heads.gpt2_reward_model()
    model.config.pad_token_id = model.config.eos_token_id
    pooling = next(c for c in audit(model, ["padding"], profile="quick").suite("padding").checks if c.name == "pooling")
    assert pooling.status == "warn" and "scored at the token before it (measured" in pooling.message


def test_a_sentence_transformer_is_audited_as_users_load_it() -> None:
    """Its forward takes a features dict; the embedding audited is the one encode() returns."""
    model = heads.sentence_transformer("cls")
    adapter = adapter_for(model)
    assert adapter.capabilities.output_kind.describe().startswith("row_values")
    assert adapter.capabilities.output_kind.source == "sentence_embedding"
    ids = torch.tensor([[5, 6, 7]])
    encoded = model.encode(["w5 w6 w7"], convert_to_tensor=True)  # [1, D]: the tokenizer's own ids
    assert model.tokenizer("w5 w6 w7")["input_ids"] == ids[0].tolist()
    torch.testing.assert_close(adapter.logits(Batch(ids))[:, -1], encoded)
    pooling = next(c for c in audit(model, ["padding"], profile="quick").suite("padding").checks if c.name == "pooling")
    assert pooling.status == "pass" and "decided by the attention mask" in pooling.convention


def test_a_reward_models_failure_names_the_pooled_output_and_the_side() -> None:
    result = audit("mutant:heads_reward_last_slot", ["padding"], profile="quick")
    pooling = next(c for c in result.suite("padding").checks if c.name == "pooling")
    assert pooling.status == "fail" and result.exit_code == 1
    assert pooling.message.startswith("right padding changes the pooled output (row_scalars")
    assert "a decoder has no default padding side" in pooling.message


def test_compare_judges_pooled_outputs_and_names_where_they_part() -> None:
    """The same weights pooled over real tokens (A) and over every slot (B): compare parts on
    the padding checks, in raw units, and the first module whose output differs is the head
    (the pooling runs in the forward between the backbone and it)."""
    from maskcheck import compare

    same = compare(heads.PooledHead("bert", "mean"), heads.PooledHead("bert", "mean"), ["padding"], profile="quick")
    assert same.status == "pass"
    parted = compare(
        heads.PooledHead("bert", "mean"), heads.PooledHead("bert", "mean_over_padding"), ["padding"], profile="quick"
    )
    pad_ids = next(c for s in parted.suites for c in s.checks if c.name == "pad_ids")
    assert parted.status == "fail" and pad_ids.status == "fail"
    assert "max |d output|" in pad_ids.message and "first differing module: head" in pad_ids.message


def test_the_command_line_offers_every_task_the_loader_knows() -> None:
    """--task takes the loader's tasks and the collator's one more, read from one list."""
    from maskcheck.harness.adapters.task_names import TASKS
    from maskcheck.harness.cli.main import build_parser

    parser = build_parser()
    assert [parser.parse_args(["audit", "hf:x", "--task", task]).task for task in TASKS] == list(TASKS)
    with pytest.raises(SystemExit):
        parser.parse_args(["audit", "hf:x", "--task", "multiple-choice"])


def test_a_model_that_reads_no_token_ids_is_refused_in_one_line() -> None:
    """CANINE reads characters: its config has no vocab_size to draw token ids from."""
    import transformers

    config = transformers.CanineConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, downsampling_rate=2
    )
    with pytest.raises(SpecError, match="config has no vocab_size"):
        adapter_for(transformers.CanineForSequenceClassification(config), "module:canine")


def test_task_names_the_head_a_checkpoint_cannot(tmp_path: Path) -> None:
    """A config.json without architectures: --task loads the classifier with its own score head."""
    import json

    heads.bert_sequence_classifier().save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config.pop("architectures")
    (tmp_path / "config.json").write_text(json.dumps(config))
    adapter = load_adapter(f"hf:{tmp_path}", LoadOptions(task="sequence-classification"))
    assert adapter.describe()["architecture"] == "BertForSequenceClassification"
    assert adapter.loading_info.missing == () and adapter.capabilities.output_kind.name == "row_scores"


class EmbeddingLayouts(nn.Module):
    """A decoder-free encoder whose embedding is reached in one of two layouts the gradient
    checks must measure: ids padded on the right before embedding (Longformer pads to its
    attention window) or an embedding that returns (embeddings, scale) (I-BERT's QuantEmbedding)."""

    def __init__(self, layout: str, leaks: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layout, self.leaks = layout, leaks
        self.embedding = QuantLike(VOCAB, 8) if layout == "tuple" else nn.Embedding(VOCAB, 8)
        self.maskcheck_capabilities = {"family": "encoder", "vocab_size": VOCAB, "pad_token_id": 0}
        self.maskcheck_embedding = "embedding"

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        real = torch.ones_like(input_ids) if attention_mask is None else attention_mask  # [B, T]
        if self.layout == "padded":  # lengthened on the right to a multiple of 16
            extra = -input_ids.shape[1] % 16 or 16
            input_ids = torch.cat([input_ids, input_ids.new_zeros(input_ids.shape[0], extra)], dim=1)
            real = torch.cat([real, real.new_zeros(real.shape[0], extra)], dim=1)
        embedded = self.embedding(input_ids)
        embedded = embedded[0] if isinstance(embedded, tuple) else embedded  # [B, T', 8]
        weights = torch.ones_like(real) if self.leaks else real  # a leak: every slot pooled
        return (embedded * weights[..., None]).sum(1) / weights.sum(1, keepdim=True)  # [B, 8]


class QuantLike(nn.Embedding):
    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        return super().forward(ids), torch.ones(())


@pytest.mark.parametrize("layout", ["padded", "tuple"])
def test_the_gradient_checks_measure_embeddings_reached_in_other_layouts(layout: str) -> None:
    """The backward check runs (no error) on both layouts, passes the clean model, and fails
    the one whose pooling reads padded slots."""
    clean = audit(EmbeddingLayouts(layout), ["padding"], profile="quick").suite("padding")
    gradients = next(c for c in clean.checks if c.name == "padded_gradients")
    assert gradients.status == "pass", gradients.message
    leaky = audit(EmbeddingLayouts(layout, leaks=True), ["padding"], profile="quick").suite("padding")
    assert next(c for c in leaky.checks if c.name == "padded_gradients").status == "fail"


def test_a_low_precision_models_pooled_position_is_measured_on_its_float32_copy() -> None:
    """bfloat16's rounding hides BERT's first slot read from the padding under left padding
    (0.015 of a log-probability); measured on the float32 copy, the side condition holds and the
    drawn cases keep to the right, so the audit warns as in float32 instead of failing."""
    padding = audit(
        f"{HEADS}:bert_sequence_classifier", ["padding"], options=LoadOptions(dtype="bfloat16"), profile="quick"
    ).suite("padding")
    pooling = next(c for c in padding.checks if c.name == "pooling")
    assert padding.status == "warn" and "padded on the right" in pooling.message, pooling.message


def test_a_float32_failure_near_its_threshold_is_judged_again_in_float64() -> None:
    """MiniCPM3's two-label classifier: a right-padded row differs from the row alone by 1.4x the
    threshold in float32 and by 1e-14 in float64 (multi-head latent attention's rounding, larger
    than its outputs' scale shows): rounding, so the check passes and says why. ConvBERT's
    convolution reads padded slots: its difference keeps its size in float64, so it still fails."""
    import json

    from maskcheck.harness.adapters.hf import HFAdapter
    from maskcheck.reference_models.hf_tiny import shrunk_model

    shrink = {
        r["type"]: r.get("shrink", "full")
        for r in map(json.loads, (Path(__file__).parent.parent / "docs/architectures.jsonl").read_text().splitlines())
        if r["task"] == "sequence-classification" and r.get("built")
    }
    for model_type, status, words in (
        ("minicpm3", "pass", "rounding, not a leak"),
        ("convbert", "fail", "a right-padded row differs from the same row unpadded"),
    ):
        model = shrunk_model(model_type, "sequence-classification", level=shrink[model_type])
        padding = audit(HFAdapter(model, task="sequence-classification"), ["padding"], profile="ci").suite("padding")
        check = next(c for c in padding.checks if c.name == "padded_vs_unpadded")
        assert check.status == status and words in check.message, (model_type, check.message)


def test_a_head_configured_to_return_tuples_is_read_by_position() -> None:
    """return_dict=False: the output is a tuple, read as its first item at every call."""
    model = heads.tiny_head("bert", "sequence-classification", 3)
    model.config.return_dict = False
    adapter = adapter_for(model)
    assert adapter.capabilities.output_kind.source == "the first item returned"
    assert adapter.logits(Batch(torch.tensor([[5, 6, 7]]))).shape == (1, 3, 3)
