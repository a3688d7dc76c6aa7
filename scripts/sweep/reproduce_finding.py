"""Reproduce a finding of the architecture sweep with plain transformers calls (no maskcheck).

    python scripts/sweep/reproduce_finding.py TYPE SUITE [--implementation eager] [--task causal-lm]

It rebuilds the model the sweep audited (the config recorded in docs/architectures.jsonl,
random weights, seed 0) and runs one direct check of the suite's property on it, printing
the largest change of a log-probability that must not change. Everything below is torch
and transformers, so the finding stands without maskcheck. Position ids it passes start
where the model's own start (measured: RoBERTa-style models count from padding_idx + 1).

A comparison of two inputs of the same shape finds any difference; one across shapes (a
padded row against the row alone, a cache against none) rounds differently on each side
and finds a difference above 1e-4 in float32. A difference between zero and 1e-4 is
measured again with the model in float64, whichever way float32 decided: it is a finding
only if it keeps at least half its size there (rounding shrinks 2**29-fold; a behaviour
does not) and, across shapes, stays above 1e-5. A model that does not run in float64
keeps its float32 result, and the script says so.

| suite | what must not change |
|---|---|
| causal | logits before position 5 when the token at position 5 changes, unpadded and left-padded; beyond a sliding window's reach; an encoder must read ahead |
| padding | real logits when the ids in left-padded slots change (mask given); a left-padded row against the row alone |
| packing | sequence B's logits when sequence A, packed before it in one row, changes |
| kv_cache | generate()'s logits on a left-padded batch with its cache vs without (use_cache=False); with the cache on a left-padded and on an unpadded batch vs each row's own forward over the same tokens; a 2-token chunk after a cache |
| serving | after a rollback (crop), row reorders (reorder_cache, batch_select_indices, batch_repeat_interleave), with the static cache and past a sliding window: the cached logits vs the full forward; a cache reset and reused by another request, and a prompt cache copied and continued: vs a fresh decode (same shapes) |
| loss_masking | the model's loss vs cross-entropy of logits[t] against labels[t + 1], -100 ignored; a left-padded row's loss against the row alone, and with other ids in its padded slots |
| cross_attention | an encoder-decoder's decoder logits when the ids in left-padded source slots change (source mask given); a right-padded source against the source alone |
| positions | (a WARN's behaviour) a left-padded row without position ids against positions derived from the mask and positions counting the padding: closer to the second |
| packing_unisolated | (a WARN's behaviour) sequence B's logits when A changes, packed back to back with no isolating input; and not on the isolated path |
| reach | (a WARN's behaviour) how far a change of a row's first token reaches: the last 8 positions of a row of 24 move by less than 1e-5 (a window the config does not declare, or a memory that decays) |
| source_positions | (a WARN's behaviour) a left-padded source against the source alone moves the decoder's logits while its padding is masked (pad ids change nothing, right padding matches) |
"""

from __future__ import annotations

import argparse
import functools
import inspect
import json
import math
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "architectures.jsonl"


def build(model_type: str, task: str, implementation: str, results: Path) -> torch.nn.Module:
    import transformers

    record = next(
        (
            r
            for r in map(json.loads, results.read_text().splitlines())
            if (r["type"], r["task"]) == (model_type, task) and "config" in r
        ),
        None,
    )
    if record is None:
        raise SystemExit(
            f"{model_type} ({task}) is not in {results}: run scripts/sweep/architecture_sweep.py --types {model_type}"
        )
    # The default config with the recorded fields set on it, as the sweep shrank it (some shrunk
    # configs, XLNet's d_head say, would not pass the constructor's validation).
    config = transformers.AutoConfig.for_model(model_type)
    set_fields(config, record["config"])
    if task == "seq2seq":
        # Labels are shifted into decoder inputs behind these ids (EncoderDecoderModel sets
        # neither); maskcheck passed decoder inputs itself, so the decoder's own ids reproduce it.
        decoder = config.get_text_config(decoder=True)
        for key, fallback in (
            ("decoder_start_token_id", getattr(decoder, "bos_token_id", None) or 1),
            ("pad_token_id", getattr(decoder, "pad_token_id", None) or 0),
        ):
            if getattr(config, key, None) is None:
                setattr(config, key, fallback)
    auto = {
        "causal-lm": transformers.AutoModelForCausalLM,
        "masked-lm": transformers.AutoModelForMaskedLM,
        "seq2seq": transformers.AutoModelForSeq2SeqLM,
    }[task]
    torch.manual_seed(0)
    kwargs = {} if implementation == "default" else {"attn_implementation": implementation}
    return auto.from_config(config, **kwargs).eval()


def set_fields(config: object, recorded: dict) -> None:
    """The recorded fields set on ``config``; a nested config (an encoder-decoder's encoder and
    decoder, a multimodal model's text config) is recorded as a dict and set field by field.
    Fields the sweep left at their defaults are left alone: setting some validates them
    against the shrunk ones (NeoMME's per-layer config names layers a shrunk model lacks)."""
    import transformers

    defaults = json.loads(json.dumps(config.to_dict(), default=str))  # as the record holds them
    for key, value in recorded.items():
        if key in ("model_type", "transformers_version") or defaults.get(key) == value:
            continue
        nested = config_value(config, key)
        if isinstance(nested, transformers.PretrainedConfig) and isinstance(value, dict):
            set_fields(nested, value)
        else:
            setattr(config, key, value)


def config_value(config: object, key: str) -> object:
    """``config.key``, or None where it is missing or varies per layer (a heterogeneous
    config such as NeoMME's refuses a global read of a per-layer attribute)."""
    try:
        return getattr(config, key, None)
    except Exception:  # noqa: BLE001 - transformers' AmbiguousGlobalPerLayerAttributeError, or another refusal
        return None


