"""norm_checkpoint: a checkpoint must run under the layout it was trained with.

The same parameter names under another layout (pre- or post-norm, with or without a final
norm, LayerNorm or RMSNorm, RMSNorm with a ``1 + w`` scale, another position scheme) give a
model that runs and computes something else. Three kinds of evidence, strongest first:

- ``metadata``: the layout the checkpoint recorded against the layout the model runs with.
- ``fingerprint``: the log-probabilities the model gave a fixed probe batch when it was
  saved must come back (shape-changing rule with a zero floor: another machine or dtype
  may round differently, a wrong layout moves them by orders of magnitude more).
- ``behaviour``, which needs nothing but the weights: rebuild them under every layout that
  differs in one field and that they fit, measure the loss on probe data under each, and
  name the layout they fit, with the losses. The probe data are random token sequences
  repeated twice, scored on the second copy (encoders: every other second-copy token is
  replaced by the pad id and predicted), each layout at its best single temperature. Continuing a repeated sequence is what induction heads do, and they form in
  trained Transformer language models of two or more layers whatever the training text
  (Olsson et al., 2022, "In-context learning and induction heads"); a model under its own
  layout predicts the copy better than chance, under a wrong one it loses that. Untrained
  weights predict nothing under any layout: ``warn`` (inconclusive), never pass or fail.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from hypothesis import strategies as st
from torch import Tensor

from ..harness.adapters.base import Adapter, Batch, Capabilities
from ..harness.engine.cases import pad_token, random_ids, shape_change_outcome
from ..harness.engine.strategies import case_strategy
from ..harness.engine.suite import Check, Outcome, RunContext, Suite
from ..harness.engine.verdict import CheckResult
from ..reference_models.config import LAYOUT_VALUES

PROBE_ROWS = 8
PROBE_HALF = 16
#: the best layout must beat chance (log V) by this fraction for the weights to count as trained
SIGNAL_FRACTION = 0.2
#: the declared layout may trail the best by this fraction of log V before it counts as a misfit
MARGIN_FRACTION = 0.05  # 7x the widest gap measured on correct checkpoints: docs/tolerance.md
#: variants within this fraction of log V of the best fit it equally (they compute the same function)
TIE = 0.002
#: temperatures tried per layout (log-spaced, 1/8 to 8)
TEMPERATURES = tuple(2.0 ** (k / 2) for k in range(-6, 7))


@dataclass(frozen=True)
class ProbeCase:
    seed: int


def describe(layout: dict[str, Any], fields: list[str] | None = None) -> str:
    return ", ".join(f"{k}={v}" for k, v in layout.items() if fields is None or k in fields)


class NormCheckpointSuite(Suite):
    name = "norm_checkpoint"
    summary = "a checkpoint runs under the norm layout and position scheme it was trained with"
    order = 70
    kind = "state"
    call_paths = False  # the layout a checkpoint fits is the same on every call path
    float32_twin = False  # and in every dtype: it scores the weights' fit, with its own margins

    def not_applicable(self, capabilities: Capabilities) -> str | None:
        return None  # decided per evidence in checks(): a checkpoint's load evidence needs no layout

    def checks(self, adapter: Adapter, context: RunContext) -> list:
        once = case_strategy(ProbeCase, seed=st.just(context.seed))
        checks: list = []
        loading = getattr(adapter, "loading_info", None)
        if loading is not None:
            checks.append(Check("load", lambda c: self.load(adapter, loading), once, max_examples=1))
        if loading is None:
            checks.append(CheckResult("load", "not_applicable", "the model was not loaded from a checkpoint directory"))
        if adapter.layout() is None:
            reason = "the adapter cannot rebuild the weights under another variant (reference models and Hugging Face causal LMs can)"
            checks.append(CheckResult("behaviour", "not_applicable", reason))
            return checks
        record = adapter.checkpoint
        if record is None:
            checks.append(
                CheckResult(
                    "metadata", "not_applicable", "the model was not loaded from a checkpoint that records its layout"
                )
            )
            checks.append(
                CheckResult(
                    "fingerprint", "not_applicable", "the model was not loaded from a checkpoint with a fingerprint"
                )
            )
        else:
            checks.append(Check("metadata", lambda c: self.metadata(adapter), once, max_examples=1))
            if record.probe is None:
                checks.append(
                    CheckResult("fingerprint", "not_applicable", f"{record.path} was saved without a fingerprint")
                )
            else:
                checks.append(Check("fingerprint", lambda c: self.fingerprint(adapter, context), once, max_examples=1))
        checks.append(Check("behaviour", lambda c: self.behaviour(adapter, c), once, max_examples=1))
        return checks

    def load(self, adapter: Adapter, info: Any) -> Outcome:
        """Every tensor of the checkpoint is used and every parameter comes from it."""
        problems = []
        for names, what in (
            (info.unexpected, "checkpoint tensors the class never reads"),
            (info.missing, "parameters the checkpoint does not hold (initialised at random)"),
            (info.mismatched, "tensors whose shape does not fit their parameter"),
        ):
            if names:
                problems.append(f"{len(names)} {what}: {', '.join(names[:4])}{' ...' if len(names) > 4 else ''}")
        if not problems:
            return Outcome("pass", message="every tensor of the checkpoint is used and every parameter comes from it")
        from ..harness.adapters.checkpoint_fit import checkpoint_names, matching_classes

        architecture = type(getattr(adapter, "model", None)).__name__
        fits = [name for name in matching_classes(checkpoint_names(info.checkpoint)) if name != architecture]
        hint = (
            f"; its tensor names fit {', '.join(fits)}"
            if fits
            else "; no causal-LM class of this transformers has exactly its tensor names"
        )
        count = len(info.unexpected) + len(info.missing) + len(info.mismatched)
        return Outcome(
            "fail",
            float(count),
            0.0,
            0.0,
            [],
            f"the checkpoint does not fit {architecture}: {'; '.join(problems)}{hint}",
        )

    def metadata(self, adapter: Adapter) -> Outcome:
        assert adapter.checkpoint is not None
        recorded, running = adapter.checkpoint.layout, adapter.layout() or {}
        differ = [k for k in recorded if k in running and recorded[k] != running[k]]
        if not differ:
            return Outcome("pass", message=f"runs with the recorded layout ({describe(recorded, list(LAYOUT_VALUES))})")
        changes = "; ".join(f"{k}: trained with {recorded[k]!r}, running with {running[k]!r}" for k in differ)
        return Outcome(
            "fail", float(len(differ)), 0.0, 0.0, [], f"the checkpoint metadata records another layout ({changes})"
        )

    def fingerprint(self, adapter: Adapter, context: RunContext) -> Outcome:
        record = adapter.checkpoint
        assert record is not None and record.probe is not None and record.probe_logprobs is not None
        logits = adapter.logits(record.probe.to(adapter.capabilities.device))  # [B, T, V]
        columns = record.probe_logprobs.shape[-1]
        measured = torch.log_softmax(logits.double(), -1)[..., :columns].cpu()
        where = torch.ones(measured.shape[:2], dtype=torch.bool)
        what = "the model does not reproduce the log-probabilities recorded in the checkpoint at save time"
        # Saved values are log-probabilities already; compare them as they are, not renormalised.
        # The floor is 0: the recording was made on another run, perhaps another machine.
        outcome = shape_change_outcome(
            context, measured, record.probe_logprobs.double(), where, 0.0, what, normalise=False
        )
        if outcome.status == "fail":
            outcome.message += f" (recorded layout: {describe(record.layout, list(LAYOUT_VALUES))}; running: {describe(adapter.layout() or {}, list(LAYOUT_VALUES))})"
        return outcome

    def behaviour(self, adapter: Adapter, case: ProbeCase) -> Outcome:
        probe, targets = probe_batch(adapter, case.seed)
        declared = adapter.layout() or {}
        scores = {"declared": probe_loss(adapter, probe, targets)}  # name -> (loss, temperature)
        for name, variant in adapter.layout_variants():
            scores[name] = probe_loss(variant, probe, targets)
            del variant  # one variant's model at a time
        losses = {name: loss for name, (loss, _) in scores.items()}
        chance = math.log(adapter.capabilities.vocab_size)
        # Ranked at the precision the message prints, then by name: variants that compute one
        # function (equal losses up to rounding) keep one order in an audit and in its replay.
        ranked = sorted(losses, key=lambda name: (round(losses[name], 3), name))
        best = ranked[0]
        gap = losses["declared"] - losses[best]
        margin = MARGIN_FRACTION * chance
        table = [
            {"variant": name, "probe loss": round(losses[name], 4), "temperature": round(scores[name][1], 3)}
            for name in ranked
        ]
        changed = {name.split("=", 1)[0] for name in losses if "=" in name}
        declared_text = describe(declared, [k for k in declared if k in changed]) or describe(declared)
        listed = ", ".join(f"{name} {losses[name]:.3f}" for name in ranked)
        evidence = f"probe loss (repeated random sequences; chance log V = {chance:.3f}): {listed}"
        if len(losses) == 1:
            return Outcome(
                "warn",
                0.0,
                0.0,
                margin,
                [],
                f"inconclusive: no other variant of the architecture fits these weights, so there is nothing to compare; {evidence}",
                table=table,
            )
        if chance - losses[best] < SIGNAL_FRACTION * chance:
            message = f"inconclusive: no variant predicts the probe better than chance, so the probe cannot tell the variants apart; {evidence}"
            return Outcome("warn", gap, 0.0, margin, [], message, table=table)
        if gap <= margin:
            return Outcome(
                "pass",
                gap,
                0.0,
                margin,
                [],
                f"the weights fit the declared layout ({declared_text}); {evidence}",
                table=table,
            )
        # Variants that compute the same function (Mistral's window wider than the probe, say) fit equally.
        equally = [name for name in ranked[1:] if losses[name] - losses[best] <= TIE * chance and name != "declared"]
        also = f" (equally: {', '.join(equally)})" if equally else ""
        message = (
            f"the weights fit {best}{also} (probe loss {losses[best]:.3f}), not the declared layout {declared_text} "
            f"(probe loss {losses['declared']:.3f}); {evidence}"
        )
        return Outcome("fail", gap, 0.0, margin, [], message, table=table)


def probe_batch(adapter: Adapter, seed: int) -> tuple[Batch, Tensor]:
    """``PROBE_ROWS`` random sequences, each repeated twice (``[x, x]``), and the target ids.

    Encoders get every other slot of the second copy replaced by the pad id, and predict it.
    """
    caps = adapter.capabilities
    half = max(2, min(PROBE_HALF, (caps.max_length or 2 * PROBE_HALF) // 2))
    first = random_ids(seed + 99, (PROBE_ROWS, half), caps.vocab_size, pad_token(adapter), caps.device)
    targets = torch.cat([first, first], dim=1)  # [B, 2 * half]
    if caps.family == "encoder_decoder":
        return Batch(
            first, torch.ones_like(first), decoder_input_ids=targets, decoder_attention_mask=torch.ones_like(targets)
        ), targets
    ids = targets.clone()
    if caps.family == "encoder":
        ids[:, half::2] = pad_token(adapter)
    return Batch(ids, torch.ones_like(ids)), targets


def probe_loss(adapter: Adapter, probe: Batch, targets: Tensor) -> tuple[float, float]:
    """Mean cross-entropy on the second copy at the best single temperature, and that temperature.

    Decoders: position t predicts token t + 1 (the copy's first token has no cue yet).
    Encoders: the masked second-copy slots predict the ids they hid. The temperature is
    fitted per layout so that a layout which only sharpens or flattens the logits (dropping
    a final norm, say) earns nothing: what counts is how well the weights rank the answer.
    """
    # float32 is plenty: losses are compared at a margin of a tenth of log V.
    logits = adapter.logits(probe).float()  # [B, 2h, V]
    half = targets.shape[1] // 2
    if adapter.capabilities.family == "encoder":
        hidden = probe.input_ids[:, half:] != targets[:, half:]  # [B, h]: the masked slots
        scored, wanted = logits[:, half:][hidden], targets[:, half:][hidden]  # [N, V], [N]
    else:
        scored, wanted = logits[:, half:-1].reshape(-1, logits.shape[-1]), targets[:, half + 1 :].reshape(-1)
    inverse = torch.tensor([1.0 / t for t in TEMPERATURES], device=scored.device)[:, None, None]  # [K, 1, 1]
    picked = scored.gather(-1, wanted[:, None])[None] * inverse  # [K, N, 1]: the answer's logit at each temperature
    losses = (torch.logsumexp(scored[None] * inverse, -1, keepdim=True) - picked).mean(dim=(1, 2))  # [K]: cross-entropy
    best = int(losses.argmin())
    return float(losses[best]), TEMPERATURES[best]
