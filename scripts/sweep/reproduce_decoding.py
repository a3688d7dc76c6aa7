"""The cache checks of scripts/sweep/reproduce_finding.py: ``kv_cache`` (generate() with and
without its cache, cached greedy decoding against each row alone, a chunk after a cache) and
``serving`` (rollback, row reorders, the static cache, reuse and a copied prompt cache,
decoding past a sliding window), in plain transformers calls (no maskcheck)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from reproduce_common import (
    SOURCE_SEED,
    beyond_rounding,
    config_value,
    ids,
    log_probs,
    position_ids,
    predicted,
    takes,
)


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