def vocab_size(model: torch.nn.Module) -> int:
    """The size of the vocabulary the model predicts (an encoder-decoder's is its decoder's)."""
    head = model.get_output_embeddings()
    if head is not None:
        return head.weight.shape[0]
    return model.config.get_text_config(decoder=True).vocab_size


def log_probs(model: torch.nn.Module, **inputs: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return F.log_softmax(model(**inputs).logits.double(), dim=-1)


SOURCE_SEED = 3


def predicted(
    model: torch.nn.Module, row: torch.Tensor, mask: torch.Tensor | None = None, positions: torch.Tensor | None = None
) -> torch.Tensor:
    """Log-probabilities over ``row`` on the side the model predicts: an encoder-decoder gets
    ``row`` as its decoder input (with a fixed source of 5 tokens), a decoder or an encoder as
    its input."""
    if model.config.is_encoder_decoder:
        inputs = {"input_ids": ids(model, 5, seed=SOURCE_SEED).expand(row.shape[0], -1), "decoder_input_ids": row}
        if mask is not None:
            inputs["decoder_attention_mask"] = mask
        return log_probs(model, **inputs)
    inputs = {"input_ids": row}
    if mask is not None:
        inputs["attention_mask"] = mask
    if positions is not None and takes(model, "position_ids"):
        inputs["position_ids"] = positions
    return log_probs(model, **inputs)


@functools.cache
def first_position(model: torch.nn.Module) -> int:
    """The position id the model gives a sequence's first token, measured by calling: the offset
    whose ``position_ids`` reproduce a call without them (RoBERTa-style models count from
    ``padding_idx + 1``). 0 for a model that takes no position ids or that none reproduces."""
    if model.config.is_encoder_decoder or not takes(model, "position_ids"):
        return 0
    row = ids(model, 4)
    own = log_probs(model, input_ids=row)
    pad = getattr(model.config, "pad_token_id", None)
    for offset in dict.fromkeys([0, *([pad + 1] if isinstance(pad, int) else []), 1, 2]):
        if torch.allclose(log_probs(model, input_ids=row, position_ids=torch.arange(4)[None] + offset), own, atol=1e-6):
            return offset
    return 0


def position_ids(model: torch.nn.Module, values: list[int]) -> torch.Tensor:
    """``values`` (0 = a sequence's first token) as the model's own position ids: [1, len]."""
    return torch.tensor([values]) + first_position(model)


def takes(model: torch.nn.Module, name: str) -> bool:
    parameters = inspect.signature(type(model).forward).parameters
    return name in parameters


#: A comparison across shapes (a padded row against the row alone, a cache against none)
#: rounds differently on each side, so it is a finding only beyond rounding. In float32 that
#: is a difference above 1e-4: about 800 units of float32 rounding (2**-23 each) at the size
#: of a log-probability, where maskcheck's measured worst is 1.5 (harness/engine/tolerance.py).
#: In float64 rounding shrinks 2**29-fold, but a model may still round some steps in
#: float32 (normalisations that upcast and cast back): 1e-5 stays 5x above the worst such
#: rounding at a log-probability of 10.
BARS = {torch.float32: 1e-4, torch.float64: 1e-5}


def beyond_rounding(difference: float, model: torch.nn.Module) -> bool:
    """Whether a difference between two computations of other shapes is more than rounding,
    for the precision the model runs in."""
    return difference > BARS[next(model.parameters()).dtype]


def remeasured_in_float64(
    model: torch.nn.Module, check: Callable[[torch.nn.Module, str], tuple[float, bool]], task: str, in_float32: float
) -> tuple[float, bool] | None:
    """A difference measured in float32 between zero and the float32 bar, measured again with
    the model in float64, whichever way the float32 check decided: rounding error shrinks
    2**29-fold there, a behaviour does not depend on the precision. A finding when the
    float64 check finds one and the difference has kept at least half its float32 size
    (a same-shape leak check finds any difference; mixture-of-experts layers reorder their
    sums with the batch, 1e-7 in float32, 1e-16 in float64). None (after saying why) when
    the model does not run in float64, or not to a finite result: the float32 result stands."""
    print(
        f"{in_float32:.3g} lies between zero and the float32 bar ({BARS[torch.float32]:g}): measuring again in float64, where rounding shrinks 2**29-fold"
    )
    try:
        difference, finding = check(model.to(torch.float64), task)
    except Exception as exc:  # noqa: BLE001 - some models build float32 tensors of their own (XLNet, Mixtral's grouped matmul)
        print(
            f"the model does not run in float64 ({type(exc).__name__}: {str(exc).splitlines()[0][:120]}): the float32 result stands"
        )
        return None
    if not math.isfinite(difference):  # some models' masks overflow in float64 (Beam's eager attention)
        print(f"in float64 the check measures {difference}: it cannot decide, the float32 result stands")
        return None
    kept = difference >= in_float32 / 2
    finding = finding and kept
    reason = (
        "a behaviour: it kept its size"
        if finding
        else (
            "rounding: it shrank with the precision" if not kept else f"below the float64 bar ({BARS[torch.float64]:g})"
        )
    )
    print(f"in float64: {difference:.3g} against {in_float32:.3g} in float32: {reason}")
    return difference, finding


def finds_a_difference(suite: str, task: str) -> bool:
    """Whether the check's finding is a difference (every check but two: ``reach`` finds
    influence that stops, a masked LM's ``causal`` an encoder that does not read ahead)."""
    return suite != "reach" and not (suite == "causal" and task == "masked-lm")


def ids(model: torch.nn.Module, length: int, seed: int = 0) -> torch.Tensor:
    vocab = vocab_size(model)
    return torch.randint(3, vocab, (1, length), generator=torch.Generator().manual_seed(seed))


def causal(model: torch.nn.Module, task: str) -> tuple[float, bool]:
    """Changing the token at each position p of 8, unpadded and in a row left-padded by 2
    (mask given): logits before p must not move (same shapes, so any difference is a leak).
    A sliding window W over L layers: the first token must not reach an output more than
    L x (W - 1) positions later. A masked LM (declared bidirectional) inverts it: its
    earlier outputs must move."""
    row = ids(model, 8)
    pad = getattr(model.config, "pad_token_id", None) or 0
    mask = torch.tensor([[0, 0] + [1] * 8])
    positions = position_ids(model, [0, 0] + list(range(8)))
    padded_row = torch.cat([torch.full((1, 2), pad), row], 1)
    base, padded = predicted(model, row), predicted(model, padded_row, mask, positions)[:, 2:]
    later = in_padded = 0.0
    for p in range(1, 8):
        changed = row.clone()
        changed[0, p] = (changed[0, p] + 1) % vocab_size(model)
        later = max(later, float((base[:, :p] - predicted(model, changed)[:, :p]).abs().max()))
        moved = predicted(model, torch.cat([torch.full((1, 2), pad), changed], 1), mask, positions)[:, 2:]
        in_padded = max(in_padded, float((padded[:, :p] - moved[:, :p]).abs().max()))
    if task == "masked-lm":
        print(f"a masked LM: later tokens move earlier outputs by {later:.3g} (0: it does not read ahead)")
        return later, later == 0.0
    print(f"a later token moves earlier logits by {later:.3g} unpadded, {in_padded:.3g} left-padded")
    worst = max(later, in_padded)
    window = config_value(model.config, "sliding_window")
    layers = config_value(model.config, "num_hidden_layers")
    if isinstance(window, int) and isinstance(layers, int) and not model.config.is_encoder_decoder:
        reach = layers * (window - 1)
        long = ids(model, reach + 4, seed=5)
        moved = long.clone()
        moved[0, 0] = (moved[0, 0] + 1) % vocab_size(model)
        beyond = float((predicted(model, long)[:, reach + 1 :] - predicted(model, moved)[:, reach + 1 :]).abs().max())
        print(
            f"window {window} over {layers} layers (reach {reach}): the first token moves outputs beyond the reach by {beyond:.3g}"
        )
        worst = max(worst, beyond)
    return worst, worst > 0.0


def padding(model: torch.nn.Module, task: str) -> tuple[float, bool]:
    """Changing the ids in two left-padded slots (mask given; same shapes, so any difference is
    a leak), and the padded row against the row alone (position ids from the mask, as
    generate() builds them, where the model takes them; a difference beyond rounding). Prints both."""
    pad = getattr(model.config, "pad_token_id", None) or 0
    real = ids(model, 6)
    row = torch.cat([torch.full((1, 2), pad), real], dim=1)
    other = torch.cat([torch.full((1, 2), (pad + 5) % vocab_size(model)), real], dim=1)
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1]])
    positions = position_ids(model, [0, 0, 0, 1, 2, 3, 4, 5])
    padded = predicted(model, row, mask, positions)[:, 2:]
    by_ids = float((padded - predicted(model, other, mask, positions)[:, 2:]).abs().max())
    by_padding = float((padded - predicted(model, real)).abs().max())
    print(f"changing padded ids: max |d log p| = {by_ids:.3g}; left-padded against alone: {by_padding:.3g}")
    return max(by_ids, by_padding), by_ids > 0.0 or beyond_rounding(by_padding, model)


