"""Models that end in a head other than a vocabulary, and the seeded bugs of their heads.

A real transformers backbone (the tiny BERT encoder or GPT-2 decoder of hf_tiny.py, random
weights, seeded) and one head on top, written plainly. A head pools the backbone's hidden
states into one output per row (a classifier's scores, a reward, an embedding) or reads a
value at each position. Each seeded bug is one pooling mistake; its clean twin pools right:

======================  ==============================================  ==========================
pooling                 what it reads                                   mistake
======================  ==============================================  ==========================
``mean``                the mean over real tokens (the mask's weights)
``mean_over_padding``   the mean over every slot                        padded slots enter it
``max``                 the largest value over real tokens
``max_over_padding``    the largest value over every slot               padded slots enter it
``first``               the first slot (BERT's [CLS])                   the first slot is padding
                                                                        when rows are left-padded
``last``                the last real token (a decoder's reward)
``last_slot``           the last slot                                   the last slot is padding
                                                                        when rows are right-padded
``attention``           a softmax over real tokens' scores
``attention_over_padding``  a softmax over every slot's scores          padded slots get weight
======================  ==============================================  ==========================

Masks here are ``attention_mask [B, T]``, 1 = real token (Hugging Face's convention).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .hf_tiny import VOCAB, auto_class, tiny_config

POOLINGS = (
    "mean",
    "mean_over_padding",
    "max",
    "max_over_padding",
    "first",
    "last",
    "last_slot",
    "attention",
    "attention_over_padding",
)


class BackboneHead(nn.Module):
    """A tiny transformers base model (hf_tiny.py's ``backbone`` config, eager attention, random
    weights from seed 0) under a head of a subclass's, declared as a plain module declares itself
    (docs/modules.md): ``hidden_states`` is the backbone's last hidden states ``[B, T, D]``."""

    def __init__(self, backbone: str, **declared: Any) -> None:
        super().__init__()
        import transformers

        torch.manual_seed(0)
        self.backbone = transformers.AutoModel.from_config(tiny_config(backbone), attn_implementation="eager")
        self.hidden_size = self.backbone.config.hidden_size
        self.maskcheck_capabilities = {
            "family": "encoder" if backbone == "bert" else "decoder",
            "vocab_size": VOCAB,
            "pad_token_id": 0,
            "takes_position_ids": True,
            "max_length": 64,
            **declared,
        }

    def hidden_states(self, input_ids: Tensor, attention_mask: Tensor | None, position_ids: Tensor | None) -> Tensor:
        return self.backbone(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids
        ).last_hidden_state  # [B, T, D]


class PooledHead(BackboneHead):
    """A backbone's hidden states pooled into ``[B, width]`` (``[B]`` for ``width=None``: a reward).

    ``padding_side`` is what the model declares its inputs are padded on (its tokenizer's
    side), the condition a first-slot pooling is correct under."""

    def __init__(
        self, backbone: str = "bert", pooling: str = "mean", width: int | None = 3, padding_side: str | None = None
    ) -> None:
        if pooling not in POOLINGS:
            raise ValueError(f"unknown pooling {pooling!r}; one of {', '.join(POOLINGS)}")
        super().__init__(backbone, padding_side=padding_side)
        self.pooling = pooling
        self.score = nn.Linear(self.hidden_size, 1, bias=False)  # attention pooling's score of each position
        self.head = nn.Linear(self.hidden_size, width or 1)
        self.width = width
        self.eval()

    def forward(
        self, input_ids: Tensor, attention_mask: Tensor | None = None, position_ids: Tensor | None = None
    ) -> Tensor:
        real = torch.ones_like(input_ids) if attention_mask is None else attention_mask  # [B, T], 1 = real
        hidden = self.hidden_states(input_ids, real, position_ids)  # [B, T, D]
        pooled = pool(hidden, real.bool(), self.pooling, self.score)  # [B, D]
        out = self.head(pooled)  # [B, width]
        return out if self.width else out.squeeze(-1)  # [B] for a reward


