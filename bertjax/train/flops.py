"""Analytic training FLOPs of a bidirectional encoder, and model FLOPs utilisation (MFU).

Conventions (the ones MFU figures in papers use, adapted to encoders):
- a multiply-add is 2 FLOPs; training is 3x the forward pass (the backward pass does two matmuls per forward one);
  rematerialised recomputation is not counted (that would be hardware, not model, utilisation);
- attention is bidirectional: every query scores every key of its row (no causal halving), except in local layers
  where it scores only its window (2 * (window // 2) + 1 keys);
- only real tokens count: padding rows/positions are not useful work, so `tokens` is the number of non-padding
  tokens, and the MLM head counts only the masked predictions it projects onto the vocabulary;
- relative-position attention counts its products with the position table: DeBERTa's c2p/p2c terms (each query
  and each key against the table's rows) and XLNet's position scores, plus projecting the table once per layer per
  forward pass (batch-independent, so counted per step).
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


def relative_position_products(config: EncoderConfig, seq_len: int) -> tuple[int, int]:
    """(products, rows): how many query/key-against-position-table products each token takes part in per layer,
    and the table's rows, for the relative-position attention kinds; (0, 0) for the others.

    DeBERTa: one product per c2p/p2c term over 2 * span rows. With log buckets (v2/v3) every bucket is a row at any
    length; without them (v1) distances clamp at the span, so a row only ever sees 2 * min(seq_len, span) of them
    (transformers trims the table to that). XLNet: its position term over the 2 * seq_len encodings of distances.
    """
    if config.disentangled is not None:
        terms = sum(term in config.disentangled.pos_att_type for term in ("c2p", "p2c"))
        span = config.disentangled.span
        return terms, 2 * (span if config.disentangled.position_buckets else min(seq_len, span))
    if config.attention_kind == "two_stream":
        return 1, 2 * seq_len
    return 0, 0


def key_value_flops_per_token(config: EncoderConfig) -> float:
    """The key and value projections of one token in one layer (XLNet's query stream reuses the content stream's)."""
    return 2 * 2 * config.hidden_size * config.kv_heads * config.head_dim


def forward_flops_per_token(config: EncoderConfig, seq_len: int) -> float:
    """Forward FLOPs of the embedding projection and the layer stack for one token in a row of `seq_len`."""
    h, d = config.hidden_size, config.head_dim
    q_and_out = 2 * 2 * h * config.num_heads * d
    mlp = 2 * h * config.intermediate_size * (3 if config.mlp == "glu" else 2)
    products, rows = relative_position_products(config, seq_len)
    positions = products * 2 * config.num_heads * d * rows
    if config.attention_kind == "two_stream":
        positions += 2 * config.num_heads * d * 2  # XLNet's segment term: each query against same/other vectors
    flops = 0.0
    if config.embed_dim != config.hidden_size:
        flops += 2 * config.embed_dim * h
    for layer in range(config.num_layers):
        scores_and_values = 2 * 2 * config.num_heads * d * attention_span(config, layer, seq_len)
        # ALBERT's inner groups: each of the num_layers steps runs layers_per_group distinct layers.
        flops += config.layers_per_group * (q_and_out + key_value_flops_per_token(config) + mlp + scores_and_values
                                            + positions)
    return flops


def position_table_flops(config: EncoderConfig, seq_len: int) -> float:
    """Forward FLOPs of projecting the relative-position table for every layer: once per forward pass, whatever the
    batch (DeBERTa's position keys/queries, XLNet's `relative` projection)."""
    products, rows = relative_position_products(config, seq_len)
    per_layer = products * 2 * rows * config.hidden_size * config.num_heads * config.head_dim
    return config.num_layers * config.layers_per_group * per_layer


def encoder_forward_flops(config: EncoderConfig, *, seq_len: int, tokens: float) -> float:
    """Forward FLOPs of the encoder over `tokens` real tokens in one step."""
    return tokens * forward_flops_per_token(config, seq_len) + position_table_flops(config, seq_len)


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
    return (encoder_forward_flops(config, seq_len=seq_len, tokens=tokens)
            + predictions * forward_flops_per_prediction(config))


# Peak dense (not 2:4-sparse) bf16 matmul FLOP/s per chip, from vendor datasheets, matched against
# `device.device_kind` (first matching substring wins, so a form factor comes before its family's name). float32 runs
# are measured against the same bf16 peak, as MFU figures in papers are.
PEAK_FLOPS_BY_DEVICE_KIND: dict[str, float] = {
    "TPU v6 lite": 918e12,  # Trillium (v6e)
    "TPU v5 lite": 197e12,  # v5e
    "TPU v5p": 459e12,
    "TPU v5": 459e12,
    "TPU v4": 275e12,
    "GB200": 2.5e15,
    "B200": 2.25e15,  # HGX, 1000 W
    "H100 PCIe": 756e12,
    "H100 NVL": 835e12,
    "H200 NVL": 835e12,
    "H800 PCIe": 756e12,
    "H200": 989e12,  # SXM, and GH200
    "H100": 989e12,  # SXM
    "H800": 989e12,  # SXM
    "A100": 312e12,  # SXM and PCIe
    "L40S": 362e12,
    "L40": 181e12,
    "L4": 121e12,
}


def peak_flops_per_device(device: jax.Device | None = None) -> float | None:
    """The datasheet peak of this device kind, or None when it is not in the table (CPUs, other accelerators)."""
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