def packing(model: torch.nn.Module, task: str) -> tuple[float, bool]:
    first, second = ids(model, 4, seed=1), ids(model, 4, seed=2)
    changed = (first + 1) % vocab_size(model)
    inputs = {}
    if takes(model, "position_ids"):  # the padding-free path: positions restart per sequence, no mask, no cache
        inputs["position_ids"] = position_ids(model, [0, 1, 2, 3, 0, 1, 2, 3])
    if takes(model, "use_cache"):
        inputs["use_cache"] = False
    a = log_probs(model, input_ids=torch.cat([first, second], 1), **inputs)[:, 4:]
    b = log_probs(model, input_ids=torch.cat([changed, second], 1), **inputs)[:, 4:]
    difference = float((a - b).abs().max())  # same shapes: any difference is a leak
    return difference, difference > 0.0


def kv_cache(model: torch.nn.Module, task: str) -> tuple[float, bool]:
    """generate() with its cache against generate() without (use_cache=False) on a left-padded
    batch (prompts of 4 and 2 tokens): all that applies to a model whose generate() feeds
    other inputs than the prompt (XLM, XLNet). Otherwise also generate()'s cached greedy
    decoding of that batch and of an unpadded one (two prompts of 4: rows that mix show
    without padding) against one forward per row, alone and unpadded, over its prompt and
    the tokens generated for it; then, for decoders, a chunk of 2 tokens fed after a cache
    through the model's own generation methods, as assisted decoding feeds its candidates.
    Prints each; returns the largest."""
    prompts = [ids(model, 4, seed=1), ids(model, 2, seed=2)]
    decoded = greedy(model, generation_inputs(model, prompts)[0])  # with the cache: both comparisons below read it
    by_toggle = cache_toggled(model, prompts, decoded)
    print(
        f"generate() on a left-padded batch with its cache against without (use_cache=False): max |d log p| = {by_toggle:.3g}"
    )
    if not feeds_prompt_as_is(model):
        print(
            "generate() does not feed this model its prompt as it is (it prepares other inputs), so only generate() against itself applies"
        )
        return by_toggle, beyond_rounding(by_toggle, model)
    padded = generated_against_alone(model, prompts, decoded)
    print(f"generate() on a left-padded batch, one token a step: max |d log p| = {padded:.3g}")
    unpadded = generated_against_alone(model, [ids(model, 4, seed=1), ids(model, 4, seed=2)])
    print(f"generate() on an unpadded batch of 2, one token a step: max |d log p| = {unpadded:.3g}")
    by_generate = max(padded, unpadded, by_toggle)
    if model.config.is_encoder_decoder:
        return by_generate, beyond_rounding(by_generate, model)
    sequences, _ = greedy(model, generation_inputs(model, prompts[:1])[0])
    try:
        by_chunk = chunk_after_cache(model, sequences[:, :6])
    except Exception as exc:  # noqa: BLE001 - a model whose cache refuses chunks (ProphetNet) still has its generate() result
        print(
            f"a chunk of 2 tokens after a cache: the model refuses it ({type(exc).__name__}: {str(exc).splitlines()[0][:120]})"
        )
        return by_generate, beyond_rounding(by_generate, model)
    print(f"a chunk of 2 tokens after a cache of 4: max |d log p| = {by_chunk:.3g}")
    worst = max(by_generate, by_chunk)
    return worst, beyond_rounding(worst, model)