def pool(hidden: Tensor, real: Tensor, pooling: str, score: nn.Linear) -> Tensor:
    """``hidden [B, T, D]`` pooled to ``[B, D]`` over the positions ``real [B, T]`` marks
    (True = real token), or, for the ``*_over_padding`` bugs, over every slot."""
    keep = real[..., None]  # [B, T, 1]
    if pooling == "mean":
        return (hidden * keep).sum(1) / keep.sum(1).clamp(min=1)
    if pooling == "mean_over_padding":
        return hidden.mean(1)
    if pooling == "max":
        return hidden.masked_fill(~keep, float("-inf")).amax(1)
    if pooling == "max_over_padding":
        return hidden.amax(1)
    if pooling == "first":
        return hidden[:, 0]
    if pooling == "last_slot":
        return hidden[:, -1]
    if pooling == "last":  # the last real token, whichever side the row is padded on
        positions = torch.arange(real.shape[1], device=real.device)  # [T]
        last = (positions * real).argmax(-1)  # [B]
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
    weights = score(hidden).squeeze(-1)  # [B, T]
    if pooling == "attention":
        weights = weights.masked_fill(~real, float("-inf"))
    return (torch.softmax(weights, -1)[..., None] * hidden).sum(1)  # attention, or attention_over_padding


class ValueHead(BackboneHead):
    """A decoder's value at each position ``[B, T]`` (a PPO critic, per-token rewards); with
    ``reads_next`` the value of position t is read from position t + 1's hidden state, which
    has seen the token after t."""

    def __init__(self, reads_next: bool = False) -> None:
        super().__init__("gpt2")
        self.value = nn.Linear(self.hidden_size, 1)
        self.reads_next = reads_next
        self.eval()

    def forward(
        self, input_ids: Tensor, attention_mask: Tensor | None = None, position_ids: Tensor | None = None
    ) -> Tensor:
        hidden = self.hidden_states(input_ids, attention_mask, position_ids)  # [B, T, D]
        if self.reads_next:
            hidden = torch.cat([hidden[:, 1:], hidden[:, -1:]], dim=1)  # [B, T, D]: position t holds t + 1's
        return self.value(hidden).squeeze(-1)  # [B, T]


class TokenTagger(BackboneHead):
    """An encoder labelling each token with one of ``labels`` classes and its own loss; with
    ``counts_padding`` the loss counts the -100 targets (padding, sub-word continuations) as
    label 0, as a loss that forgets ``ignore_index`` after a ``clamp`` does."""

    def __init__(self, labels: int = 5, counts_padding: bool = False) -> None:
        super().__init__("bert", has_loss=True)
        self.classifier = nn.Linear(self.hidden_size, labels)
        self.counts_padding = counts_padding
        self.maskcheck_output_kind = "label_scores"
        self.eval()

    def forward(
        self, input_ids: Tensor, attention_mask: Tensor | None = None, position_ids: Tensor | None = None
    ) -> Tensor:
        return self.classifier(self.hidden_states(input_ids, attention_mask, position_ids))  # [B, T, labels]

    def maskcheck_loss(self, scores: Tensor, labels: Tensor) -> Tensor:
        if self.counts_padding:
            labels = labels.clamp(min=0)
        return F.cross_entropy(scores.flatten(0, 1), labels.flatten(), ignore_index=-100)


def tiny_head(name: str, task: str, num_labels: int = 3, problem_type: str | None = None, seed: int = 0) -> Any:
    """A transformers head over a tiny config of hf_tiny.py (``task``: sequence-classification,
    token-classification or feature-extraction), random weights, in eval mode."""
    config = tiny_config(name)
    config.num_labels = num_labels
    if problem_type is not None:
        config.problem_type = problem_type
    torch.manual_seed(seed)
    return auto_class(task).from_config(config).eval()


