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
| truncation | (causal's cut) a row's first 15 logits when the row is cut after them, from 16 and from 129 tokens |
| padding | real logits when the ids in left-padded slots change (mask given); a left-padded row against the row alone |
| pooling | (a sequence classifier's padding) its scores for a row of 3 tokens padded by 4 on the right and on the left, the pad id in the padded slots, against the row alone: on neither side the row alone (`pooling_right`, `pooling_left`: on that side; `pooling_ids_right`, `pooling_ids_left`: other ids in that side's padded slots, same shapes) |
| packing | sequence B's logits when sequence A, packed before it in one row, changes |
| kv_cache | generate()'s logits on a left-padded batch with its cache vs without (use_cache=False); with the cache on a left-padded and on an unpadded batch vs each row's own forward over the same tokens; a 2-token chunk after a cache |
| serving | after a rollback (crop), row reorders (reorder_cache, batch_select_indices, batch_repeat_interleave), with the static cache and past a sliding window: the cached logits vs the full forward; a cache reset and reused by another request, and a prompt cache copied and continued: vs a fresh decode (same shapes) |
| loss_masking | the model's loss vs cross-entropy of logits[t] against labels[t + 1], -100 ignored; a left-padded row's loss against the row alone, and with other ids in its padded slots |
| tagger_loss | (a token classifier's loss_masking) its loss of a right-padded row, labels -100 at padding, with other ids in the padded slots, and against the row alone |
| cross_attention | an encoder-decoder's decoder logits when the ids in left-padded source slots change (source mask given); a right-padded source against the source alone |
| positions | (a WARN's behaviour) a left-padded row without position ids against positions derived from the mask and positions counting the padding: closer to the second |
| packing_unisolated | (a WARN's behaviour) sequence B's logits when A changes, packed back to back with no isolating input; and not on the isolated path |
| reach | (a WARN's behaviour) how far a change of a row's first token reaches: the last 8 positions of a row of 24 move by less than 1e-5 (a window the config does not declare, or a memory that decays) |
| source_positions | (a WARN's behaviour) a left-padded source against the source alone moves the decoder's logits while its padding is masked (pad ids change nothing, right padding matches) |
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from reproduce_common import (
    BARS,
    RESULTS,
    SOURCE_SEED,
    beyond_rounding,
    build,
    config_value,
    finds_a_difference,
    first_position,
    ids,
    log_probs,
    position_ids,
    predicted,
    remeasured_in_float64,
    takes,
    vocab_size,
)
from reproduce_decoding import kv_cache, serving


def reads_both_ways(model: torch.nn.Module, task: str) -> bool:
    """Whether the model is declared an encoder: a masked LM, or a classifier whose type has a
    masked-LM head in transformers' auto mappings and whose config is no decoder (BERT's, MRA's)."""
    from transformers.models.auto import modeling_auto

    if task == "masked-lm":
        return True
    return (
        task in ("sequence-classification", "token-classification")
        and model.config.model_type in modeling_auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES
        and not getattr(model.config, "is_decoder", False)
    )


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
    if reads_both_ways(model, task):
        print(f"an encoder: later tokens move earlier outputs by {later:.3g} (0: it does not read ahead)")
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


def truncation(model: torch.nn.Module, task: str) -> tuple[float, bool]:
    """A row's first 15 logits against the same row cut after them, for rows of 16 and 129
    tokens: a causal model's prefix does not depend on what follows it, nor on how much
    (other shapes, so a finding above the rounding bar)."""
    worst = 0.0
    for length in (16, 129):
        row = ids(model, length, seed=7)
        cut = float((predicted(model, row)[:, :15] - predicted(model, row[:, :15])).abs().max())
        print(f"a row of {length} tokens cut after its first 15: their logits move by {cut:.3g}")
        worst = max(worst, cut)
    return worst, beyond_rounding(worst, model)


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


def pooled_differences(model: torch.nn.Module) -> dict[str, float]:
    """A sequence classifier's scores (raw, [1, C]) for a row of 3 tokens padded by 4 on the
    right and on the left (the pad id in the padded slots, the mask given, position ids from
    the mask where the model takes them) against the row alone, by side: the shorter of the
    two rows suites/pooling.py measures, whose padding lies within a few positions of every
    real token (a convolution's reach, say). Prints both."""
    pad = getattr(model.config, "pad_token_id", None) or 0
    real = ids(model, 3)
    padding = torch.full((1, 4), pad)
    rows = {
        "right": (torch.cat([real, padding], 1), [1] * 3 + [0] * 4, [0, 1, 2, 2, 2, 2, 2]),
        "left": (torch.cat([padding, real], 1), [0] * 4 + [1] * 3, [0, 0, 0, 0, 0, 1, 2]),
    }
    other_id = (pad + 5) % vocab_size(model)
    with torch.no_grad():
        alone = model(input_ids=real).logits.double()
        differences = {}
        for side, (row, mask, positions) in rows.items():
            inputs = {"input_ids": row, "attention_mask": torch.tensor([mask])}
            if takes(model, "position_ids"):
                inputs["position_ids"] = position_ids(model, positions)
            padded = model(**inputs).logits.double()
            differences[side] = float((padded - alone).abs().max())
            inputs["input_ids"] = row.masked_fill(torch.tensor([mask]) == 0, other_id)  # other ids, same mask
            differences[f"{side}_ids"] = float((model(**inputs).logits.double() - padded).abs().max())
    print(
        f"pooled scores, right-padded against alone: {differences['right']:.3g}; left-padded: {differences['left']:.3g}; "
        f"other ids in the padded slots (same shapes): right {differences['right_ids']:.3g}, "
        f"left {differences['left_ids']:.3g}"
    )
    return differences


def pooling(model: torch.nn.Module, task: str) -> tuple[float, bool]:
    """(a pooled output that reads padded slots) the smaller side's difference: a finding
    only where neither padding side gives the row alone."""
    measured = pooled_differences(model)
    difference = min(measured["right"], measured["left"])
    return difference, beyond_rounding(difference, model)


def pooling_ids(side: str) -> Callable[[torch.nn.Module, str], tuple[float, bool]]:
    """(a pooled output's pad_ids) other ids in that side's padded slots, the mask the same:
    same shapes, so any difference is a leak."""

    def check(model: torch.nn.Module, task: str) -> tuple[float, bool]:
        difference = pooled_differences(model)[f"{side}_ids"]
        return difference, difference > 0.0

    return check


def pooling_side(side: str) -> Callable[[torch.nn.Module, str], tuple[float, bool]]:
    """(a pooled output broken on one side) that side's difference."""

    def check(model: torch.nn.Module, task: str) -> tuple[float, bool]:
        difference = pooled_differences(model)[side]
        return difference, beyond_rounding(difference, model)

    return check


def tagger_loss(model: torch.nn.Module, task: str) -> tuple[float, bool]:
    """A token classifier's own loss, labels one per token (seeded, in [0, num_labels)) and -100
    at padding as DataCollatorForTokenClassification pads them: a row of 3 tokens right-padded
    by 4 with the pad id against the same row with other ids in its padded slots (same shapes:
    any difference is a leak), and against the row alone (a difference beyond rounding). Prints
    both; returns the larger."""
    pad = getattr(model.config, "pad_token_id", None) or 0
    real = ids(model, 3)
    labels = torch.randint(0, model.config.num_labels, (1, 3), generator=torch.Generator().manual_seed(0))
    padded_labels = torch.cat([labels, torch.full((1, 4), -100)], 1)
    mask = torch.tensor([[1, 1, 1, 0, 0, 0, 0]])
    with torch.no_grad():
        alone = model(input_ids=real, labels=labels).loss.double()
        with_pad = model(
            input_ids=torch.cat([real, torch.full((1, 4), pad)], 1), attention_mask=mask, labels=padded_labels
        )
        other = torch.full((1, 4), (pad + 5) % vocab_size(model))
        with_other = model(input_ids=torch.cat([real, other], 1), attention_mask=mask, labels=padded_labels)
    by_ids = float((with_pad.loss.double() - with_other.loss.double()).abs())
    by_padding = float((with_pad.loss.double() - alone).abs())
    print(f"the loss with other padded ids: |difference| = {by_ids:.3g}; right-padded against alone: {by_padding:.3g}")
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
    "truncation": truncation,
    "padding": padding,
    "pooling": pooling,
    "pooling_right": pooling_side("right"),
    "pooling_left": pooling_side("left"),
    "pooling_ids_right": pooling_ids("right"),
    "tagger_loss": tagger_loss,
    "pooling_ids_left": pooling_ids("left"),
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
    parser.add_argument(
        "--task",
        default="causal-lm",
        choices=["causal-lm", "masked-lm", "seq2seq", "sequence-classification", "token-classification"],
    )
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