def feeds_prompt_as_is(model: torch.nn.Module) -> bool:
    """Whether generate() feeds a decoder-only model its prompt unchanged (XLM appends a mask
    token to every forward's input, XLNet a dummy token)."""
    if model.config.is_encoder_decoder:
        return True
    prompt = ids(model, 2)
    prepared = model.prepare_inputs_for_generation(
        prompt, is_first_iteration=True, use_cache=True, attention_mask=torch.ones_like(prompt)
    )
    fed = prepared.get("input_ids")
    return not isinstance(fed, torch.Tensor) or fed.shape[1] == 2


def generation_inputs(
    model: torch.nn.Module, prompts: list[torch.Tensor]
) -> tuple[dict[str, torch.Tensor], list[torch.Tensor]]:
    """generate()'s keywords for ``prompts`` left-padded into one batch (an encoder-decoder
    gets them as its decoder's start, with a source of 5 tokens per row), and the sources."""
    pad = getattr(model.config, "pad_token_id", None) or 0
    length = max(p.shape[1] for p in prompts)
    rows = torch.cat(
        [torch.cat([torch.full((1, length - p.shape[1]), pad), p], 1) for p in prompts]
    )  # [B, length], left-padded
    mask = torch.cat(
        [torch.cat([torch.zeros(1, length - p.shape[1], dtype=torch.long), torch.ones_like(p)], 1) for p in prompts]
    )
    sources = [ids(model, 5, seed=3 + i) for i in range(len(prompts))]
    if not model.config.is_encoder_decoder:
        return {"input_ids": rows, "attention_mask": mask, "pad_token_id": pad}, sources
    # a shrunk config may name no start token; generate() then refuses to run
    start = getattr(model.config, "decoder_start_token_id", None) or pad
    return {
        "input_ids": torch.cat(sources),
        "decoder_input_ids": rows,
        "decoder_attention_mask": mask,
        "decoder_start_token_id": start,
        "pad_token_id": pad,
    }, sources