# -- factories, for module: specs and the catalogue ------------------------------------------------


def mean_pooled_encoder() -> PooledHead:
    """An encoder classifier averaging its real tokens (a sentence-embedding recipe)."""
    return PooledHead("bert", "mean")


def cls_pooled_encoder() -> PooledHead:
    """An encoder classifier reading the first slot, right-padded as BERT's tokenizers pad."""
    return PooledHead("bert", "first", padding_side="right")


def last_token_reward() -> PooledHead:
    """A decoder reward model scoring each row's last real token (by the mask), left-padded."""
    return PooledHead("gpt2", "last", width=None, padding_side="left")


def attention_pooled_encoder() -> PooledHead:
    return PooledHead("bert", "attention")


def max_pooled_encoder() -> PooledHead:
    return PooledHead("bert", "max")


def value_head() -> ValueHead:
    return ValueHead()


def gpt2_reward_model() -> Any:
    """transformers' GPT-2 sequence classifier with one label (a TRL-style reward model)."""
    return tiny_head("gpt2", "sequence-classification", num_labels=1)


def bert_sequence_classifier() -> Any:
    return tiny_head("bert", "sequence-classification", num_labels=3)


def llama_sequence_classifier() -> Any:
    return tiny_head("llama", "sequence-classification", num_labels=3)


def bert_token_classifier() -> Any:
    return tiny_head("bert", "token-classification", num_labels=5)


def gpt2_token_classifier() -> Any:
    """transformers' GPT-2 token classifier: a decoder labelling each token (labels not shifted)."""
    return tiny_head("gpt2", "token-classification", num_labels=5)


def token_tagger() -> TokenTagger:
    return TokenTagger()


def bert_base_model() -> Any:
    """BERT without a head: the hidden states that embedding and retrieval pipelines pool."""
    return tiny_head("bert", "feature-extraction")


def sentence_transformer(pooling: str = "mean", padding_side: str = "right") -> Any:
    """A sentence-transformers model as users build and load it: a tiny BERT checkpoint and its
    tokenizer (padding on ``padding_side``) written to a folder, a Transformer -> Pooling
    (``pooling``: mean, cls, max ...) -> Normalize pipeline saved beside it, and that saved
    folder loaded with the hub offline. The folders are removed when the process exits."""
    import atexit
    import os
    import shutil
    import tempfile

    import transformers

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    from .hf_tiny import tiny_tokenizer

    root = tempfile.mkdtemp(prefix="maskcheck-st-")
    atexit.register(shutil.rmtree, root, True)
    torch.manual_seed(0)
    backbone = transformers.BertModel(tiny_config("bert"))
    backbone.save_pretrained(f"{root}/bert")
    tiny_tokenizer(padding_side=padding_side).save_pretrained(f"{root}/bert")
    built = SentenceTransformer(
        modules=[Transformer(f"{root}/bert"), Pooling(backbone.config.hidden_size, pooling), Normalize()]
    )
    built.save(f"{root}/embedder")
    return SentenceTransformer(f"{root}/embedder", device="cpu").eval()


def mean_sentence_transformer() -> Any:
    return sentence_transformer("mean")


def cls_sentence_transformer() -> Any:
    return sentence_transformer("cls")


#: the clean models of other output kinds the mutation score and the verdict record audit, as specs
CLEAN_HEADS = tuple(
    f"module:maskcheck.reference_models.heads:{name}"
    for name in (
        "mean_pooled_encoder",
        "max_pooled_encoder",
        "attention_pooled_encoder",
        "cls_pooled_encoder",
        "last_token_reward",
        "value_head",
        "gpt2_reward_model",
        "bert_sequence_classifier",
        "llama_sequence_classifier",
        "bert_token_classifier",
        "gpt2_token_classifier",
        "token_tagger",
        "bert_base_model",
        "mean_sentence_transformer",
        "cls_sentence_transformer",
    )
)
