"""Adapter for Hugging Face ``transformers`` models: causal LM, masked LM and seq2seq, and the
models that end elsewhere (sequence and token classifiers, reward heads, base models), whose
output is measured (:mod:`.outputs`).

Loads only safetensors and never sets ``trust_remote_code`` unless the caller asks.
Cached decoding goes through the model's own generation methods (see
:mod:`.generation`). A model without them (an object that only looks like a transformers
model, or a transformers version whose generation loop still passes ``cache_position``)
is stepped by hand: the cache keyword of ``forward`` changed name within transformers 5.x
(``past_key_values`` became ``cache``), so the adapter reads the forward signature once
and uses whichever the installed version has.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from . import hf_variants
from .base import (
    ALL_POSITIONS,
    Adapter,
    AdapterError,
    Batch,
    Capabilities,
    ForwardKeywords,
    PackingSetting,
    ServingUnsupported,
    call_model,
    extend,
    positions_from_mask,
)
from .generation import GenerationPath, GenerationState, drives_generation
from .hf_loading import HFLoadError, LoadingInfo, Task, family_of, infer_task
from .hf_probes import (
    check_logit_rows,
    declared_attention,
    declared_layers,
    position_offset,
    returns_loss,
    unverified_layers,
)
from .memo import plain_values
from .outputs import OUTPUT_NAMES, OutputKind, measure_output, read_output, vocabulary
from .peft_models import is_peft_model, unwrap_peft
from .serving import crop_cache, layer_names, rearrange_cache, reset_cache, select_rows
from .task_names import LM_TASKS, TASKS


@dataclass
class HFState:
    cache: Any  # the model's own Cache object, mutated in place by forward
    mask: Tensor  # [B, T_so_far] of the decoder side
    next_position: Tensor  # [B]
    encoder_outputs: Any = None  # seq2seq: the encoder's output, computed once
    source_mask: Tensor | None = None


@dataclass
class LogitsToKeep:
    """Whether this model's ``logits_to_keep`` gives the logits of the last positions asked
    for, measured on the first request against the full forward's (shared by an adapter's
    copies, so each path does not measure it again).

    A signature says only that the keyword exists: the first request runs both forwards,
    answers with the full one's positions, and keeps the keyword only where the kept
    logits have its shape and differ from it by at most a tenth of what adjacent positions
    differ by (rounding moves a logit by far less; a wrong position by about that much)."""

    named: bool  # the model's forward names the keyword
    right: bool | None = None  # None: not measured yet
    detail: str = ""

    def measure(self, kept: Any, full: Tensor, keep: int) -> None:
        """``kept``: the model's answer with ``logits_to_keep=keep`` (or what it raised);
        ``full [B, T, V]``: its answer without it, ``keep < T``."""
        if isinstance(kept, Exception):
            self.right, self.detail = False, f"the model raised with it: {kept}"
            return
        expected = full[:, -keep:]  # [B, keep, V]
        if not isinstance(kept, Tensor) or kept.shape != expected.shape:
            shape = list(kept.shape) if isinstance(kept, Tensor) else type(kept).__name__
            self.right, self.detail = False, f"it returned {shape} for the last {keep} positions of {list(full.shape)}"
            return
        error = float((kept.double() - expected.double()).abs().max())
        spread = float((expected.double() - full[:, -keep - 1 : -1].double()).abs().max())
        self.right = error <= spread / 10  # False for a NaN
        self.detail = f"max |kept - full| = {error:.3g}; adjacent positions differ by up to {spread:.3g}"


class HFAdapter(Adapter):
    def __init__(
        self, model: Any, spec: str = "<transformers model>", task: str | None = None, tokenizer: Any = None
    ) -> None:
        #: what wraps the model audited (a PeftModel's adapter), one line; None for a model as it is
        self.wrapper: str | None = None
        if is_peft_model(model):
            model, self.wrapper = unwrap_peft(model)
        chosen = task or infer_task(model.config, [type(model).__name__])
        if chosen not in TASKS:
            raise HFLoadError(f"unknown task {chosen!r}; choose one of {', '.join(TASKS)}")
        self.task: Task = chosen  # type: ignore[assignment]
        family = family_of(model.config, chosen, model)
        keywords = ForwardKeywords.of(model)
        self.cache_keyword = (
            "cache" if keywords.named("cache") else ("past_key_values" if keywords.named("past_key_values") else None)
        )
        # Whatever its cache keyword (RWKV's is ``state``), a forward that takes ``use_cache``
        # is called without a cache for a full forward: one cached forward of one token is
        # another path (RWKV's mixes the rows of a batch).
        self.takes_use_cache = keywords.named("use_cache") and chosen != "masked-lm"
        vocab_size = _output_vocab(model)
        # What a signature cannot tell is measured by calling the model: the rows of its
        # logits (or what a head returns), where its positions start, and (below) whether
        # labels give a loss.
        output = _measured_output(model, chosen, vocab_size)
        offset = position_offset(model, chosen, vocab_size) if keywords.named("position_ids") else 0
        #: the model's own generation methods, when it has them; None: steps built by hand
        self.generation, no_cache_reason = self._decoding(
            model, family, keywords.named("position_ids"), offset, vocab_size, output
        )
        capabilities = self._capabilities(model, keywords, vocab_size, offset, no_cache_reason, tokenizer, family)
        super().__init__(model, dataclasses.replace(capabilities, output=output))
        self.spec = spec
        #: how the checkpoint's tensors were loaded (None for a model handed in as an object)
        self.loading_info: LoadingInfo | None = getattr(model, "maskcheck_loading_info", None)
        self.attn_implementation = getattr(model.config, "_attn_implementation", None)
        # use_cache=False unless a packing setting leaves it at the config default (None)
        self.use_cache: bool | None = False
        self.mask_of_ones = False
        self.logits_to_keep = LogitsToKeep(named=keywords.named("logits_to_keep") and output.is_vocabulary)

    def _decoding(
        self, model: Any, family: str, takes_position_ids: bool, offset: int, vocab_size: int, output: OutputKind
    ) -> tuple[GenerationPath | None, str | None]:
        """How cached decoding runs (the model's own generation methods, or None: steps built
        by hand), and why the model has no cache to check, or None when it has one."""
        if not output.is_vocabulary:
            return None, output.decodes_no_tokens
        if family == "encoder":
            return None, "an encoder (masked LM) does not decode token by token"
        if drives_generation(model):
            if not model.can_generate():
                return None, "the model cannot generate() (can_generate() is False)"
            generation = GenerationPath(model, family == "encoder_decoder", takes_position_ids, offset)
            return generation, generation.feeds_only_new_tokens(vocab_size)
        if self.cache_keyword is None:
            return None, "the model's forward takes no cache (neither `cache` nor `past_key_values`)"
        return None, None

    def _capabilities(
        self,
        model: Any,
        keywords: ForwardKeywords,
        vocab_size: int,
        offset: int,
        no_cache_reason: str | None,
        tokenizer: Any,
        family: str,
    ) -> Capabilities:
        config = model.config
        parameter = next(model.parameters())
        text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
        attention, width = declared_attention(config, family)
        return Capabilities(
            family=family,  # type: ignore[arg-type]
            vocab_size=vocab_size,
            # A mask is assumed to be taken unless the class's forward cannot accept one:
            # a mask that changes nothing is the padding suite's finding, not a reason to skip it.
            takes_attention_mask=keywords.accepts("attention_mask"),
            takes_position_ids=keywords.named("position_ids"),
            derives_positions_from_mask=False,
            position_offset=offset,
            # The padding-free path transformers documents (position ids restarting per sequence,
            # no attention mask) builds a block-diagonal mask for causal masks only.
            packing="position_ids" if family == "decoder" and keywords.named("position_ids") else None,
            has_cache=family != "encoder" and no_cache_reason is None,
            no_cache_reason=no_cache_reason,
            generates=family != "encoder"
            and self.task in LM_TASKS
            and callable(getattr(model, "generate", None))
            and bool(getattr(model, "can_generate", lambda: False)()),
            has_loss=(self.task in LM_TASKS or self.task == "token-classification")  # a loss at each position
            and keywords.accepts("labels")
            and returns_loss(model, self.task, vocab_size),
            pad_token_id=getattr(text_config, "pad_token_id", None),
            eos_token_id=_single_id(getattr(text_config, "eos_token_id", None)),
            padding_side=getattr(tokenizer, "padding_side", None),
            max_length=getattr(text_config, "max_position_embeddings", None)
            or getattr(text_config, "n_positions", None),
            attention=attention,  # type: ignore[arg-type]
            window=width if attention == "sliding_window" else None,
            attention_chunk=width if attention == "chunked" else None,
            # The layers are told apart (and measured one by one) in causal LMs.
            layers=declared_layers(config) if self.task == "causal-lm" else None,
            unverified_layers=unverified_layers(config) if self.task == "causal-lm" else None,
            n_layers=getattr(text_config, "num_hidden_layers", None) or getattr(text_config, "num_layers", None),
            device=_input_device(model, parameter),
            dtype=str(parameter.dtype).removeprefix("torch."),
            tokenizer=tokenizer,
        )

    def packing_settings(self) -> list[tuple[PackingSetting, Adapter]]:
        """The padding-free path (position ids restarting per sequence, as transformers'
        DataCollatorWithFlattening passes them) first, then what a user might pass instead.
        Whether this model's attention implements that path is what the checks measure."""
        if self.capabilities.packing is None:
            return []
        padding_free = "position_ids restarting at 0 per sequence, no attention_mask, use_cache=False"
        settings = [(PackingSetting("position_ids", padding_free), self)]
        if getattr(self.model.config, "use_cache", False):
            defaults = copy.copy(self)
            defaults.use_cache = None
            settings.append(
                (
                    PackingSetting(
                        "forward_defaults",
                        "position_ids restarting, no attention_mask, use_cache left at its default (config.use_cache=True)",
                        False,
                    ),
                    defaults,
                )
            )
        with_mask = copy.copy(self)
        with_mask.mask_of_ones = True
        settings.append(
            (
                PackingSetting(
                    "mask_of_ones", "position_ids restarting, attention_mask of ones, use_cache=False", False
                ),
                with_mask,
            )
        )
        return settings

    def describe(self) -> dict[str, Any]:
        info = super().describe()
        info.update(
            task=self.task,
            architecture=type(self.model).__name__,
            attn_implementation=self.attn_implementation,
            output=self.capabilities.output_kind.describe(),
        )
        if self.wrapper is not None:
            info["wrapper"] = self.wrapper
        return info

    def layout(self) -> dict[str, Any] | None:
        """The class and the layout-bearing config fields it runs with (causal LMs; None otherwise)."""
        return hf_variants.layout(self.model) if self.task == "causal-lm" else None

    def _with_model(self, model: Any) -> "HFAdapter":
        other = super()._with_model(model)
        assert isinstance(other, HFAdapter)
        if self.generation is not None:
            other.generation = copy.copy(self.generation)
            other.generation.model = model
        return other

    def layout_variants(self) -> Iterator[tuple[str, Adapter]]:
        """Sibling classes with the same parameter names, other rope bases, no final norm: see
        :mod:`.hf_variants`. Each variant runs as this adapter does, on its own model."""
        if self.task != "causal-lm":
            return
        for name, model in hf_variants.variants(self.model):
            variant = copy.copy(self)
            variant.model = model
            variant.generation = None  # only logits are asked of a variant
            yield name, variant

    shows_layer_attention = True

    def layer_attention_masks(self, input_ids: Tensor) -> list[Tensor]:
        """The eager implementation's attention weights, layer by layer: a key a query may not
        read gets exactly zero weight there. Each layer's ``[B, H, T, T]`` weights are reduced
        to ``[T, T]`` by a hook as the layer runs, so at most one layer's weights are held."""
        seen: dict[int, Tensor] = {}

        def keep(module: Any, _inputs: Any, output: Any) -> None:
            weights = output[1] if isinstance(output, tuple) and len(output) > 1 else None
            if isinstance(weights, Tensor) and weights.dim() == 4:
                seen[module.layer_idx] = (weights[0] > 0).any(0).cpu()  # [T, T]: read by some head

        hooks = [
            m.register_forward_hook(keep)
            for m in self.model.modules()
            if isinstance(getattr(m, "layer_idx", None), int) and type(m).__name__.endswith("Attention")
        ]
        previous = self.model.config._attn_implementation
        try:
            self.model.set_attn_implementation("eager")
            with torch.inference_mode():
                call_model(self.model, input_ids=input_ids, use_cache=False)
        finally:
            self.model.set_attn_implementation(previous)
            for hook in hooks:
                hook.remove()
        if not seen:
            raise AdapterError("the eager attention returned no attention weights to measure")
        return [seen[index] for index in sorted(seen)]

    # -- forward ------------------------------------------------------------------------------

    def _inputs(self, batch: Batch) -> dict[str, Any]:
        inputs: dict[str, Any] = {"input_ids": batch.input_ids}
        if batch.attention_mask is not None:
            inputs["attention_mask"] = batch.attention_mask
        elif self.mask_of_ones:
            inputs["attention_mask"] = torch.ones_like(batch.input_ids)
        if batch.position_ids is not None:
            inputs["position_ids"] = batch.position_ids
        if self.task == "seq2seq":
            inputs["decoder_input_ids"] = batch.decoder_input_ids
            if batch.decoder_attention_mask is not None:
                inputs["decoder_attention_mask"] = batch.decoder_attention_mask
        if self.takes_use_cache and self.use_cache is not None and not self.path.default_cache:
            inputs["use_cache"] = self.use_cache
        return inputs

    def _unmeasured_embedding(self) -> Any:
        """Where no module is measured to embed the ids: ``get_input_embeddings()`` of the side
        whose logits are compared, the decoder's for a seq2seq model (its embedding module may
        be the encoder's, shared, or its own)."""
        owner = self.model
        if self.task == "seq2seq" and callable(getattr(owner, "get_decoder", None)):
            owner = owner.get_decoder()
        embedding = owner.get_input_embeddings() if callable(getattr(owner, "get_input_embeddings", None)) else None
        return embedding if isinstance(embedding, torch.nn.Module) else super()._unmeasured_embedding()

    def _default_cache_unavailable(self) -> str | None:
        if not self.takes_use_cache:
            return "the model's forward takes no use_cache"
        if self.use_cache is None:
            return "this call already leaves use_cache at the model's default"
        if not getattr(self.model.config, "use_cache", False):
            return "config.use_cache is False, so the default is the canonical call's use_cache=False"
        return None

    def _call(self, **inputs: Any) -> Any:
        return call_model(self.model, **inputs)

    def _logits(self, batch: Batch) -> Tensor:
        output = self.capabilities.output_kind
        named = output.source if output.source in OUTPUT_NAMES else None  # a tuple's first item has no name
        value, _ = read_output(self._call(**self._inputs(batch)), named)
        return output.in_positions(value, batch.predicted_ids.shape[1])  # [B, T, C]

    def _kept_logits(self, batch: Batch, keep: int | None) -> Tensor:
        """With ``keep``, the model's own ``logits_to_keep=keep`` where it measured right
        (:class:`LogitsToKeep`): its vocabulary projection runs on those positions only."""
        measured = self.logits_to_keep
        if keep is None or not measured.named or measured.right is False:
            return super()._kept_logits(batch, keep)
        if measured.right is None:
            full = self._logits(batch)
            try:
                kept = self._call(**self._inputs(batch), logits_to_keep=keep).logits
            except AdapterError as exc:
                kept = exc
            measured.measure(kept, full, keep)
            return full[:, -keep:]
        return self._call(**self._inputs(batch), logits_to_keep=keep).logits

    def describe_kept_logits(self) -> str:
        measured = self.logits_to_keep
        if not measured.named:
            return ALL_POSITIONS + "the model's forward takes no logits_to_keep"
        if measured.right is None:
            return "logits_to_keep taken, not asked for: no check compared only the last positions"
        if measured.right:
            return (
                f"logits_to_keep: only the compared last positions are projected to the vocabulary ({measured.detail})"
            )
        return ALL_POSITIONS + f"logits_to_keep measured wrong ({measured.detail})"

    def _loss(self, batch: Batch, labels: Tensor) -> Tensor:
        return self._call(**self._inputs(batch), labels=labels).loss

    # -- cache ----------------------------------------------------------------------------------

    def _cache_of(self, output: Any) -> Any:
        for name in ("cache", "past_key_values"):
            value = getattr(output, name, None)
            if value is not None:
                return value
        raise AdapterError("the model returned no cache although use_cache=True")

    def _prefill(
        self, batch: Batch, rollback: bool = False, cache: Any = None
    ) -> tuple[Tensor, HFState | GenerationState]:
        """``cache``: a cache object to fill (a reused one) instead of a new one."""
        mask = batch.predicted_mask
        if mask is None:
            mask = torch.ones_like(batch.predicted_ids)
        if self.generation is not None:
            if self.task == "seq2seq":
                return self.generation.prefill(
                    batch.predicted_ids, mask, batch.input_ids, batch.attention_mask, rollback=rollback, cache=cache
                )
            return self.generation.prefill(
                batch.input_ids, mask, positions=batch.position_ids, rollback=rollback, cache=cache
            )
        inputs = self._inputs(batch)
        inputs["use_cache"] = True
        if rollback and cache is None:
            from transformers import DynamicCache

            cache = DynamicCache(config=self.model.config.get_text_config(decoder=True))
            cache.activate_past_recording()
        if cache is not None:
            inputs[self.cache_keyword] = cache  # type: ignore[index]
        if self.task == "seq2seq":
            output = self._call(**inputs)
            state = HFState(
                self._cache_of(output),
                mask,
                mask.long().sum(-1),
                encoder_outputs=(output.encoder_last_hidden_state,),
                source_mask=batch.attention_mask,
            )
            return output.logits, state
        inputs["attention_mask"] = mask
        if self.capabilities.takes_position_ids and batch.position_ids is None:
            inputs["position_ids"] = positions_from_mask(mask, offset=self.capabilities.position_offset)
        output = self._call(**inputs)
        return output.logits, HFState(self._cache_of(output), mask, mask.long().sum(-1))

    def _step(
        self, state: HFState | GenerationState, tokens: Tensor, attention_mask: Tensor | None
    ) -> tuple[Tensor, HFState | GenerationState]:
        if isinstance(state, GenerationState):
            assert self.generation is not None
            return self.generation.step(state, tokens, attention_mask)
        full_mask, positions, next_position = extend(state.mask, state.next_position, attention_mask, tokens.shape[1])
        inputs: dict[str, Any] = {self.cache_keyword: state.cache, "use_cache": True}  # type: ignore[dict-item]
        if self.task == "seq2seq":
            inputs.update(
                encoder_outputs=state.encoder_outputs,
                attention_mask=state.source_mask,
                decoder_input_ids=tokens,
                decoder_attention_mask=full_mask,
            )
        else:
            inputs.update(input_ids=tokens, attention_mask=full_mask)
            if self.capabilities.takes_position_ids:
                inputs["position_ids"] = positions + self.capabilities.position_offset
        output = self._call(**inputs)
        return output.logits, HFState(
            self._cache_of(output), full_mask, next_position, state.encoder_outputs, state.source_mask
        )

    def _generate(self, batch: Batch, new_tokens: int, use_cache: bool) -> tuple[Tensor, Tensor]:
        inputs: dict[str, Any] = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask}
        if self.task == "seq2seq":
            inputs.update(
                decoder_input_ids=batch.decoder_input_ids, decoder_attention_mask=batch.decoder_attention_mask
            )
        pad = self.capabilities.pad_token_id
        output = call_model(
            self.model.generate,
            **inputs,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            num_beams=1,
            use_cache=use_cache,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=pad if pad is not None else 0,
        )
        return output.sequences[:, -new_tokens:], torch.stack(output.logits, dim=1)  # [B, n], [B, n, V]

    #: fork() deep-copies the cache and everything generate() carries between forwards
    copies_states = True

    def _state_settings(self) -> tuple:
        return () if self.generation is None else plain_values(self.generation)

    def fork(self, state: HFState | GenerationState) -> HFState | GenerationState:
        # Cache objects are mutated in place by forward, so a branch needs its own copy, as
        # transformers' docs copy a prompt cache (copy.deepcopy). A stateful model, such as
        # RecurrentGemma, also keeps state in its modules: no copy reaches that.
        if isinstance(state, GenerationState):
            kwargs, output = copy.deepcopy((state.kwargs, state.output))  # one copy: both hold the same cache
            return GenerationState(kwargs, state.ids, output)
        return HFState(
            copy.deepcopy(state.cache), state.mask, state.next_position, state.encoder_outputs, state.source_mask
        )

    # -- serving --------------------------------------------------------------------------

    def _rollback(self, state: HFState | GenerationState, tokens: int) -> HFState | GenerationState:
        if isinstance(state, GenerationState):
            assert self.generation is not None
            return self.generation.rollback(state, tokens)
        crop_cache(state.cache, tokens)
        dropped = state.mask[:, -tokens:].long().sum(-1)  # [B]: real tokens rolled back
        return HFState(
            state.cache,
            state.mask[:, :-tokens],
            state.next_position - dropped,
            state.encoder_outputs,
            state.source_mask,
        )

    def _rearrange(self, state: HFState | GenerationState, operation: str, index: Tensor) -> HFState | GenerationState:
        if isinstance(state, GenerationState):
            assert self.generation is not None
            return self.generation.rearrange(state, operation, index)  # type: ignore[arg-type]
        rows = state.mask.shape[0]
        rearrange_cache(state.cache, operation, index, rows)  # type: ignore[arg-type]
        return HFState(
            state.cache,
            *select_rows((state.mask, state.next_position, state.encoder_outputs, state.source_mask), index, rows),
        )

    def _reuse(self, state: HFState | GenerationState, batch: Batch) -> tuple[Tensor, HFState | GenerationState]:
        cache = self.generation.cache_of(state)[1] if isinstance(state, GenerationState) else state.cache  # type: ignore[union-attr]
        reset_cache(cache)
        return self._prefill(batch, cache=cache)

    def cache_implementations(self) -> dict[str, str | None]:
        if self.generation is None:
            reason = (
                "the model is stepped by hand, not through generate()'s methods, which choose a cache implementation"
            )
            return {"static": reason, "offloaded": reason}
        device = self.capabilities.device
        return {
            "static": None,
            "offloaded": None
            if device.startswith("cuda")
            else f"the offloaded cache moves layers between a GPU and the CPU: it needs CUDA, and the model is on {device}",
        }

    def with_cache_implementation(self, name: str) -> "HFAdapter":
        reason = self.cache_implementations().get(name, f"no cache implementation {name!r}")
        if reason is not None:
            raise ServingUnsupported(reason)
        other = copy.copy(self)
        other.generation = copy.copy(self.generation)
        other.generation.cache_implementation = name  # type: ignore[union-attr]
        other.__dict__.pop("_path_adapters", None)
        made = other._made_cache(name)
        if made is not None:
            raise ServingUnsupported(
                f"generate() does not use cache_implementation={name!r} for this model: it decodes with {made}"
            )
        return other

    def _made_cache(self, name: str) -> str | None:
        """None when a prefill with this adapter's cache implementation makes the cache asked
        for; otherwise the cache it makes (a model that supplies its own ignores the choice)."""
        from transformers import StaticCache

        ids = torch.ones(1, 2, dtype=torch.long, device=self.capabilities.device)
        source = Batch(ids, torch.ones_like(ids), decoder_input_ids=ids, decoder_attention_mask=torch.ones_like(ids))
        _, state = self.prefill(source if self.task == "seq2seq" else Batch(ids, torch.ones_like(ids)))
        cache = self.generation.cache_of(state)[1]  # type: ignore[union-attr]
        attention = getattr(cache, "self_attention_cache", cache)
        made = isinstance(attention, StaticCache) if name == "static" else bool(getattr(attention, "offloading", False))
        return None if made else f"a {type(cache).__name__} ({layer_names(cache)})"