def greedy(
    model: torch.nn.Module, inputs: dict[str, torch.Tensor], use_cache: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """generate()'s greedy decoding of 4 new tokens: the sequences and the log-probabilities each new token was chosen from [B, 4, V]."""
    with torch.no_grad():
        out = model.generate(
            **inputs,
            max_new_tokens=4,
            min_new_tokens=4,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
            use_cache=use_cache,
        )
    return out.sequences, F.log_softmax(torch.stack(out.logits, dim=1).double(), dim=-1)


def cache_toggled(
    model: torch.nn.Module, prompts: list[torch.Tensor], decoded: tuple[torch.Tensor, torch.Tensor]
) -> float:
    """generate() with its cache (``decoded``: :func:`greedy` of ``prompts``) against generate()
    without (use_cache=False), step by step while the two have chosen the same tokens."""
    cached_sequences, cached = decoded
    plain_sequences, plain = greedy(model, generation_inputs(model, prompts)[0], use_cache=False)
    worst = 0.0
    for i in range(len(prompts)):
        differ = (cached_sequences[i, -4:] != plain_sequences[i, -4:]).nonzero().flatten()
        steps = int(differ[0]) + 1 if differ.numel() else 4  # later steps continue other tokens
        worst = max(worst, float((cached[i, :steps] - plain[i, :steps]).abs().max()))
    return worst


def generated_against_alone(
    model: torch.nn.Module, prompts: list[torch.Tensor], decoded: tuple[torch.Tensor, torch.Tensor] | None = None
) -> float:
    """generate() (greedy, 4 new tokens, its own cache) on ``prompts`` left-padded into one
    batch (``decoded`` when already run), against each row's own forward, alone and
    unpadded, over the same tokens."""
    inputs, sources = generation_inputs(model, prompts)
    sequences, generated = decoded if decoded is not None else greedy(model, inputs)  # [B, ...], [B, 4, V]
    new = sequences[:, -4:]  # [B, 4]
    started = (
        sequences.shape[1] - max(p.shape[1] for p in prompts) - 4
    )  # generate() may put a decoder start token first
    worst = 0.0
    for i, own in enumerate(prompts):
        fed = torch.cat([sequences[i : i + 1, :started], own, new[i : i + 1, :-1]], dim=1)  # the row alone, unpadded
        row_inputs = (
            {"input_ids": sources[i], "decoder_input_ids": fed}
            if model.config.is_encoder_decoder
            else {"input_ids": fed}
        )
        alone = log_probs(model, **row_inputs)[0, -4:]  # [4, V]: the positions generate() chose from
        worst = max(worst, float((alone - generated[i]).abs().max()))
    return worst


def chunk_after_cache(model: torch.nn.Module, row: torch.Tensor) -> float:
    """The last 2 of 6 tokens fed as one chunk after a cache of 4, through the model's own
    generation methods (as assisted decoding feeds its candidates), against the full forward."""
    from transformers import GenerationConfig
    from transformers.generation.utils import GenerationMode

    with torch.no_grad():
        kwargs = {"use_cache": True, "attention_mask": torch.ones(1, 4, dtype=torch.long)}
        if takes(model, "position_ids"):
            kwargs["position_ids"] = position_ids(model, [0, 1, 2, 3])
        model._prepare_cache_for_generation(
            GenerationConfig(use_cache=True), kwargs, GenerationMode.GREEDY_SEARCH, 1, 16
        )
        prefill = model(
            **model.prepare_inputs_for_generation(row[:, :4], is_first_iteration=True, **kwargs), return_dict=True
        )
        kwargs = model._update_model_kwargs_for_generation(prefill, kwargs, num_new_tokens=2)
        step = model(
            **model.prepare_inputs_for_generation(row, next_sequence_length=2, **kwargs), return_dict=True
        ).logits
    return float((log_probs(model, input_ids=row)[:, 4:] - F.log_softmax(step.double(), -1)).abs().max())


class Decoding:
    """One request decoded the way generate() drives the model: its own cache preparation,
    input preparation and kwargs update (an encoder-decoder decodes against a fixed source)."""

    def __init__(
        self,
        model: torch.nn.Module,
        rows: torch.Tensor,
        implementation: str | None = None,
        cache: object = None,
        record_past: bool = False,
    ) -> None:
        from transformers import GenerationConfig
        from transformers.generation.utils import GenerationMode

        self.model, self.ids = model, rows
        seq2seq = model.config.is_encoder_decoder
        self.mask_key = "decoder_attention_mask" if seq2seq else "attention_mask"
        self.kwargs: dict = {"use_cache": True, self.mask_key: torch.ones_like(rows)}
        if seq2seq:
            source = ids(model, 5, seed=SOURCE_SEED).expand(rows.shape[0], -1)
            with torch.no_grad():
                self.kwargs["encoder_outputs"] = model.get_encoder()(input_ids=source, return_dict=True)
            self.kwargs["attention_mask"] = torch.ones_like(source)
        if cache is not None:
            self.kwargs["cache"] = cache
        else:
            config = GenerationConfig(
                use_cache=True, cache_implementation=implementation, num_beams=1, num_return_sequences=1
            )
            model._prepare_cache_for_generation(config, self.kwargs, GenerationMode.GREEDY_SEARCH, rows.shape[0], 64)
        if record_past and self.kwargs.get("cache") is not None:
            self.kwargs["cache"].activate_past_recording()  # as assisted decoding prepares its cache
        with torch.no_grad():
            inputs = model.prepare_inputs_for_generation(rows, is_first_iteration=True, **self.kwargs)
            if "logits_to_keep" in inputs:  # hybrids prepare 1: every fed position is compared
                inputs["logits_to_keep"] = 0
            self.output = model(**inputs, return_dict=True)
        self.logits = F.log_softmax(self.output.logits.double(), -1)  # [B, T, V]

    @property
    def cache(self) -> object:
        return self.output.cache if getattr(self.output, "cache", None) is not None else self.kwargs.get("cache")

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feed ``tokens [B, n]`` in one forward; their log-probabilities [B, n, V]."""
        n = tokens.shape[1]
        seq2seq = self.model.config.is_encoder_decoder
        self.kwargs = self.model._update_model_kwargs_for_generation(
            self.output, self.kwargs, is_encoder_decoder=seq2seq, num_new_tokens=n
        )
        self.ids = torch.cat([self.ids, tokens], dim=1)
        with torch.no_grad():
            inputs = self.model.prepare_inputs_for_generation(self.ids, next_sequence_length=n, **self.kwargs)
            if "logits_to_keep" in inputs:
                inputs["logits_to_keep"] = 0
            self.output = self.model(**inputs, return_dict=True)
        return F.log_softmax(self.output.logits.double(), -1)

    def drop_last(self, tokens: int) -> None:
        """Roll back ``tokens`` with the cache's crop, and the mask with it."""
        self.cache.crop(-tokens)
        self.ids = self.ids[:, :-tokens]
        self.kwargs[self.mask_key] = self.kwargs[self.mask_key][:, :-tokens]
        self.kwargs.pop("position_ids", None)

    def rows(self, index: torch.Tensor, method: str) -> None:
        """Rearrange the rows with the cache's own ``method`` and the kwargs with them."""
        cache = self.cache
        getattr(cache, method)(2 if method == "batch_repeat_interleave" else index)
        self.ids = self.ids[index]
        self.kwargs[self.mask_key] = self.kwargs[self.mask_key][index]
        self.kwargs.pop("position_ids", None)
        if "encoder_outputs" in self.kwargs:
            self.kwargs["encoder_outputs"]["last_hidden_state"] = self.kwargs["encoder_outputs"]["last_hidden_state"][
                index
            ]
            self.kwargs["attention_mask"] = self.kwargs["attention_mask"][index]


def serving(model: torch.nn.Module, task: str) -> tuple[float, bool]:
    """What a server does with the cache, each against a fresh computation: rolling back a
    draft token (crop(-1)), reordering rows (reorder_cache, batch_select_indices,
    batch_repeat_interleave), decoding with the static cache, decoding past a sliding window
    (each against the full forward: a finding beyond rounding); and a cache reset and reused
    by another request, a prompt's cache copied (copy.deepcopy) and continued (each against
    a fresh decode of the same shapes: any difference is a finding). Prints each; returns the
    largest difference and whether any is a finding."""
    import copy

    def full(rows: torch.Tensor) -> torch.Tensor:
        return predicted(model, rows)  # [B, T, V] log-probabilities

    def layers_have(cache: object, method: str) -> bool:
        part = getattr(cache, "self_attention_cache", cache)
        return all(hasattr(layer, method) for layer in getattr(part, "layers", []))

    across, same = [], []  # differences across shapes (cache vs full) and of the same computation
    prompt, more = (
        torch.cat([ids(model, 4, seed=1), ids(model, 4, seed=2)]),
        torch.cat([ids(model, 3, seed=4), ids(model, 3, seed=5)]),
    )
    plain = Decoding(model, prompt[:1], record_past=True)
    if plain.cache is not None and getattr(plain.cache, "is_croppable", False):
        draft = plain.step(more[:1, :2])
        what = "decoding 2 draft tokens, rolling back 1 (crop(-1)), decoding 1"
        print(
            "the 2 draft tokens' own logits against the full forward (before any rollback): max |d log p| = "
            f"{float((draft - full(torch.cat([prompt[:1], more[:1, :2]], 1))[:, -2:]).abs().max()):.3g}"
        )
        try:
            plain.drop_last(1)
            after = plain.step(more[:1, 2:3])
        except (RuntimeError, ValueError, AssertionError) as exc:  # the rollback left the cache inconsistent
            print(
                f"{what}: the next forward raised {type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
            )
            across.append((f"{what} (raised)", float("inf")))
        else:
            kept = torch.cat([prompt[:1], more[:1, :1], more[:1, 2:3]], dim=1)
            across.append((what, float((after[:, -1] - full(kept)[:, -1]).abs().max())))
    index = torch.tensor([1, 0])
    for method, kept_rows in (
        ("reorder_cache", index),
        ("batch_select_indices", torch.tensor([1])),
        ("batch_repeat_interleave", torch.tensor([0, 0, 1, 1])),
    ):
        decoding = Decoding(model, prompt)
        if decoding.cache is None or not layers_have(decoding.cache, method):
            print(f"{method}: the cache has none")
            continue
        decoding.step(more[:, :1])
        decoding.rows(kept_rows, method)
        tokens = ids(model, kept_rows.numel(), seed=9).T  # [B', 1]: each row its own token
        try:
            after = decoding.step(tokens)[:, -1]
        except RuntimeError as exc:  # the operation left the cache inconsistent: a finding
            print(f"{method}: the next forward raised {type(exc).__name__}: {str(exc).splitlines()[0][:160]}")
            across.append((f"{method} then one token a row (raised)", float("inf")))
            continue
        held = torch.cat([prompt[kept_rows], more[kept_rows, :1], tokens], dim=1)
        across.append((f"{method} then one token a row", float((after - full(held)[:, -1]).abs().max())))
    try:
        static = Decoding(model, prompt, implementation="static")
        if "Static" in type(getattr(static.cache, "self_attention_cache", static.cache)).__name__:
            after = static.step(more[:, :1])
            across.append(
                (
                    "the static cache",
                    float((after[:, -1] - full(torch.cat([prompt, more[:, :1]], 1))[:, -1]).abs().max()),
                )
            )
            second = torch.cat([ids(model, 4, seed=7), ids(model, 4, seed=8)])
            static.cache.reset()
            reused = Decoding(model, second, cache=static.cache)
            reused_step = reused.step(more[:, 1:2])
            fresh = Decoding(model, second, implementation="static")
            same.append(
                ("the static cache reset and reused", float((reused_step - fresh.step(more[:, 1:2])).abs().max()))
            )
    except Exception as exc:  # noqa: BLE001 - a model that refuses the static cache
        print(f"the static cache: refused ({type(exc).__name__}: {str(exc).splitlines()[0][:120]})")
    first = Decoding(model, torch.cat([ids(model, 4, seed=11), ids(model, 4, seed=12)]))
    first.step(more[:, :1])
    if first.cache is not None and hasattr(first.cache, "reset"):
        first.cache.reset()
        second = torch.cat([ids(model, 4, seed=7), ids(model, 4, seed=8)])
        reused = Decoding(model, second, cache=first.cache)
        fresh = Decoding(model, second)
        same.append(
            (
                "a cache reset and reused by another request",
                float(
                    max(
                        (reused.logits - fresh.logits).abs().max(),
                        (reused.step(more[:, :1]) - fresh.step(more[:, :1])).abs().max(),
                    )
                ),
            )
        )
        original = Decoding(model, prompt)
        if original.cache is not None:
            copied = copy.deepcopy(original)
            ahead = copied.step(more[:, :1])
            behind = original.step(more[:, 1:2])
            fresh_a, fresh_b = Decoding(model, prompt), Decoding(model, prompt)
            same.append(
                (
                    "a prompt cache copied and continued with two suffixes",
                    float(
                        max(
                            (ahead - fresh_a.step(more[:, :1])).abs().max(),
                            (behind - fresh_b.step(more[:, 1:2])).abs().max(),
                        )
                    ),
                )
            )
    window = config_value(model.config.get_text_config(decoder=True), "sliding_window")
    if isinstance(window, int) and window < 32:
        decoding = Decoding(model, prompt[:1, :1])
        row = ids(model, 2 * window + 4, seed=13)
        steps = torch.cat([decoding.step(row[:, i : i + 1]) for i in range(row.shape[1])], dim=1)
        across.append(
            (
                f"one token a step past twice the window of {window}",
                float((steps - full(torch.cat([prompt[:1, :1], row], 1))[:, 1:]).abs().max()),
            )
        )
    for what, difference in across + same:
        print(f"{what}: max |d log p| = {difference:.3g}")
    worst = max([d for _, d in across + same], default=0.0)
    finding = any(beyond_rounding(d, model) for _, d in across) or any(d > 0.0 for _, d in same)
    return worst, finding


def loss_masking(model: torch.nn.Module, task: str) -> tuple[float, bool]:
    """The model's loss against cross-entropy of logits[t] and labels[t + 1] (-100 ignored),
    the loss of a left-padded row (labels -100 at the pads and the first real token) against
    the row alone, and against the same row with other ids in its padded slots.
    Prints all three; returns the largest."""
    row = ids(model, 8)
    labels = row.clone()
    labels[0, :2] = -100
    with torch.no_grad():
        output = model(input_ids=row, labels=labels)
    logits = output.logits[:, :-1].double()
    expected = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100)
    by_reference = float((output.loss.double() - expected).abs())
    pad = getattr(model.config, "pad_token_id", None) or 0
    padded = torch.cat([torch.full((1, 2), pad), row], dim=1)
    mask = torch.cat([torch.zeros(1, 2, dtype=torch.long), torch.ones_like(row)], dim=1)
    extra = (
        {"position_ids": (mask.cumsum(-1) - 1).clamp(min=0) + first_position(model)}
        if takes(model, "position_ids")
        else {}
    )
    with torch.no_grad():
        alone = model(input_ids=row, labels=row).loss
        # The first real token has no real token before it: alone it is never a target, so padded it is none either.
        padded_labels = padded.masked_fill(mask == 0, -100)
        padded_labels[0, 2] = -100
        with_padding = model(input_ids=padded, attention_mask=mask, labels=padded_labels, **extra).loss
        # Other ids in the padded slots (same shapes): the loss must not move at all.
        other_pads = padded.clone()
        other_pads[0, :2] = (other_pads[0, :2] + 7) % vocab_size(model)
        with_other_pads = model(input_ids=other_pads, attention_mask=mask, labels=padded_labels, **extra).loss
    by_padding = float((alone.double() - with_padding.double()).abs())
    by_pad_ids = float((with_padding.double() - with_other_pads.double()).abs())
    print(
        f"loss against the reference: |difference| = {by_reference:.3g}; left-padded against alone: {by_padding:.3g}; other ids in the padded slots: {by_pad_ids:.3g}"
    )
    worst = max(by_reference, by_padding, by_pad_ids)
    return worst, beyond_rounding(worst, model)


