"""Tiny Hugging Face configs (random weights), the one place the project keeps them.

Default configs such as ``LlamaConfig()`` describe multi-billion-parameter models;
these have two layers and a width of 32, so a forward pass takes milliseconds.
Needs ``transformers``; nothing else in ``reference_models`` imports this module.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

#: the config fields that carry a causal LM checkpoint's widths, epsilon, rope and special
#: ids: what a config written by hand for a checkpoint copies from it, the rest being its
#: class's defaults (the layout variants of harness/adapters/hf_variants.py keep the same)
CHECKPOINT_FIELDS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
    "tie_word_embeddings",
    "attention_bias",
    "mlp_bias",
    "rms_norm_eps",
    "rope_parameters",
    "rope_theta",
    "pad_token_id",
    "bos_token_id",
    "eos_token_id",
)
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

    return BertConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=64,
        **COMMON,
    )


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


# -- any architecture of the installed transformers, shrunk -------------------------------------

#: config attribute -> the small value it gets (only attributes a config already has are set)
SHRUNK_SIZES: dict[str, int] = {
    **dict.fromkeys(
        (
            "num_hidden_layers",
            "n_layer",
            "n_layers",
            "num_layers",
            "encoder_layers",
            "decoder_layers",
            "num_decoder_layers",
        ),
        2,
    ),
    **dict.fromkeys(
        (
            "hidden_size",
            "n_embd",
            "d_model",
            "embed_dim",
            "word_embed_proj_dim",
            "attention_hidden_size",
            "emb_dim",
            "dim",
            "embedding_size",
        ),
        64,
    ),
    **dict.fromkeys(
        (
            "intermediate_size",
            "ffn_dim",
            "encoder_ffn_dim",
            "decoder_ffn_dim",
            "d_ff",
            "n_inner",
            "hidden_dim",
            "dim_ff",
            "ffn_hidden_size",
        ),
        128,
    ),
    **dict.fromkeys(("moe_intermediate_size", "shared_expert_intermediate_size", "expert_intermediate_size"), 32),
    **dict.fromkeys(
        ("num_attention_heads", "n_head", "n_heads", "num_heads", "encoder_attention_heads", "decoder_attention_heads"),
        4,
    ),
    **dict.fromkeys(("num_key_value_heads", "n_kv_heads", "num_kv_heads"), 2),
    **dict.fromkeys(("head_dim", "kv_channels", "d_kv", "attention_head_dim"), 16),
    **dict.fromkeys(("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"), 4),
    **dict.fromkeys(("num_experts_per_tok", "num_experts_per_token", "moe_topk", "moe_k", "top_k"), 2),
    **dict.fromkeys(("qk_rope_head_dim", "qk_nope_head_dim"), 8),  # multi-head latent attention
    **dict.fromkeys(("v_head_dim", "kv_lora_rank", "q_lora_rank"), 16),
    # Gemma 3n/4 embed ids per layer too; Inkling 2 predicts over its unpadded vocabulary
    **dict.fromkeys(("vocab_size", "vocab_size_per_layer_input", "unpadded_vocab_size"), 128),
}
#: what the "counts" shrink keeps small: how many layers, experts and tokens, not how wide
COUNT_KEYS = frozenset(
    k
    for k in SHRUNK_SIZES
    if k.startswith("vocab_size")
    or "layers" in k
    or k.endswith("_layer")
    or "experts" in k
    or k in ("moe_topk", "moe_k", "top_k")
)
SHRINK_LEVELS = ("full", "counts")
SWEEP_WINDOW = 6  # a default sliding window shrunk so that the suites' short rows outgrow it
SWEEP_CHUNK = 6  # a default attention chunk (Llama 4's 8192) shrunk for the same reason
#: Kimi-Linear and Bailing-hybrid: multi-head latent attention without a query compression
#: (q_lora_rank None, kept) beside linear-attention layers whose heads are set outright.
LATENT_AND_LINEAR_WIDTHS: dict[str, Any] = {
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 8,
    "qk_head_dim": 16,
    "head_dim": 8,
    "v_head_dim": 16,
    "kv_lora_rank": 16,
    "num_key_value_heads": 4,
    "linear_head_dim": 16,
    "linear_num_heads": 4,
}
#: per-type overrides where the generic shrink does not give a buildable config
SWEEP_OVERRIDES: dict[str, dict[str, Any]] = {
    # attention every 8 layers from the 4th: two layers would hold none (the cache then fails)
    "jamba": {"attn_layer_offset": 1, "attn_layer_period": 2, "expert_layer_offset": 1, "expert_layer_period": 2},
    # rotary over the first 64 dimensions of each head: wider than a shrunk head of 16; without
    # this only the counts shrink, at full width (400M parameters), and the audit times out
    "gptj": {"rotary_dim": 8},
    "codegen": {"rotary_dim": 8},
    # State-space hybrids: their attention layers sit further in than two layers reach, and
    # their state-space widths (heads x head width = expand x hidden) are set outright, not
    # derived from the hidden size, so both are shrunk here: one recurrent layer, then one
    # attention layer, 8 state-space heads of 16.
    "bamba": {
        "attn_layer_indices": [1],
        "mamba_n_heads": 8,
        "mamba_d_head": 16,
        "mamba_d_state": 16,
        "mamba_chunk_size": 16,
    },
    "granitemoehybrid": {
        "layer_types": ["linear_attention", "full_attention"],
        "mamba_n_heads": 8,
        "mamba_d_head": 16,
        "mamba_d_state": 16,
        "mamba_chunk_size": 16,
    },
    "falcon_h1": {
        "mamba_d_ssm": 128,
        "mamba_n_heads": 8,
        "mamba_d_head": 16,
        "mamba_d_state": 16,
        "mamba_chunk_size": 16,
    },
    "nemotron_h": {
        "layers_block_type": ["linear_attention", "full_attention"],
        "mamba_num_heads": 8,
        "mamba_head_dim": 16,
        "ssm_state_size": 16,
        "n_groups": 1,
        "chunk_size": 16,
        "head_dim": 16,
    },
    "mamba2": {"num_heads": 8, "head_dim": 16, "n_groups": 1, "state_size": 16, "chunk_size": 16},
    # Widths derived at construction (attention over hidden and embeddings: 2 x hidden; heads of
    # 2 x hidden / heads; dt rank hidden / 16) and the layer pattern (every 6th layer from the
    # 4th), derived again here. Zamba ties its shared attention block across hybrid layers, so
    # it needs two of them: three layers.
    "zamba": {
        "num_hidden_layers": 3,
        "layers_block_type": ["linear_attention", "hybrid", "hybrid"],
        "attention_hidden_size": 128,
        "attention_head_dim": 32,
        "mamba_dt_rank": 4,
    },
    "zamba2": {
        "layers_block_type": ["linear_attention", "hybrid"],
        "hybrid_layer_ids": [1],
        "attention_hidden_size": 128,
        "attention_head_dim": 32,
        "mamba_headdim": 16,
        "num_query_groups": 4,
        "adapter_rank": 8,
        "mamba_d_state": 16,
        "chunk_size": 16,
    },
    "recurrent_gemma": {
        "block_types": ["recurrent", "attention"],
        "lru_width": 64,
        "head_dim": 16,
        "attention_window_size": 6,
    },
    # Defaults a checkpoint always sets, left None (or unset) by the default config, so that no
    # default builds: Dots1's experts, LFM2-MoE's layer pattern (conv then attention, one dense
    # layer), ESM's vocabulary and special ids, X-MOD's language adapter.
    "dots1": {"n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2},
    "lfm2_moe": {"layer_types": ["conv", "full_attention"], "num_dense_layers": 1},
    "esm": {"vocab_size": 128, "pad_token_id": 1, "mask_token_id": 2},
    "xmod": {"default_language": "en_XX"},
    # Reformer's axial position widths must add up to the hidden size (64 + 192 = 256 by default).
    "reformer": {"axial_pos_embds_dim": [16, 48]},
    # Layers that share another layer's cache from the 16th on: two layers hold none to share.
    "gemma3n_text": {"num_kv_shared_layers": 0},
    # Cohere Compass reads rope parameters per layer type; the default config holds none.
    "cohere_compass_text": {"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 10000.0}}},
    # xLSTM's config rounds the query width up to a multiple of 64 and its layers do not: at
    # width 64 the default factor 0.5 gives a state of 16 per head against queries of 8.
    "xlstm": {"embedding_dim": 64, "num_blocks": 2, "qk_dim_factor": 1.0},
    # LongCat-Flash's experts (set outright) and its zero-computation experts.
    "longcat_flash": {"expert_ffn_hidden_size": 32, "zero_expert_num": 2},
    "kimi_linear": LATENT_AND_LINEAR_WIDTHS,
    "bailing_hybrid": {**LATENT_AND_LINEAR_WIDTHS, "num_expert_group": 1, "topk_group": 1},  # experts in one group
}


#: overrides for one head of a type: Reformer's causal-LM head refuses a config without
#: ``is_decoder``, its masked-LM head one with it
TASK_OVERRIDES: dict[tuple[str, str], dict[str, Any]] = {("reformer", "causal-lm"): {"is_decoder": True}}


#: Multi-head latent attention (DeepSeek-V2 and its descendants) sets its low-rank and
#: rotary widths outright (rope 64 + nope 128 per head, kv rank 512) and derives
#: ``qk_head_dim`` and ``head_dim`` from them at construction: all are shrunk together,
#: keys a type does not have left out. Expert routing in one group of the shrunk experts.
MLA_WIDTHS: dict[str, Any] = {
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 8,
    "qk_head_dim": 16,
    "head_dim": 8,
    "v_head_dim": 16,
    "kv_lora_rank": 16,
    "q_lora_rank": 32,
    "n_group": 1,
    "topk_group": 1,
    "num_key_value_heads": 4,
}
MLA_TYPES = ("deepseek_v2", "deepseek_v3", "deepseek_v32", "glm_moe_dsa", "sarvam_mla", "axk1", "longcat_flash")


def _sweep_overrides(model_type: str, config: Any) -> dict[str, Any]:
    overrides = dict(SWEEP_OVERRIDES.get(model_type, {}))
    if model_type in MLA_TYPES:
        present = config.to_dict()
        overrides.update({k: v for k, v in MLA_WIDTHS.items() if k in present or k == "qk_head_dim"})
        if present.get("num_experts_per_tok", 0) is None:  # DeepSeek-V2 leaves it unset: top-k of None
            overrides["num_experts_per_tok"] = 2
    return overrides


def model_types(task: str) -> list[str]:
    """Every model type of the installed transformers under the auto mapping of ``task``."""
    from transformers.models.auto import modeling_auto

    mapping = {
        "causal-lm": modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        "masked-lm": modeling_auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES,
        "seq2seq": modeling_auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES,
        "sequence-classification": modeling_auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES,
        "token-classification": modeling_auto.MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES,
    }[task]
    return sorted(mapping)


def auto_class(task: str) -> Any:
    """transformers' auto class of the models of ``task``."""
    import transformers

    return {
        "causal-lm": transformers.AutoModelForCausalLM,
        "masked-lm": transformers.AutoModelForMaskedLM,
        "seq2seq": transformers.AutoModelForSeq2SeqLM,
        "sequence-classification": transformers.AutoModelForSequenceClassification,
        "token-classification": transformers.AutoModelForTokenClassification,
        "feature-extraction": transformers.AutoModel,
    }[task]


