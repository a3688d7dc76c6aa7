"""The leak canary on a trainer: a transformers ``Trainer``, or TRL's ``SFTTrainer`` with or
without packing, run as configured on the canary's documents.

A trainer decides what a row is: its collator pads or flattens, TRL packs documents into
rows (best-fit decreasing, padding-free; or wrapped, back to back). So the canary hands it
documents, not rows, and reads the batches the trainer collates:

- ``uniform``: documents of ``length`` i.i.d. uniform ids. Every target the trainer scores
  is bounded by ``log(ids)``, however it packs them.
- ``twin_documents``: documents of ``length // 2`` ids, each given twice in a row. TRL
  packs the dataset before the sampler shuffles it, so a copy lands in the row of its
  first copy. The twin targets of a collated row are those whose ``TWIN_CONTEXT``
  preceding tokens occurred earlier in the same row (the first copy): the selection reads
  only what comes before a target, so a leak-free model's loss on them keeps the bound.
  The trainer's own loss covers every target and is diluted by the ones that cannot leak;
  maskcheck's cross-entropy of the same logits on the twin targets alone is the sharper
  test and decides too.

What the trainer logs each step (the training loss of that step's batch, before its
update) is the pipeline's loss; the logits of its own ``compute_loss`` give the reference.
On the first packed batch, the canary measures whether the model isolates the packed
documents in the forward the trainer runs: it changes every other document of a row and
reports how far one document's logits move, with the attention implementation.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from .canary import (
    IGNORE_INDEX,
    NEXT_SUITE,
    CanaryError,
    CanaryResult,
    CanarySettings,
    decide,
    judged,
    logits_of,
    reference_loss,
)

#: tokens before a target that must have occurred earlier in its row for it to be a twin
#: target: 16 ** -6 makes a chance repeat in a row of a few hundred tokens rare, and a
#: document of 16 keeps 10 of its 15 targets
TWIN_CONTEXT = 6
NO_BOUNDARY = "position ids do not restart in the collated rows: the model is told of no document boundary inside a row"
#: an encoder-decoder's sources come from this seed plus the data seed, apart from its targets
SOURCE_SEED = 2**31
#: where the first collated batches hold no twin target, the canary cannot run
PEEKED_BATCHES = 3
ARGUMENTS = {  # what the canary sets on the trainer's arguments for its run, and restores after
    "per_device_train_batch_size": None,  # settings.batch rows, or the rows that hold as many tokens packed
    "max_steps": None,
    "num_train_epochs": 1,
    "logging_steps": 1,
    "gradient_accumulation_steps": 1,
    "report_to": [],
    "save_strategy": "no",
    "dataloader_drop_last": True,
    "seed": None,
}


def is_sft_trainer(trainer: Any) -> bool:
    """TRL's SFTTrainer (or a subclass), which prepares and packs its own dataset."""
    return any(c.__name__ == "SFTTrainer" and c.__module__.startswith("trl") for c in type(trainer).__mro__)


