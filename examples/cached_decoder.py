"""A plain PyTorch decoder with its own KV cache, audited by maskcheck with no adapter code.

The model (maskcheck.reference_models.plain.PlainDecoder, about a hundred lines) is what
the module protocol asks of your own model:

- ``maskcheck_capabilities``: what the model is (here a dict with has_cache=True);
- ``forward(input_ids, attention_mask)`` -> logits, mask 1 = real token;
- ``prefill(input_ids, attention_mask)`` -> (logits, cache);
- ``step(cache, input_ids, attention_mask_so_far)`` -> (logits, cache);
- for the serving suite: ``rollback(cache, n)``, ``reorder(cache, index)``, ``reset(cache)``
  (and ``prefill(..., cache=cache)`` to fill a reset cache).

    maskcheck audit module:cached_decoder:decoder --suites causal,padding,kv_cache,serving
    maskcheck audit module:cached_decoder:decoder_with_cache_bug --suites kv_cache   # fails
    maskcheck audit module:cached_decoder:decoder_with_reset_bug --suites serving    # fails reuse
"""

from maskcheck.reference_models.plain import plain_decoder


def decoder():
    return plain_decoder()


def decoder_with_cache_bug():
    """Its decoding step forgets the padding mask: kv_cache fails, shrunk to two short rows."""
    return plain_decoder(buggy=True)


def decoder_with_rollback_bug():
    """Its rollback drops the rejected tokens but not their count: serving/rollback fails."""
    return plain_decoder(serving_bug="rollback")


def decoder_with_reorder_bug():
    """Its reorder moves the keys and not the values: serving/beam_reorder fails."""
    return plain_decoder(serving_bug="reorder")


def decoder_with_reset_bug():
    """Its reset empties every layer but the last: serving/reuse fails, one request reads another's."""
    return plain_decoder(serving_bug="reset")