#: the tasks whose heads are classifiers: their configs get a pad id where they have none, as a
#: fine-tuning script must give them (transformers' decoder classifiers refuse a batch of two
#: rows without one, since they find each row's last token by it)
CLASSIFIER_TASKS = ("sequence-classification", "token-classification")


def _mixed(layer_types: list[str]) -> list[str]:
    """Two layers that keep each kind of a longer pattern (sliding then full, say)."""
    kinds = list(dict.fromkeys(layer_types))
    return (kinds * 2)[:2]


def shrunk_config(model_type: str, level: str = "full", task: str = "causal-lm") -> Any:
    """The type's default config with two layers, width 64, vocabulary 128 and a default
    sliding window or attention chunk of 6 (``level="full"``), or with only its counts shrunk (layers, experts,
    vocabulary: ``level="counts"``) for a type whose widths depend on each other in ways the
    full shrink breaks. Nested text configs (multimodal types) are shrunk the same way.
    ``task`` picks the overrides a type needs for one head only (Reformer's decoder flag)."""
    from transformers import AutoConfig

    keys = SHRUNK_SIZES if level == "full" else {k: v for k, v in SHRUNK_SIZES.items() if k in COUNT_KEYS}
    config = AutoConfig.for_model(model_type)
    _shrink(config, keys)
    for name in ("text_config", "decoder", "encoder"):
        nested = getattr(config, name, None)
        if nested is not None and hasattr(nested, "to_dict"):
            _shrink(nested, keys)
    for key, value in {**_sweep_overrides(model_type, config), **TASK_OVERRIDES.get((model_type, task), {})}.items():
        setattr(config, key, value)
    if task in CLASSIFIER_TASKS and getattr(config, "pad_token_id", None) is None:
        config.pad_token_id = 0
    return config


