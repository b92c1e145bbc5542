"""Activation functions by the names EncoderConfig.activation takes (Hugging Face's, where they have one)."""

from __future__ import annotations

import functools

import flax.linen as nn
import jax.numpy as jnp

ACTIVATIONS = {
    "gelu": functools.partial(nn.gelu, approximate=False),  # Hugging Face "gelu" is the exact erf form.
    "gelu_tanh": functools.partial(nn.gelu, approximate=True),
    "relu": nn.relu,
    "silu": nn.silu,
    "tanh": jnp.tanh,
}
