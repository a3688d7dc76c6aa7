"""A decoder written from scratch in the gpt-fast / nanoGPT style, audited as it is.

No mask, and a KV cache kept inside the module: ``setup_caches(max_batch_size,
max_seq_length)``, then ``forward(idx, input_pos)``. maskcheck reads both from the module
(no wrapper): the suites that need a mask say so, every other check runs, and cached
decoding is checked through ``input_pos``. The model itself is
``maskcheck.reference_models.scratch.ScratchDecoder`` (it lives in the catalogue of
seeded bugs, beside its bugs); a user's own model needs only its ``maskcheck_capabilities``.

    maskcheck audit module:module_state_decoder:decoder
    maskcheck audit module:module_state_decoder:decoder_with_position_bug --suites kv_cache
"""

from __future__ import annotations

from maskcheck.reference_models.scratch import ScratchDecoder, StepPositionOffByOne


def decoder() -> ScratchDecoder:
    return ScratchDecoder()


def decoder_with_position_bug() -> ScratchDecoder:
    """Its decoding steps embed the position one past the token's own."""
    return StepPositionOffByOne()