def _shrink(config: Any, keys: dict[str, int]) -> None:
    present = config.to_dict()
    for key, value in keys.items():
        if key in present and isinstance(present[key], int) and not isinstance(present[key], bool):
            setattr(config, key, value)
    if isinstance(present.get("sliding_window"), int) and present["sliding_window"]:
        config.sliding_window = SWEEP_WINDOW
    if isinstance(present.get("attention_chunk_size"), int) and present["attention_chunk_size"]:
        config.attention_chunk_size = SWEEP_CHUNK
    if isinstance(present.get("layer_types"), list) and present["layer_types"]:
        config.layer_types = _mixed(present["layer_types"])
    # Fields a config derives from its widths at construction stay None when the widths are
    # set afterwards; the model code then divides by None. Derive them as the constructor would.
    shrunk = config.to_dict()
    heads = shrunk.get("num_attention_heads")
    if isinstance(heads, int) and heads:
        if "head_dim" in shrunk and shrunk["head_dim"] is None and isinstance(shrunk.get("hidden_size"), int):
            config.head_dim = shrunk["hidden_size"] // heads
        if "num_key_value_heads" in shrunk and shrunk["num_key_value_heads"] is None:
            config.num_key_value_heads = heads
    for key in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id"):
        if isinstance(present.get(key), int) and present[key] >= SHRUNK_SIZES["vocab_size"]:
            setattr(config, key, {"pad_token_id": 0, "bos_token_id": 1}.get(key, 2))


def shrunk_model(
    model_type: str, task: str, attn_implementation: str | None = None, seed: int = 0, level: str = "full"
) -> Any:
    """A random-init model of ``model_type`` for ``task``, from :func:`shrunk_config`, in eval mode."""
    torch.manual_seed(seed)
    kwargs = {"attn_implementation": attn_implementation} if attn_implementation else {}
    return auto_class(task).from_config(shrunk_config(model_type, level, task), **kwargs).eval()


def tiny_tokenizer(pad_is_eos: bool = False, padding_side: str = "right") -> Any:
    """A word-level tokenizer built here (no download): ``<pad>`` 0, ``<s>`` 1, ``</s>`` 2,
    ``<unk>`` 3, then ``w4`` ... ``w39``. With ``pad_is_eos`` its pad token is ``</s>``, as
    many causal-LM tokenizers are set up when they ship without a pad token."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocabulary = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3, **{f"w{i}": i for i in range(4, 40)}}
    tokenizer = Tokenizer(models.WordLevel(vocabulary, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    pad = "</s>" if pad_is_eos else "<pad>"
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<s>",
        eos_token="</s>",
        pad_token=pad,
        unk_token="<unk>",
        padding_side=padding_side,
    )