def reach(model: torch.nn.Module, task: str) -> tuple[float, bool]:
    """The behaviour of a ``declared_pattern`` WARN whose influence stops short: how far a
    change of the first token of a row of 24 reaches. Under full causal attention it moves
    every later position; the behaviour shows when it moves the last 8 positions by less
    than 1e-5 (float32 noise: nothing at all for a window, a decayed memory for a
    recurrence) while it moves its own position by more than 1e-3. Prints the profile."""
    row = ids(model, 24)
    changed = row.clone()
    changed[0, 0] = (row[0, 0] + 1) % vocab_size(model)
    moved = (predicted(model, row) - predicted(model, changed)).abs().amax(-1)[0]  # [24]: per position
    profile = ", ".join(f"{p}: {float(moved[p]):.2g}" for p in (0, 2, 4, 8, 12, 16, 20, 23))
    far = float(moved[16:].max())
    print(f"changing the token at position 0 moves position p by: {profile}")
    return far, far < 1e-5 and float(moved[0]) > 1e-3


def source_pair(
    model: torch.nn.Module,
) -> tuple[Callable[[torch.Tensor, torch.Tensor], torch.Tensor], torch.Tensor, int]:
    """A function from (source ids, source mask) to the decoder's log-probabilities over a fixed
    decoder row of 4 tokens; the source of 5 tokens it is compared on; the pad id."""
    if not model.config.is_encoder_decoder:
        raise SystemExit(f"{type(model).__name__} is no encoder-decoder: it has no cross-attention")
    decoder = ids(model, 4, seed=5)

    def decoded(source: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return log_probs(model, input_ids=source, attention_mask=mask, decoder_input_ids=decoder)  # [1, 4, V]

    return decoded, ids(model, 5, seed=SOURCE_SEED), getattr(model.config, "pad_token_id", None) or 0


def padded_source(source: torch.Tensor, fill: int, side: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``source [1, S]`` with two slots of ``fill`` on ``side``, and its mask [1, S + 2]."""
    slots, ones = torch.full((1, 2), fill), torch.ones_like(source)
    if side == "left":
        return torch.cat([slots, source], 1), torch.cat([torch.zeros_like(slots), ones], 1)
    return torch.cat([source, slots], 1), torch.cat([ones, torch.zeros_like(slots)], 1)


def cross_attention(model: torch.nn.Module, task: str) -> tuple[float, bool]:
    """The decoder's logits when the ids in two left-padded source slots change (source mask
    given; same shapes, so any difference is a leak), and with a right-padded source against
    the source alone (real tokens keep their positions; a difference beyond rounding). Prints both."""
    decoded, source, pad = source_pair(model)
    row, mask = padded_source(source, pad, "left")
    other, _ = padded_source(source, (pad + 5) % vocab_size(model), "left")
    by_ids = float((decoded(row, mask) - decoded(other, mask)).abs().max())
    by_right = float(
        (decoded(*padded_source(source, pad, "right")) - decoded(source, torch.ones_like(source))).abs().max()
    )
    print(
        f"changing padded source ids: max |d log p| = {by_ids:.3g}; a right-padded source against the source alone: {by_right:.3g}"
    )
    return max(by_ids, by_right), by_ids > 0.0 or beyond_rounding(by_right, model)


def source_positions(model: torch.nn.Module, task: str) -> tuple[float, bool]:
    """The behaviour of a ``source_padding_amount`` WARN: a left-padded source moves the
    decoder's logits against the source alone while the padding itself is masked (other ids
    in its slots change nothing, a right-padded source matches): left padding shifts the
    positions of the source's real tokens."""
    decoded, source, pad = source_pair(model)
    alone = decoded(source, torch.ones_like(source))
    row, mask = padded_source(source, pad, "left")
    other, _ = padded_source(source, (pad + 5) % vocab_size(model), "left")
    by_left = float((decoded(row, mask) - alone).abs().max())
    by_ids = float((decoded(row, mask) - decoded(other, mask)).abs().max())
    by_right = float((decoded(*padded_source(source, pad, "right")) - alone).abs().max())
    print(
        f"a left-padded source against the source alone: max |d log p| = {by_left:.3g}; other ids in its padded slots: {by_ids:.3g}; a right-padded source: {by_right:.3g}"
    )
    return by_left, beyond_rounding(by_left, model) and by_ids == 0.0 and not beyond_rounding(by_right, model)


