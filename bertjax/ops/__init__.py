"""Numerical building blocks shared by every model: attention (one entry point) and position encodings."""

from bertjax.ops.attention import (FEATURES, IMPLEMENTATIONS, attention, required_features, resolve_implementation,
                                   rope_attention)
from bertjax.ops.attention_probabilities import attention_probabilities
from bertjax.ops.masks import alibi_bias, attention_mask, segment_positions
from bertjax.ops.rope import apply_rope

__all__ = ["FEATURES", "IMPLEMENTATIONS", "alibi_bias", "attention", "attention_mask", "attention_probabilities",
           "apply_rope", "required_features", "resolve_implementation", "rope_attention", "segment_positions"]