def canary_documents(canary: str, settings: CanarySettings, seed: int, count: int) -> list[list[int]]:
    """``count`` documents for ``canary`` from ``seed``: ``uniform``, documents of
    ``settings.length`` ids; ``twin_documents``, documents of ``length // 2``, each twice
    in a row."""
    generator = torch.Generator().manual_seed(seed)
    low, high = settings.first_id, settings.first_id + settings.ids
    if canary == "uniform":
        return torch.randint(low, high, (count, settings.length), generator=generator).tolist()
    if canary == "twin_documents":
        drawn = torch.randint(low, high, ((count + 1) // 2, settings.length // 2), generator=generator).tolist()
        return [document for document in drawn for _ in range(2)][:count]
    raise CanaryError(
        f"a trainer shuffles its examples, so the {canary} canary cannot place its rows: run uniform or twin_documents"
    )


def twin_targets(input_ids: Tensor, labels: Tensor, context: int = TWIN_CONTEXT) -> Tensor:
    """``[B, T]`` bool: the scored label positions whose ``context`` preceding tokens occurred
    earlier in the same row (the first copy of their document, for the twin canary).
    Decided from what precedes each target only, never from the target."""
    scored = torch.zeros_like(labels, dtype=torch.bool)
    for row, ids in enumerate(input_ids.tolist()):
        seen: set[tuple[int, ...]] = set()
        for t in range(context, len(ids)):
            preceding = tuple(ids[t - context : t])
            scored[row, t] = preceding in seen
            seen.add(preceding)
    return scored & (labels != IGNORE_INDEX)


def packed_documents(position_ids: Tensor | None) -> list[tuple[int, int, int]]:
    """``(row, start, end)`` of every document in rows whose position ids restart (packed)."""
    if position_ids is None:
        return []
    documents = []
    for row, positions in enumerate(position_ids.tolist()):
        starts = [t for t, p in enumerate(positions) if p == 0]
        if len(starts) > 1:
            documents += [(row, s, e) for s, e in zip(starts, starts[1:] + [len(positions)], strict=True)]
    return documents


def document_isolation(model: torch.nn.Module, inputs: dict[str, Any], settings: CanarySettings) -> str:
    """How far the logits of one packed document move when every other document of its row
    is drawn again, in the forward the trainer runs (its inputs, eval mode, no gradient)."""
    documents = packed_documents(inputs.get("position_ids"))
    attention = getattr(getattr(model, "config", None), "_attn_implementation", "unknown")
    if not documents:
        return ""
    row, start, end = max(documents, key=lambda d: d[1])  # the last of a row: causal attention lets it read the rest
    ids = inputs["input_ids"]
    changed = ids.clone()
    shift = torch.randint(1, settings.ids, changed[row].shape, generator=torch.Generator().manual_seed(0))
    others = (
        ids[row] - settings.first_id + shift.to(ids.device)
    ) % settings.ids + settings.first_id  # every id changes
    keep = torch.zeros(ids.shape[1], dtype=torch.bool)
    keep[start:end] = True
    changed[row] = torch.where(keep.to(ids.device), ids[row], others)
    forward = {k: v for k, v in inputs.items() if k not in ("labels", "num_items_in_batch")}
    training = model.training
    model.eval()
    try:
        with torch.no_grad():
            before = logits_of(model(**forward))[row, start:end].float()
            after = logits_of(model(**{**forward, "input_ids": changed}))[row, start:end].float()
    finally:
        model.train(training)
    moved = float((before - after).abs().max())
    verdict = "isolated" if moved == 0.0 else "NOT isolated"
    return (
        f"packed rows, {len(documents)} documents in the first batch, attention {attention}: drawing the other "
        f"documents of a row again moves one document's logits by {moved:.3g} ({verdict})"
    )


def trainer_canary(
    trainer: Any, canary: str = "uniform", settings: CanarySettings | None = None, seed: int = 0
) -> CanaryResult:
    """Run ``trainer`` as it is configured (model, optimiser settings, collator, packing) on
    the canary's documents for ``settings.steps`` steps of fresh batches, and judge the loss
    it logs each step; the trainer's arguments and ``compute_loss`` are restored after."""
    settings = settings or CanarySettings()
    rows = _rows_a_step(trainer, settings)
    dataset = _canary_dataset(trainer, canary, settings, seed, rows)
    run = _Recorder(trainer, canary, settings)
    saved = {name: getattr(trainer.args, name) for name in ARGUMENTS if hasattr(trainer.args, name)}
    overrides = {**ARGUMENTS, "per_device_train_batch_size": rows, "max_steps": settings.steps, "seed": seed}
    own_dataset, own_loss = trainer.train_dataset, trainer.__dict__.get("compute_loss")
    own_batch_size = getattr(trainer, "_train_batch_size", None)
    callback = run.callback()
    printers = _printers(trainer)  # a log line each step would bury the verdict
    try:
        for callback_printing in printers:
            trainer.remove_callback(callback_printing)
        for name, value in overrides.items():
            setattr(trainer.args, name, value)
        trainer._train_batch_size = trainer.args.train_batch_size  # read once at construction
        trainer.train_dataset = dataset
        if canary == "twin_documents":
            _require_twins(trainer)
        trainer.compute_loss = run.compute_loss
        trainer.add_callback(callback)
        try:
            trainer.train()
        except Exception as exc:  # noqa: BLE001 - the user's trainer: one line
            raise CanaryError(f"the trainer raised: {type(exc).__name__}: {exc}") from exc
    finally:
        if callback in trainer.callback_handler.callbacks:
            trainer.remove_callback(callback)
        for callback_printing in printers:
            trainer.add_callback(callback_printing)
        for name, value in saved.items():
            setattr(trainer.args, name, value)
        trainer.train_dataset, trainer._train_batch_size = own_dataset, own_batch_size
        if own_loss is None:
            trainer.__dict__.pop("compute_loss", None)  # the class's own again
        else:
            trainer.compute_loss = own_loss
    return run.verdict()


def _is_encoder_decoder(model: Any) -> bool:
    return bool(getattr(getattr(model, "config", None), "is_encoder_decoder", False))


def _printers(trainer: Any) -> list[Any]:
    """The trainer's callbacks that print every log: the canary logs every step."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    return [c for c in trainer.callback_handler.callbacks if isinstance(c, PrinterCallback | ProgressCallback)]


def _packed_length(trainer: Any) -> int | None:
    """The row length TRL packs documents into, or None where the trainer does not pack."""
    args = trainer.args
    if is_sft_trainer(trainer) and getattr(args, "packing", False):
        return getattr(args, "max_length", None)
    return None


def _rows_a_step(trainer: Any, settings: CanarySettings) -> int:
    """``settings.batch`` rows, or, where TRL packs to ``max_length``, the packed rows that
    hold as many tokens (at least one)."""
    packed = _packed_length(trainer)
    return max(1, settings.batch * settings.length // packed) if packed else settings.batch


def _canary_dataset(trainer: Any, canary: str, settings: CanarySettings, seed: int, rows: int) -> Any:
    """The canary's documents as the trainer's training data: TRL's SFTTrainer prepares
    (and packs) them itself; any other trainer gets them as examples of ``input_ids``,
    ``attention_mask`` and ``labels`` for its collator. Enough for one epoch of the steps,
    so no batch is seen twice."""
    needed = settings.steps * rows
    if not is_sft_trainer(trainer):
        documents = canary_documents(canary, settings, seed, needed)
        if not _is_encoder_decoder(trainer.model):
            return [{"input_ids": d, "attention_mask": [1] * len(d), "labels": list(d)} for d in documents]
        if canary != "uniform":
            raise CanaryError(f"an encoder-decoder's trainer packs no documents: the {canary} canary cannot run")
        # the target is the document; the source, drawn apart, says nothing of it
        sources = canary_documents("uniform", settings, SOURCE_SEED + seed, needed)
        return [
            {"input_ids": s, "attention_mask": [1] * len(s), "labels": d}
            for s, d in zip(sources, documents, strict=True)
        ]
    import datasets

    args = trainer.args
    length = settings.length if canary == "uniform" else settings.length // 2
    packed = _packed_length(trainer)
    per_row = max(1, packed // length) if packed else (1 if canary == "uniform" else 2)
    documents = canary_documents(canary, settings, seed, needed * per_row + 2 * per_row)
    bars = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()  # a bar per preparation stage would bury the canary's progress
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            prepared = trainer._prepare_dataset(  # the trainer's own tokenisation check, labels and packing
                datasets.Dataset.from_dict({"input_ids": documents}),
                trainer.processing_class,
                args,
                getattr(args, "packing", False),
                None,
                "train",
            )
    finally:
        if bars:
            datasets.enable_progress_bars()
    if len(prepared) < needed:
        raise CanaryError(
            f"the trainer prepared {len(prepared)} rows from the canary's documents, fewer than the {needed} that "
            f"{settings.steps} steps of {rows} take"
        )
    return prepared


def _require_twins(trainer: Any) -> None:
    """The twin canary needs a document's two copies in one collated row; say so before
    training when the trainer's first batches hold none."""
    loader = trainer.get_train_dataloader()
    for index, batch in enumerate(loader):
        if twin_targets(batch["input_ids"], batch["labels"]).any():
            return
        if index + 1 == PEEKED_BATCHES:
            break
    raise CanaryError(
        f"no document shares a row with its copy in the trainer's first {PEEKED_BATCHES} batches: it does not pack "
        "documents together (each example is its own row, shuffled), so there is nothing for the twin_documents "
        "canary to read; run uniform"
    )


class _Recorder:
    """What the canary reads from a trainer's run: the loss it logs each step, and beside it
    maskcheck's cross-entropy of the logits of its own ``compute_loss``."""

    def __init__(self, trainer: Any, canary: str, settings: CanarySettings) -> None:
        self.trainer, self.canary, self.settings = trainer, canary, settings
        #: an encoder-decoder's logits[t] predict labels[t] (its decoder inputs are the labels
        #: shifted right); a causal LM's predict labels[t + 1]
        self.shift = not _is_encoder_decoder(trainer.model)
        self.own_compute_loss: Callable[..., Any] = trainer.compute_loss
        self.losses: list[float] = []
        self.references: list[float] = []
        self.unshifted: list[float] = []
        self.twin_references: list[float] = []  # on the twin targets alone
        self.twin_share: list[float] = []  # the share of the batch's targets that are twin targets
        self.notes: list[str] = []

    def compute_loss(self, model: Any, inputs: dict[str, Any], return_outputs: bool = False, **kwargs: Any) -> Any:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # TRL recomputes the logits it no longer returns
            loss, outputs = self.own_compute_loss(model, inputs, return_outputs=True, **kwargs)
        logits, labels = logits_of(outputs), inputs.get("labels")
        if isinstance(logits, Tensor) and isinstance(labels, Tensor):
            logits = logits.detach()
            self.references.append(reference_loss(logits, labels, shift=self.shift))
            if self.shift:  # the alternative a causal LM's step can get wrong: scoring what it reads
                self.unshifted.append(reference_loss(logits, labels, shift=False))
            if self.canary == "twin_documents":
                twins = twin_targets(inputs["input_ids"], labels)
                self.twin_references.append(reference_loss(logits, labels, scored=twins))
                self.twin_share.append(float(twins.sum() / (labels[:, 1:] != IGNORE_INDEX).sum().clamp(min=1)))
        if not self.notes and model.training and self.shift:  # an encoder-decoder packs nothing
            note = document_isolation(model, inputs, self.settings)
            self.notes.append(note or NO_BOUNDARY)
        return (loss, outputs) if return_outputs else loss

    def callback(self) -> Any:
        from transformers import TrainerCallback

        losses = self.losses

        class LossLog(TrainerCallback):
            def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> None:
                if logs and "loss" in logs:
                    losses.append(float(logs["loss"]))

        return LossLog()

    def verdict(self) -> CanaryResult:
        settings, bound = self.settings, math.log(self.settings.ids)
        paired = len(self.references) == len(self.losses)  # one loss computed per logged step
        references = self.references if paired else []
        unshifted = self.unshifted if paired else []  # empty for an encoder-decoder
        result = judged(self.canary, bound, self.losses, settings, references, unshifted)
        if self.canary == "twin_documents" and paired:
            result = self._with_twin_targets(result, bound)
        result.notes = [n for n in self.notes if n]
        return result

    def _with_twin_targets(self, own: CanaryResult, bound: float) -> CanaryResult:
        """The judgement of the trainer's loss over every target, and beside it maskcheck's
        cross-entropy on the twin targets alone, the sharper test: either below the bound is
        a leak."""
        settings, twins = self.settings, self.twin_references
        share = sum(self.twin_share) / len(self.twin_share)
        targets = f"the twin targets ({share:.0%} of the targets: the second copies whose first copy shares the row)"
        fired, below, margin = decide(twins, bound, settings)
        if fired is None:
            own.message += (
                f"; maskcheck's cross-entropy on {targets} stays above the bound "
                f"(nearest window {bound - below:.3f}, test {bound - margin:.3f})"
            )
            return own
        window = twins[fired + 1 - settings.window : fired + 1]
        measured = (
            f"maskcheck's cross-entropy of the trainer's logits on {targets} averages {sum(window) / len(window):.3f} "
            f"nats over steps {fired + 1 - settings.window}-{fired}, {below:.3g} below the bound of {bound:.3f} "
            f"(test margin {margin:.3g})"
        )
        if own.status == "fail":
            own.message = f"{own.message}; {measured}"
            return own
        result = CanaryResult(self.canary, "fail", bound, self.losses, twins, fired_at=fired, below=below)
        result.margin = margin
        result.message = (
            f"the twin_documents canary fired at step {fired}: {measured}, where no leak-free pipeline goes "
            f"(log {settings.ids}, alpha {settings.alpha:g}); the trainer's own loss over every target, diluted by "
            f"the targets that cannot leak, does not fire (nearest window {bound - own.below:.3f}, test "
            f"{bound - own.margin:.3f}): packed documents read each other, the pipeline sees the answer. "
            f"Localise it with {NEXT_SUITE[self.canary]}"
        )
        return result
