"""Numerical building blocks shared by every model: attention (one entry point) and position encodings."""

from bertjax.ops.attention import IMPLEMENTATIONS, attention, resolve_implementation
from bertjax.ops.attention_probabilities import attention_probabilities
from bertjax.ops.masks import attention_mask, segment_positions
from bertjax.ops.rope import apply_rope

__all__ = ["IMPLEMENTATIONS", "attention", "attention_mask", "attention_probabilities", "apply_rope", "resolve_implementation",
           "segment_positions"]