def _input_device(model: Any, parameter: Any) -> str:
    """Where inputs go: the parameters' device, or for a model sharded by accelerate the
    device of its first module (the embeddings)."""
    placement = getattr(model, "hf_device_map", None)
    if not placement:
        return str(parameter.device)
    first = next(iter(placement.values()))
    return f"cuda:{first}" if isinstance(first, int) else ("cpu" if first in ("cpu", "disk") else str(first))


def _measured_output(model: Any, task: str, vocab_size: int) -> OutputKind:
    """What the model returns. A language model's logits must have a row per token
    (:func:`check_logit_rows`); any other head's output is measured at two lengths, its
    units told by its config: single-label class scores are log-probabilities, a
    regression, multi-label or one-label (reward) head's scores and a base model's hidden
    states are raw values."""
    if task in LM_TASKS:
        check_logit_rows(model, task, vocab_size)
        return vocabulary(vocab_size)
    config = model.config
    single_label = task != "feature-extraction" and getattr(config, "problem_type", None) not in (
        "regression",
        "multi_label_classification",
    )
    device = str(next(model.parameters()).device)
    try:
        return measure_output(
            lambda ids: read_output(call_model(model, input_ids=ids)), vocab_size, device, scores=single_label
        )
    except AdapterError as exc:
        raise HFLoadError(f"{type(model).__name__}: {exc}") from None


def _single_id(value: Any) -> int | None:
    """A config's token id (the first of a list of them), or None."""
    if isinstance(value, (list, tuple)):
        value = value[0] if value else None
    return value if isinstance(value, int) else None


def _output_vocab(model: Any) -> int:
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is not None and hasattr(head, "weight"):
        return int(head.weight.shape[0])
    vocab = getattr(model.config.get_text_config(), "vocab_size", None)
    if not isinstance(vocab, int):
        raise HFLoadError(
            f"{type(model).__name__}'s config has no vocab_size: the model reads no token ids from a vocabulary "
            "(characters, bytes or features), and maskcheck draws its cases as token ids"
        )
    return vocab
