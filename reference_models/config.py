"""The one configuration object of the reference models, and its named presets."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

Family = Literal["encoder", "decoder", "encoder_decoder"]
NormLayout = Literal["pre", "post"]
NormKind = Literal["layernorm", "rmsnorm"]
PositionScheme = Literal["sinusoidal", "learned", "rotary", "alibi"]

FAMILIES = ("encoder", "decoder", "encoder_decoder")
NORM_LAYOUTS = ("pre", "post")
NORM_KINDS = ("layernorm", "rmsnorm")
POSITION_SCHEMES = ("sinusoidal", "learned", "rotary", "alibi")

# Fields that change the computation a set of weights is meant for, without changing
# any parameter name or shape. A checkpoint records them, and loading under other
# values is refused: this is the pre/post-norm checkpoint mismatch the mission names.
#: the values each layout field can take: norm_checkpoint's behaviour evidence tries every one the weights fit
LAYOUT_VALUES: dict[str, tuple[Any, ...]] = {
    "norm_layout": ("pre", "post"),
    "final_norm": (True, False),
    "norm": ("layernorm", "rmsnorm"),
    "norm_unit_offset": (False, True),
    "position": ("rotary", "alibi", "sinusoidal", "learned"),
}
ARCHITECTURE_FIELDS = (
    "family",
    "norm_layout",
    "final_norm",
    "norm",
    "norm_unit_offset",
    "position",
    "sliding_window",
    "attention_sinks",
    "attention_chunk",
    "prefix_lm",
    "token_shift",
    "n_kv_heads",
)


@dataclass(frozen=True)
class ModelConfig:
    family: Family = "decoder"
    vocab_size: int = 64
    d_model: int = 32
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int | None = None  # None: as many as n_heads (MHA); 1 is MQA; between is GQA
    d_ff: int | None = None  # None: 4 * d_model
    max_seq_len: int = 128
    norm_layout: NormLayout = "pre"
    final_norm: bool = True
    norm: NormKind = "layernorm"
    norm_unit_offset: bool = False  # RMSNorm scale is (1 + w), as Gemma-style checkpoints store it
    norm_eps: float = 1e-5
    position: PositionScheme = "rotary"
    rope_theta: float = 10000.0
    sliding_window: int | None = None  # a query sees itself and the window - 1 keys before it
    attention_sinks: int = 0  # with a window: the first N tokens of a row stay visible to every query
    # A query reads the keys at or before it in its own chunk of this many tokens, counted from
    # its sequence's first real token (Llama 4's chunked attention), in every layer.
    attention_chunk: int | None = None
    # A decoder whose forward takes ``prefix_mask [B, T]`` (True at each sequence's
    # bidirectional prefix): the prefix reads itself both ways, the rest causally (a prefix LM).
    prefix_lm: bool = False
    token_shift: bool = False  # add a projection of the previous token's embedding
    tie_embeddings: bool = True
    pad_token_id: int = 0
    num_labels: int = 2  # encoder classification head
    init_std: float = 0.02
    dropout: float = 0.0

    def __post_init__(self) -> None:
        def need(ok: bool, message: str) -> None:
            if not ok:
                raise ValueError(f"ModelConfig: {message}")

        need(self.family in FAMILIES, f"family must be one of {FAMILIES}, got {self.family!r}")
        need(self.norm_layout in NORM_LAYOUTS, f"norm_layout must be one of {NORM_LAYOUTS}, got {self.norm_layout!r}")
        need(self.norm in NORM_KINDS, f"norm must be one of {NORM_KINDS}, got {self.norm!r}")
        need(self.position in POSITION_SCHEMES, f"position must be one of {POSITION_SCHEMES}, got {self.position!r}")
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "max_seq_len", "num_labels"):
            need(getattr(self, name) >= 1, f"{name} must be >= 1, got {getattr(self, name)}")
        need(
            self.d_model % self.n_heads == 0, f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})"
        )
        need(1 <= self.kv_heads <= self.n_heads, f"n_kv_heads must be in [1, n_heads], got {self.n_kv_heads}")
        need(
            self.n_heads % self.kv_heads == 0,
            f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.kv_heads})",
        )
        need(
            self.position != "rotary" or self.head_dim % 2 == 0,
            f"rotary positions need an even head_dim, got {self.head_dim}",
        )
        need(
            self.sliding_window is None or self.sliding_window >= 1,
            f"sliding_window must be >= 1, got {self.sliding_window}",
        )
        need(
            self.sliding_window is None or self.family != "encoder",
            "sliding_window is only supported for causal self-attention",
        )
        need(
            self.attention_chunk is None or self.attention_chunk >= 1,
            f"attention_chunk must be >= 1, got {self.attention_chunk}",
        )
        patterns = [name for name in ("sliding_window", "attention_chunk", "prefix_lm") if getattr(self, name)]
        need(len(patterns) <= 1, f"{' and '.join(patterns)} cannot be combined")
        for name in ("attention_chunk", "prefix_lm"):
            need(not getattr(self, name) or self.family == "decoder", f"{name} is supported for decoders only")
        need(self.attention_sinks >= 0, f"attention_sinks must be >= 0, got {self.attention_sinks}")
        need(not self.attention_sinks or self.sliding_window is not None, "attention_sinks needs a sliding_window")
        need(not self.norm_unit_offset or self.norm == "rmsnorm", "norm_unit_offset applies to rmsnorm only")
        need(0 <= self.pad_token_id < self.vocab_size, f"pad_token_id {self.pad_token_id} outside the vocabulary")
        need(0.0 <= self.dropout < 1.0, f"dropout must be in [0, 1), got {self.dropout}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def ffn_dim(self) -> int:
        return 4 * self.d_model if self.d_ff is None else self.d_ff

    @property
    def is_causal(self) -> bool:
        """Whether the (decoder) self-attention is causal; encoders are bidirectional."""
        return self.family != "encoder"

    def replace(self, **changes: object) -> "ModelConfig":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> "ModelConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"ModelConfig: unknown fields {unknown}")
        return cls(**data)  # type: ignore[arg-type]


PRESETS: dict[str, ModelConfig] = {
    "tiny-decoder": ModelConfig(),
    "tiny-decoder-gqa": ModelConfig(n_heads=4, n_kv_heads=2, norm="rmsnorm"),
    "tiny-decoder-mqa-alibi": ModelConfig(n_heads=4, n_kv_heads=1, position="alibi"),
    "tiny-decoder-postnorm-learned": ModelConfig(norm_layout="post", final_norm=False, position="learned"),
    "tiny-decoder-sliding": ModelConfig(sliding_window=4, norm="rmsnorm", norm_unit_offset=True),
    "tiny-decoder-chunked": ModelConfig(attention_chunk=4, norm="rmsnorm", n_kv_heads=2),
    "tiny-decoder-prefix-lm": ModelConfig(prefix_lm=True, position="learned"),
    "tiny-decoder-sinusoidal-shift": ModelConfig(d_model=30, n_heads=3, position="sinusoidal", token_shift=True),
    "tiny-encoder": ModelConfig(family="encoder", position="learned"),
    "tiny-encoder-postnorm": ModelConfig(family="encoder", norm_layout="post", position="sinusoidal"),
    "tiny-encoder-decoder": ModelConfig(family="encoder_decoder", position="sinusoidal"),
    "tiny-encoder-decoder-rotary": ModelConfig(
        family="encoder_decoder", norm="rmsnorm", norm_layout="post", n_kv_heads=2
    ),
}


def preset(name: str) -> ModelConfig:
    try:
        return PRESETS[name]
    except KeyError:
        raise KeyError(f"unknown reference preset {name!r}; known: {', '.join(sorted(PRESETS))}") from None
