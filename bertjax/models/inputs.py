"""Turn the user-facing arguments (attention_mask, segment_ids, ...) into what the layers consume."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from bertjax.config import EncoderConfig
from bertjax.models.checked import check_traced_at_most, check_traced_ids, checking_traced_values


@struct.dataclass
class EncoderInputs:
    input_ids: jax.Array  # [batch, seq] int32
    segment_ids: jax.Array  # [batch, seq] int32; 0 = padding
    positions: jax.Array  # [batch, seq] int32; restart at every packed document
    token_type_ids: jax.Array | None  # [batch, seq] or None when the model has no token types
    # DeBERTa: the [2 * span, hidden] relative embedding table, built once per forward by the stack for every layer.
    relative_embeddings: jax.Array | None = None
    # Longformer: bool [batch, seq], the tokens with global attention (never padding); None: none.
    global_tokens: jax.Array | None = None


def position_limit(config: EncoderConfig) -> int | None:
    """One past the largest position id the model takes; None when any non-negative position runs.

    Learned and sinusoidal positions index a table of max_position_embeddings rows; RoPE models (and XLNet) are
    held to the same bound as their sequence length. A model without absolute positions whose relative distances
    clamp (DeBERTa-v3) represents any length, and ALiBi (MosaicBERT) has no position table: its bias is a function
    of the distance, so any length runs."""
    unbounded = (config.position_embedding == "none" and config.disentangled is not None
                 or config.position_embedding == "alibi")
    return None if unbounded else config.max_position_embeddings


def _longer_than(length, limit: int, config) -> bool:
    """length > limit, where length may be jax.export's symbolic sequence length: unbounded, that comparison is JAX's
    InconclusiveDimensionOperation deep in tracing; the error says which constraint to export with instead."""
    try:
        return bool(length > limit)
    except Exception as error:  # noqa: BLE001 (jax keeps the exception class private)
        if type(error).__name__ != "InconclusiveDimensionOperation":
            raise
        room = limit - config.position_offset
        raise ValueError(f"input_ids: a symbolic sequence length needs the model's bound (max_position_embeddings "
                         f"{config.max_position_embeddings}): export with jax.export.symbolic_shape(\"b, s\", "
                         f"constraints=[\"s <= {room}\"])") from None


def prepare_inputs(config: EncoderConfig, input_ids, attention_mask=None, token_type_ids=None, position_ids=None,
                   segment_ids=None, global_attention_mask=None) -> EncoderInputs:
    if not isinstance(input_ids, jax.Array):  # a list or numpy array: its values are checked before any cast, which
        input_ids = np.asarray(input_ids)  # would wrap an int64 id of 2**32 + 5 to 5
    if input_ids.ndim != 2:
        raise ValueError(f"input_ids must be [batch, seq], got shape {input_ids.shape}")
    if not jnp.issubdtype(input_ids.dtype, jnp.integer):
        raise ValueError(f"input_ids must be integers, got {input_ids.dtype}")
    batch, seq = input_ids.shape
    if batch == 0:
        raise ValueError(f"input_ids is an empty batch (shape {input_ids.shape}): give at least one row")
    if seq == 0:
        raise ValueError(f"input_ids has 0 tokens per row (shape {input_ids.shape}): give at least one token")
    # Learned positions start at position_offset (RoBERTa: pad_token_id + 1), so the offset eats into the table.
    limit = position_limit(config)
    if limit is not None and _longer_than(seq + config.position_offset, limit, config):
        raise ValueError(f"input_ids: sequence length {seq} exceeds the model's max_position_embeddings "
                         f"({config.max_position_embeddings}, of which position_offset={config.position_offset} "
                         "are never used)")
    check_ids(input_ids, config.vocab_size, "token ids")
    for name, value in (("attention_mask", attention_mask), ("token_type_ids", token_type_ids),
                        ("position_ids", position_ids), ("segment_ids", segment_ids),
                        ("global_attention_mask", global_attention_mask)):
        if value is not None and jnp.shape(value) != (batch, seq):
            raise ValueError(f"{name} must have the shape of input_ids {(batch, seq)}, got {jnp.shape(value)}")
    for name, value in (("token_type_ids", token_type_ids), ("position_ids", position_ids),
                        ("segment_ids", segment_ids)):  # ids: 1.7 would be cast to 1 silently (masks may be floats)
        dtype = None if value is None else getattr(value, "dtype", None) or np.asarray(value).dtype
        if dtype is not None and not (jnp.issubdtype(dtype, jnp.integer) or dtype == np.bool_):
            raise ValueError(f"{name} must be integers, got {dtype}")
    if position_ids is not None:
        # Given ids index the position table as they are: RoBERTa's position_offset is part of them, as in
        # transformers (its first token is position pad_token_id + 1).
        offset = f"; position_offset={config.position_offset} is part of the ids" if config.position_offset else ""
        check_ids(position_ids, limit, "position_ids", "" if limit is None else
                  f" (max_position_embeddings={limit}{offset})")
    if segment_ids is not None:  # a negative id would be one more packed text that no pooling slot reads
        check_ids(segment_ids, None, "segment_ids", " (packed texts 1, 2, ...; 0 marks padding)")
    unmarked = attention_mask is None and segment_ids is None
    if segment_ids is None:
        segment_ids = jnp.ones((batch, seq), jnp.int32)
    documents = jnp.asarray(segment_ids, jnp.int32)
    segment_ids = documents if attention_mask is None else documents * (jnp.asarray(attention_mask) != 0)
    if position_ids is None and unmarked and config.position_offset:
        # Nothing marks padding: transformers' RoBERTa and Longformer then number positions over the ids that are
        # not pad_token_id, and give those the padding row (padding_idx, one below the offset), though every token
        # is attended.
        real = jnp.asarray(input_ids) != config.pad_token_id
        position_ids = jnp.where(real, present_token_positions(documents, real) + config.position_offset,
                                 config.position_offset - 1)
    elif position_ids is None:
        position_ids = present_token_positions(documents, segment_ids != 0) + config.position_offset
    global_tokens = None
    if global_attention_mask is not None:
        if config.longformer is None:
            raise ValueError("global_attention_mask is a Longformer input (tokens with global attention); this model "
                             f"has attention_kind={config.attention_kind!r}, which has no global attention "
                             "(Longformer's is 'longformer')")
        global_tokens = (jnp.asarray(global_attention_mask) != 0) & (segment_ids != 0)  # padding is never global
        bound = config.longformer.max_global_tokens
        # A concrete mask is checked against the bound where it is used (ops.masks.global_slots); a traced one
        # only by `bertjax.checked`: under a plain jit the global tokens past the bound are dropped.
        if bound is not None and isinstance(global_tokens, jax.core.Tracer) and checking_traced_values():
            check_traced_at_most(jnp.max(jnp.sum(global_tokens, axis=1)), bound,
                                 f"global_attention_mask: a row has more global tokens than max_global_tokens={bound} "
                                 "(a Longformer's longformer.max_global_tokens)")
    if config.type_vocab_size == 0:
        # DeBERTa's tokenizers return token_type_ids for every checkpoint, none of which has a token-type embedding;
        # transformers' DeBERTa classes take them and read nothing, and so does bertjax's. Other models without one
        # (ModernBERT, DistilBERT, EuroBERT) refuse them, as transformers' classes do.
        if token_type_ids is not None and config.attention_kind == "disentangled":
            token_type_ids = None
        if token_type_ids is not None:
            raise ValueError("token_type_ids given but the model has no token-type embedding (type_vocab_size=0); "
                             "its tokenizer's token_type_ids can be left out")
    elif token_type_ids is None:
        token_type_ids = jnp.zeros((batch, seq), jnp.int32)
    else:
        check_ids(token_type_ids, config.type_vocab_size, "token_type_ids")
    return EncoderInputs(input_ids=jnp.asarray(input_ids, jnp.int32), segment_ids=segment_ids,
                         positions=jnp.asarray(position_ids, jnp.int32),
                         token_type_ids=None if token_type_ids is None else jnp.asarray(token_type_ids, jnp.int32),
                         global_tokens=global_tokens)


def present_token_positions(documents: jax.Array, present: jax.Array) -> jax.Array:
    """Each token's position among the present (unmasked) tokens of its document; 0 where masked.

    A masked token is absent: left padding or a gap of padding mid-row leaves the positions, and so the outputs,
    of the row without it. transformers' RoBERTa and Longformer count positions the same way (over the tokens that
    are not padding); its BERT and ModernBERT number them by index, so their outputs on left-padded rows depend on
    the padding.
    """
    present = present.astype(jnp.int32)
    counted = jnp.cumsum(present, axis=-1)
    starts = jnp.concatenate([jnp.ones_like(documents[:, :1], dtype=bool), documents[:, 1:] != documents[:, :-1]],
                             axis=-1)
    # Counts never decrease along a row, so a running max carries the count before each document's start.
    before = jax.lax.cummax(jnp.where(starts, counted - present, 0), axis=1)
    return jnp.where(present == 1, counted - before - 1, 0)


def check_ids(ids, size: int | None, what: str, note: str = "") -> None:
    """Out-of-range ids would silently gather NaN rows inside jit; reject them whenever values are concrete, and
    on the device when traced by `bertjax.checked` (a plain `jax.jit` cannot check them). The range is [0, size),
    or every id >= 0 when size is None; `note` follows the range in the message.

    Concrete values are checked as given (numpy int64 included), before any cast to int32 could wrap them."""
    if isinstance(ids, jax.core.Tracer):
        if checking_traced_values():
            check_traced_ids(ids, size, what, note)
        return
    ids = np.asarray(ids)
    if not ids.size:
        return
    low, high = ids.min(), ids.max()
    if size is None:
        if low < 0:
            raise ValueError(f"{what} must be >= 0{note}; got min {low}")
    elif low < 0 or high >= size:
        raise ValueError(f"{what} must be in [0, {size}){note}; got min {low} and max {high}")
