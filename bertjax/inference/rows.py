"""Row functions for plain encoders (see runner.py for the contract): pooled hidden states per packed slot."""

from __future__ import annotations

import jax.numpy as jnp

from bertjax.models.pooling import pool_segments, segment_membership


def encoder_row_fn(model, pooling: str = "mean"):
    """Per slot: the backbone's last hidden state pooled over the slot's tokens ("cls" or "mean"), in float32
    whatever the compute dtype (bf16 sums over long segments lose digits)."""

    def row_fn(params, batch, max_segments):
        hidden = model.apply({"params": params}, batch["input_ids"], segment_ids=batch["segment_ids"],
                             method="encode")
        member = segment_membership(batch["segment_ids"], max_segments)
        return {"segments": {"pooled": pool_segments(hidden.astype(jnp.float32), member, pooling)}}

    return row_fn