def positions(model: torch.nn.Module, task: str) -> tuple[float, bool]:
    """The behaviour of a ``positions_from_mask`` WARN: a left-padded row given its mask but no
    position ids, against the same row given position ids from the mask (as generate()
    builds them) and given positions that count the padding (0 .. T-1, what a model that
    ignores the mask uses), both from the model's own first position. The model does not derive positions from the mask when the row
    without position ids is closer to the second than to the first (however small the
    positional effect of a random-init model is)."""
    pad = getattr(model.config, "pad_token_id", None) or 0
    row = torch.cat([torch.full((1, 2), pad), ids(model, 6)], dim=1)
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1]])
    derived = predicted(model, row, mask, position_ids(model, [0, 0, 0, 1, 2, 3, 4, 5]))[:, 2:]
    counting_padding = predicted(model, row, mask, position_ids(model, list(range(8))))[:, 2:]
    left_out = predicted(model, row, mask)[:, 2:]
    from_derived = float((derived - left_out).abs().max())
    from_counting = float((counting_padding - left_out).abs().max())
    print(
        f"a left-padded row without position ids differs from derived positions by {from_derived:.3g}, from positions counting the padding by {from_counting:.3g}"
    )
    return from_derived, from_counting < from_derived


def packing_unisolated(model: torch.nn.Module, task: str) -> tuple[float, bool]:
    """The behaviour of a packing ``settings`` WARN (safe only with the isolating inputs):
    two sequences packed back to back with none of the inputs that isolate them (no
    position ids, no mask, the default use_cache), as a flattening collator leaves them.
    Changing the first must move the second's logits, and must not move them on the
    isolated path (restarting position ids, use_cache=False: the ``packing`` check) beyond
    float32 noise, 1e-5 (mixture-of-experts models group their tokens by batch layout:
    3e-8 measured on Aria's isolated path)."""
    first, second = ids(model, 4, seed=1), ids(model, 4, seed=2)
    changed = (first + 1) % vocab_size(model)
    a = log_probs(model, input_ids=torch.cat([first, second], 1))[:, 4:]
    b = log_probs(model, input_ids=torch.cat([changed, second], 1))[:, 4:]
    leak = float((a - b).abs().max())
    isolated, _ = packing(model, task)
    print(
        f"packed back to back with no isolating input: the second sequence moves by {leak:.3g} (isolated path: {isolated:.3g})"
    )
    return leak, beyond_rounding(leak, model) and isolated <= 1e-5


