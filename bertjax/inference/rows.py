"""Row functions for plain encoders (see runner.py for the contract): pooled hidden states per packed slot."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp

from bertjax.models.pooling import pool_segments, segment_membership


@dataclasses.dataclass(frozen=True)
class EncoderRows:
    """The row function of `encoder_row_fn`. A value, not a closure: rows of equal models (modules compare by
    their fields) and pooling are equal and hash equal, so the runner compiles their programs once."""

    model: Any  # a bertjax model with `encode` (EncoderModel, EncoderForMaskedLM, ...)
    pooling: str = "mean"

    def __call__(self, params, batch, max_segments):
        hidden = self.model.apply({"params": params}, batch["input_ids"], segment_ids=batch["segment_ids"],
                                  method="encode")
        member = segment_membership(batch["segment_ids"], max_segments)
        return {"segments": {"pooled": pool_segments(hidden.astype(jnp.float32), member, self.pooling)}}


def encoder_row_fn(model, pooling: str = "mean") -> EncoderRows:
    """Per slot: the backbone's last hidden state pooled over the slot's tokens ("cls" or "mean"), in float32
    whatever the compute dtype (bf16 sums over long segments lose digits)."""
    return EncoderRows(model, pooling)
