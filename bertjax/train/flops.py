"""Analytic training FLOPs of a bidirectional encoder, and model FLOPs utilisation (MFU).

Conventions (the ones MFU figures in papers use, adapted to encoders):
- a multiply-add is 2 FLOPs; training is 3x the forward pass (the backward pass does two matmuls per forward one);
  rematerialised recomputation is not counted (that would be hardware, not model, utilisation);
- attention is bidirectional: every query scores every key of its row (no causal halving), except in local layers
  where it scores only its window (2 * (window // 2) + 1 keys);
- only real tokens count: padding rows/positions are not useful work, so `tokens` is the number of non-padding
  tokens, and the MLM head counts only the masked predictions it projects onto the vocabulary.
"""

from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp

from bertjax.config import EncoderConfig


def attention_span(config: EncoderConfig, layer: int, seq_len: int) -> int:
    """Keys each query scores in `layer`."""
    window = config.layer_window(layer)
    return seq_len if window is None else min(seq_len, 2 * (window // 2) + 1)


def forward_flops_per_token(config: EncoderConfig, seq_len: int) -> float:
    """Forward FLOPs of the embedding projection and the layer stack for one token in a row of `seq_len`."""
    h, d = config.hidden_size, config.head_dim
    q_and_out = 2 * 2 * h * config.num_heads * d
    k_and_v = 2 * 2 * h * config.kv_heads * d
    mlp = 2 * h * config.intermediate_size * (3 if config.mlp == "glu" else 2)
    flops = 0.0
    if config.embed_dim != config.hidden_size:
        flops += 2 * config.embed_dim * h
    for layer in range(config.num_layers):
        scores_and_values = 2 * 2 * config.num_heads * d * attention_span(config, layer, seq_len)
        # ALBERT's inner groups: each of the num_layers steps runs layers_per_group distinct layers.
        flops += config.layers_per_group * (q_and_out + k_and_v + mlp + scores_and_values)
    return flops


def forward_flops_per_prediction(config: EncoderConfig) -> float:
    """MLM head for one masked position: transform dense (absent in EuroBERT's one-matrix head), then the
    vocabulary projection."""
    if not config.mlm_head_transform:
        return 2 * config.hidden_size * config.vocab_size
    return 2 * config.hidden_size * config.embed_dim + 2 * config.embed_dim * config.vocab_size


def forward_flops_per_row_nsp(config: EncoderConfig) -> float:
    """Pooler and the 2-way NSP/SOP classifier on the first token of a row."""
    return 2 * config.hidden_size * config.hidden_size + 2 * config.hidden_size * 2


def mlm_forward_flops(config: EncoderConfig, *, seq_len: int, tokens: float, predictions: float) -> float:
    """Forward FLOPs of an encoder over `tokens` real tokens plus its MLM head at `predictions` masked positions.

    Objectives (bertjax/train/objectives) build their training FLOPs from this: 3x for what they train, 1x for a
    frozen model they only run forward (a distillation teacher).
    """
    return tokens * forward_flops_per_token(config, seq_len) + predictions * forward_flops_per_prediction(config)


# Peak dense bf16 matmul FLOP/s per chip, from vendor specifications, matched against `device.device_kind`
# (first matching substring wins, so the more specific names come first).
PEAK_FLOPS_BY_DEVICE_KIND: dict[str, float] = {
    "TPU v6 lite": 918e12,  # Trillium (v6e)
    "TPU v5 lite": 197e12,  # v5e
    "TPU v5p": 459e12,
    "TPU v5": 459e12,
    "TPU v4": 275e12,
    "H200": 989e12,
    "H100": 989e12,
    "A100": 312e12,
}


def peak_flops_per_device(device: jax.Device | None = None) -> float | None:
    """The spec peak of this device kind, or None when unknown (CPUs)."""
    kind = (device or jax.devices()[0]).device_kind
    for name, flops in PEAK_FLOPS_BY_DEVICE_KIND.items():
        if name in kind:
            return flops
    return None


@functools.cache
def measure_peak_flops(dtype=jnp.float32, size: int = 1024, repeats: int = 5) -> float:
    """The matmul FLOP/s one device reaches here (for CPUs, which have no published peak to compare against).
    Measured once per process: every later run in it (a notebook's, a GLUE grid's) reads the same figure."""
    a = jnp.ones((size, size), dtype)
    matmul = jax.jit(lambda x: x @ x)
    matmul(a).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        matmul(a).block_until_ready()
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best


def mfu(flops: float, seconds: float, num_devices: int, peak_per_device: float) -> float:
    return flops / (seconds * num_devices * peak_per_device)
