"""Attention on TPU through JAX's Pallas (Mosaic) splash attention kernel.

Why splash and not a kernel of our own: splash attention already does everything bertjax needs on TPU. Measured
here with JAX 0.10.2: it takes a bidirectional `LocalMask((S, S), (w // 2, w // 2), 0)` (or `FullMask`) combined
with `SegmentIds`, handles GQA natively (k/v with fewer heads, no repeat), has a fused backward kernel, skips
fully-masked blocks from a block-sparsity table built at trace time, runs on CPU in interpret mode (forward and
backward), and AOT-compiles for v5e with the `libtpu` wheel (`bench/tpu_aot_attention.py`, docs/benchmarks.md). It
is maintained by the JAX team for Mosaic, whose tiling rules (lane width 128, sublane 8, VMEM limits) a kernel of
ours would have to track by hand with no TPU here to test on. Our own kernel only pays off for something splash
cannot express: ALiBi (splash takes masks, no additive bias) and Longformer's global tokens (the merge needs the
log-sum-exp, differentiably). Those calls go to `pallas_tpu_flash.py`, in the same shard_map; everything else to
splash.

What this wrapper adds:
- splash applies no 1/sqrt(d) scale, so q is pre-scaled (in float32, then cast back);
- splash needs the sequence to be a multiple of its block sizes, and its key blocks must be multiples of 128
  lanes: the sequence is padded to a block multiple with segment id 0 (padding), then sliced back;
- splash works on one example [heads, seq, head_dim]: the batch is a vmap;
- the kernel is built at every trace: it holds its block-sparsity tables as jax arrays, which a cached kernel
  would leak from one trace into the next; the costly numpy part (`process_mask`) is cached by splash itself;
- Mosaic kernels cannot be partitioned by XLA ("wrap the call in a shard_map"), so under a mesh set with
  `jax.set_mesh(mesh)` the call runs inside `jax.shard_map` (per_device.py, shared with the Pallas GPU path).
Padding tokens (segment id 0) match each other in splash's segment test, so a padding row always sees at least
itself: its output is finite (not meaningful), as in the dense reference. Valid rows never see padding.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu import splash_attention as splash

from bertjax.ops.per_device import per_device_attention

LANES = 128  # splash's key blocks (and, for segment ids, query blocks) must be multiples of this
DEFAULT_BLOCK = 512  # a good default on v5e/v5p for head_dim 64..128 (MaxText uses 512 as well)


def _block_size(seq: int, block: int | None) -> int:
    block = block or DEFAULT_BLOCK
    if block % LANES:
        raise ValueError(f"pallas_tpu_attention: block size must be a multiple of {LANES}, got {block}")
    return min(block, -(-seq // LANES) * LANES)  # short sequences: one block, not a mostly-padding 512 block


def _kernel(seq: int, heads: int, local_window: int | None, block: int, interpret: bool):
    if local_window is None:
        head_mask = splash.FullMask((seq, seq))
    else:
        half = local_window // 2
        head_mask = splash.LocalMask((seq, seq), (half, half), offset=0)
    sizes = splash.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block, block_q_dkv=block,
                              block_kv_dkv=block, block_kv_dkv_compute=block, use_fused_bwd_kernel=True)
    return splash.make_splash_mha(splash.MultiHeadMask([head_mask] * heads), block_sizes=sizes, head_shards=1,
                                  q_seq_shards=1, interpret=interpret)


def pallas_tpu_attention(q, k, v, *, segment_ids, local_window, scale, interpret=False, alibi_slopes=None,
                         global_tokens=None, global_slots=None, block: int | None = None):
    """Splash attention, or bertjax's own flash kernel (pallas_tpu_flash.py) for what splash cannot express: ALiBi
    and global tokens. Shapes and meaning as `bertjax.ops.attention`; `block` overrides the tile size."""
    own_kernel = alibi_slopes is not None or global_tokens is not None

    def local_attention(q, k, v, segment_ids, alibi_slopes, global_tokens):  # one device's shard of batch/heads
        if own_kernel:
            from bertjax.ops.pallas_tpu_flash import tpu_flash_attention
            return tpu_flash_attention(q, k, v, segment_ids=segment_ids, local_window=local_window, scale=scale,
                                       interpret=interpret, alibi_slopes=alibi_slopes, global_tokens=global_tokens,
                                       global_slots=global_slots, block_q=block, block_k=block)
        return _splash_attention(q, k, v, segment_ids, local_window, scale, interpret, block)

    return per_device_attention(local_attention, q, k, v, segment_ids, alibi_slopes, global_tokens)


def _splash_attention(q, k, v, segment_ids, local_window, scale, interpret, block):
    """Splash attention on unsharded arrays (one device's shard)."""
    seq = q.shape[1]
    block = _block_size(seq, block)
    padded = -(-seq // block) * block
    tail = padded - seq

    def to_kernel_layout(x):  # [batch, seq, heads, dim] -> [batch, heads, padded, dim]
        return jnp.pad(x, ((0, 0), (0, tail), (0, 0), (0, 0))).transpose(0, 2, 1, 3)

    kernel = _kernel(padded, q.shape[2], local_window, block, bool(interpret))
    seg = jnp.pad(segment_ids.astype(jnp.int32), ((0, 0), (0, tail)))

    def one_example(q, k, v, seg):
        return kernel(q, k, v, segment_ids=splash.SegmentIds(q=seg, kv=seg))

    q = (q.astype(jnp.float32) * scale).astype(q.dtype)  # splash applies no 1/sqrt(d) scale
    out = jax.vmap(one_example)(to_kernel_layout(q), to_kernel_layout(k), to_kernel_layout(v), seg)
    return out.transpose(0, 2, 1, 3)[:, :seq]
