"""bertjax's own Pallas TPU flash kernel (pallas_tpu_flash.py: ALiBi, global tokens) in interpret mode on CPU,
against the dense XLA reference (itself tested against numpy), forward and dq/dk/dv.

Small tiles (16 rows) so 45 tokens span several query and key blocks and the window skips some; one case runs the
public entry point with the default (128-row, TPU-sized) tiles. Tolerances: float32 2e-5 (outputs) / 5e-5
(gradients) as for the other kernels; bfloat16 inputs against the float32 reference 5e-2 / 1e-1.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax import ops
from bertjax.ops.pallas_tpu_flash import _Static, _steps, tpu_flash_attention
from tests.test_attention_features import feature_case

SMALL_TILES = functools.partial(tpu_flash_attention, interpret=True, block_q=16, block_k=16)


def _run(kernel, q, k, v, segments, window, slopes, glob):
    """(out, (dq, dk, dv)) of sum(out^2) over real tokens, by the kernel or (kernel None) the dense reference."""
    real = segments != 0

    def loss(q, k, v):
        if kernel is None:
            out = ops.attention(q.astype(jnp.float32), k.astype(jnp.float32), v.astype(jnp.float32),
                                segment_ids=segments, local_window=window, implementation="xla",
                                alibi_slopes=slopes, global_tokens=glob)
        else:
            out = kernel(q, k, v, segment_ids=jnp.asarray(segments), local_window=window,
                         scale=q.shape[-1] ** -0.5, alibi_slopes=None if slopes is None else jnp.asarray(slopes),
                         global_tokens=None if glob is None else jnp.asarray(glob & real), global_slots=2)
        return jnp.sum(jnp.where(real[..., None, None], out.astype(jnp.float32), 0.0) ** 2), out

    (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)
    return np.asarray(out, np.float32), [np.asarray(g, np.float32) for g in grads]


# (window, ALiBi, global tokens): a MosaicBERT layer, a windowed ALiBi layer, a Longformer layer with and without
# ALiBi. feature_case: GQA (4 heads on 2 kv heads), 45 tokens (no block multiple), row 0 packs two documents with a
# global token each and ends in padding, row 1's only global token is padding.
CASES = {"alibi": (None, True, False), "alibi_window": (8, True, False), "longformer": (8, False, True),
         "alibi_longformer": (8, True, True)}


@pytest.mark.parametrize("case", list(CASES))
def test_matches_dense_forward_and_gradients(case):
    window, use_alibi, use_glob = CASES[case]
    q, k, v, segments, glob, slopes = feature_case()
    real = segments != 0
    slopes = slopes if use_alibi else None
    glob = glob if use_glob else None
    expected, expected_grads = _run(None, q, k, v, segments, window, slopes, glob)
    out, grads = _run(SMALL_TILES, q, k, v, segments, window, slopes, glob)
    np.testing.assert_allclose(out[real], expected[real], atol=2e-5)
    assert np.all(out[~real] == 0.0)  # a query with no visible key gives zeros, not an average of padding
    for got, want in zip(grads, expected_grads):
        np.testing.assert_allclose(got, want, atol=5e-5)


def test_bfloat16_inputs_close_to_float32_reference():
    q, k, v, segments, glob, slopes = feature_case()
    real = segments != 0
    expected, expected_grads = _run(None, q, k, v, segments, 8, slopes, glob)
    qb, kb, vb = (jnp.asarray(x, jnp.bfloat16) for x in (q, k, v))
    out, grads = _run(SMALL_TILES, qb, kb, vb, segments, 8, slopes, glob)
    np.testing.assert_allclose(out[real], expected[real], atol=5e-2)
    for got, want in zip(grads, expected_grads):
        np.testing.assert_allclose(got, want, atol=1e-1)


def test_entry_point_uses_the_kernel_with_tpu_sized_tiles():
    """ops.attention(implementation="pallas_tpu") sends ALiBi and global tokens to this kernel (splash has no
    bias); default tiles are 128 rows here (45 tokens pad to one tile), the smallest a TPU takes."""
    q, k, v, segments, glob, slopes = feature_case()
    real = segments != 0
    kwargs = dict(segment_ids=segments, local_window=8, alibi_slopes=slopes, global_tokens=glob, max_global_tokens=2)
    # Each one compiled program (op-by-op dispatch of the interpreted kernel costs seconds).
    got = jax.jit(lambda q, k, v: ops.attention(q, k, v, implementation="pallas_tpu", interpret=True, **kwargs))(
        q, k, v)
    want = jax.jit(lambda q, k, v: ops.attention(q, k, v, implementation="xla", **kwargs))(q, k, v)
    np.testing.assert_allclose(np.asarray(got)[real], np.asarray(want)[real], atol=2e-5)


def test_local_layer_grid_is_bounded_by_the_window():
    """The key axis of the grid is a static bound from the window: a local layer visits O(seq * window) keys."""
    st = _Static(scale=1.0, half=256, block_q=256, block_k=256, alibi=True, interpret=False)
    visited = [_steps(st, seq, 256, 256) for seq in (4096, 16384)]
    assert visited == [4, 4]  # of 16 and 64 key blocks: 1024 keys per 256 queries, for a 513-key window
    glob = _Static(scale=1.0, half=None, block_q=256, block_k=256, alibi=True, interpret=False)
    assert _steps(glob, 4096, 256, 256) == 16  # a global layer visits every block


def test_tile_sizes_must_fit_mosaic():
    x = jnp.zeros((1, 16, 2, 8))
    seg = jnp.ones((1, 16), jnp.int32)
    with pytest.raises(ValueError, match="multiples of 128"):
        tpu_flash_attention(x, x, x, segment_ids=seg, local_window=4, scale=1.0, alibi_slopes=jnp.ones(2),
                            block_q=64)


def test_mosaicbert_logits_match_dense_with_the_kernel():
    """A whole MosaicBERT (ALiBi on every layer) with attention_implementation="pallas_tpu" runs this kernel and
    gives the dense model's logits (packed row with padding, 40 tokens)."""
    from bertjax.config import get_config
    from bertjax.models import EncoderForMaskedLM, init_params

    config = get_config("mosaicbert-tiny")
    rng = np.random.default_rng(3)
    ids = rng.integers(1, config.vocab_size, (2, 40)).astype(np.int32)
    seg = np.stack([np.r_[np.full(25, 1), np.full(10, 2), np.zeros(5)], np.ones(40)]).astype(np.int32)
    params = init_params(EncoderForMaskedLM(config), jax.random.key(0))

    def logits(implementation):
        model = EncoderForMaskedLM(config.replace(attention_implementation=implementation, attention_interpret=True))
        return np.asarray(jax.jit(lambda p: model.apply({"params": p}, ids, segment_ids=seg).logits)(params))

    valid = seg != 0
    np.testing.assert_allclose(logits("pallas_tpu")[valid], logits("xla")[valid], atol=1e-4, rtol=1e-4)
