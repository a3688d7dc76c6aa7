"""Tiny Hugging Face configs (random weights), the one place the project keeps them.

Default configs such as ``LlamaConfig()`` describe multi-billion-parameter models;
these have two layers and a width of 32, so a forward pass takes milliseconds.
Needs ``transformers``; nothing else in ``reference_models`` imports this module.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

VOCAB = 96
COMMON = {"vocab_size": VOCAB, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}


def _decoder(cls_name: str, **extra: Any) -> Callable[[], Any]:
    def make() -> Any:
        import transformers

        cls = getattr(transformers, cls_name)
        return cls(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
            **COMMON,
            **extra,
        )

    return make


def _gpt2() -> Any:
    from transformers import GPT2Config

    return GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=64, **COMMON)


def _bert() -> Any:
    from transformers import BertConfig

    return BertConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=64, **COMMON)


def _t5() -> Any:
    from transformers import T5Config

    return T5Config(
        d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4, decoder_start_token_id=0, **COMMON
    )


def _bart() -> Any:
    from transformers import BartConfig

    return BartConfig(
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=64,
        decoder_start_token_id=2,
        forced_eos_token_id=None,
        **COMMON,
    )


#: name -> (config factory, task)
TINY_CONFIGS: dict[str, tuple[Callable[[], Any], str]] = {
    "gpt2": (_gpt2, "causal-lm"),
    "llama": (_decoder("LlamaConfig"), "causal-lm"),
    "qwen2": (_decoder("Qwen2Config"), "causal-lm"),
    "mistral": (_decoder("MistralConfig", sliding_window=4), "causal-lm"),
    "bert": (_bert, "masked-lm"),
    "t5": (_t5, "seq2seq"),
    "bart": (_bart, "seq2seq"),
}


def tiny_config(name: str) -> Any:
    if name not in TINY_CONFIGS:
        raise KeyError(f"unknown tiny Hugging Face model {name!r}; known: {', '.join(TINY_CONFIGS)}")
    return TINY_CONFIGS[name][0]()


def tiny_model(name: str, attn_implementation: str | None = None, seed: int = 0) -> Any:
    """A random-init tiny model in eval mode (a model from ``from_config`` starts in train mode)."""
    import transformers

    config = tiny_config(name)
    auto = {
        "causal-lm": transformers.AutoModelForCausalLM,
        "masked-lm": transformers.AutoModelForMaskedLM,
        "seq2seq": transformers.AutoModelForSeq2SeqLM,
    }[TINY_CONFIGS[name][1]]
    torch.manual_seed(seed)
    kwargs = {"attn_implementation": attn_implementation} if attn_implementation else {}
    return auto.from_config(config, **kwargs).eval()