CHECKS = {
    "causal": causal,
    "padding": padding,
    "packing": packing,
    "kv_cache": kv_cache,
    "serving": serving,
    "loss_masking": loss_masking,
    "cross_attention": cross_attention,
    # the behaviours WARNs describe (scripts/sweep/confirm_findings.py --warnings)
    "reach": reach,
    "positions": positions,
    "packing_unisolated": packing_unisolated,
    "source_positions": source_positions,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("type")
    parser.add_argument("suite", choices=sorted(CHECKS))
    parser.add_argument("--task", default="causal-lm", choices=["causal-lm", "masked-lm", "seq2seq"])
    parser.add_argument("--implementation", default="default")
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = build(args.type, args.task, args.implementation, args.results)
    check = CHECKS[args.suite]
    difference, finding = check(model, args.task)
    measured = f"{difference:.3g}"
    if 0.0 < difference <= BARS[torch.float32] and finds_a_difference(args.suite, args.task):
        remeasured = remeasured_in_float64(model, check, args.task, difference)
        if remeasured is not None:
            measured = f"{remeasured[0]:.3g} (float64; {difference:.3g} in float32)"
            finding = remeasured[1]
    verdict = "the property does not hold (a finding)" if finding else "the property holds"
    print(
        f"{args.type} ({type(model).__name__}, {args.implementation} attention) {args.suite}: max |difference| = {measured}: {verdict}"
    )
    return 1 if finding else 0


if __name__ == "__main__":
    raise SystemExit(main())
