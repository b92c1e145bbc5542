"""ALiBi and global tokens in every implementation that claims them, against the dense XLA reference (itself tested
against numpy in test_attention_reference.py), forward and dq/dk/dv; and the capability registry behind "auto"."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax import ops
from bertjax.config import alibi_slopes
from bertjax.ops.attention import AUTO_PREFERENCE, FEATURES, IMPLEMENTATIONS, required_features


def test_every_implementation_declares_known_features_and_xla_serves_all():
    assert set(IMPLEMENTATIONS["xla"].features) == set(FEATURES)
    for name, impl in IMPLEMENTATIONS.items():
        assert impl.features <= set(FEATURES), name


def test_auto_picks_the_first_preference_that_supports_the_call():
    everything = required_features(heads=4, kv_heads=2, local_window=8, alibi=True, global_tokens=True)
    assert everything == set(FEATURES)
    for platform, preference in AUTO_PREFERENCE.items():
        plain = ops.resolve_implementation("auto", frozenset(), platform=platform)
        assert plain == preference[0]
        chosen = ops.resolve_implementation("auto", everything, platform=platform)
        assert everything <= IMPLEMENTATIONS[chosen].features


def test_explicit_implementation_without_a_feature_is_an_error_naming_it():
    lacking = [(name, feature) for name, impl in IMPLEMENTATIONS.items() for feature in FEATURES
               if feature not in impl.features]
    for name, feature in lacking:
        with pytest.raises(ValueError, match=f"{name!r} does not support {feature}"):
            ops.resolve_implementation(name, frozenset({feature}))
    # Through the entry point too, before anything is traced.
    x = np.zeros((1, 4, 2, 8), np.float32)
    for name, feature in lacking:
        if feature == "alibi":
            with pytest.raises(ValueError, match="does not support alibi"):
                ops.attention(x, x, x, implementation=name, alibi_slopes=np.ones(2, np.float32))


def test_global_tokens_on_a_global_layer_change_nothing():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 6, 2, 8)).astype(np.float32) for _ in range(3))
    glob = np.array([[True, False, False, True, False, False]])
    got = ops.attention(q, k, v, global_tokens=glob, implementation="xla")
    np.testing.assert_allclose(np.asarray(got), np.asarray(ops.attention(q, k, v, implementation="xla")))


# Implementations claiming both features that run on CPU without a kernel. xla_auto claims them too and runs one of
# xla_blockwise or xla per call (by BLOCKWISE_MAX_WINDOW_FRACTION), both held to the dense result here.
CLAIMING = sorted(name for name, impl in IMPLEMENTATIONS.items()
                  if name not in ("xla", "xla_auto") and {"alibi", "global_tokens"} <= impl.features
                  and not name.startswith("pallas"))


def feature_case(dtype=np.float32):
    """GQA (4 query heads on 2 kv heads), 45 tokens (no chunk multiple), row 0 packing two documents with a
    global token each and padding, row 1 with padding whose only global token is padding."""
    rng = np.random.default_rng(0)
    batch, seq, heads, kv_heads, dim = 2, 45, 4, 2, 8
    q = rng.standard_normal((batch, seq, heads, dim)).astype(dtype)
    k, v = (rng.standard_normal((batch, seq, kv_heads, dim)).astype(dtype) for _ in range(2))
    segments = np.ones((batch, seq), np.int32)
    segments[0, 20:], segments[0, 40:], segments[1, 30:] = 2, 0, 0
    glob = np.zeros((batch, seq), bool)
    glob[0, [3, 25]] = True
    glob[1, 35] = True
    return q, k, v, segments, glob, np.asarray(alibi_slopes(heads), np.float32)


@pytest.mark.parametrize("name", CLAIMING)
def test_alibi_and_global_tokens_match_dense_forward_and_gradients(name):
    q, k, v, segments, glob, slopes = feature_case()
    real = segments != 0

    def loss_and_out(implementation, bound, q, k, v, glob):
        def loss(q, k, v):
            out = ops.attention(q, k, v, segment_ids=segments, local_window=8, implementation=implementation,
                                alibi_slopes=slopes, global_tokens=glob, max_global_tokens=bound)
            return jnp.sum(jnp.where(real[..., None, None], out, 0.0) ** 2), out
        return jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(q, k, v)

    run = jax.jit(loss_and_out, static_argnums=(0, 1))
    (_, expected), expected_grads = run("xla", None, q, k, v, glob)
    # A traced mask with a bound of 2 global tokens per row (unbounded, every position is a slot: the Longformer
    # model tests run that path under jit).
    for bound in (2,):
        (_, out), grads = run(name, bound, q, k, v, glob)
        np.testing.assert_allclose(np.asarray(out)[real], np.asarray(expected)[real], atol=2e-5)
        for got, want in zip(grads, expected_grads):
            np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=5e-5)
    # The bias and the global tokens really change the result.
    plain = ops.attention(q, k, v, segment_ids=segments, local_window=8, implementation="xla")
    assert np.abs(np.asarray(plain) - np.asarray(expected))[real].max() > 1e-2
    # bfloat16 inputs: close to the float32 dense result.
    qb, kb, vb = (x.astype(jnp.bfloat16) for x in (q, k, v))
    low = jax.jit(lambda q, k, v: ops.attention(q, k, v, segment_ids=segments, local_window=8, implementation=name,
                                                alibi_slopes=slopes, global_tokens=glob,
                                                max_global_tokens=2))(qb, kb, vb)
    assert low.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(low, np.float32)[real], np.asarray(expected)[real], atol=5e-2)
    with pytest.raises(ValueError, match="more than max_global_tokens=1"):
        ops.attention(q, k, v, segment_ids=segments, local_window=8, implementation=name, global_tokens=glob,
                      max_global_tokens=1)



def assert_matches_dense_with_gradients(candidate, dense, q, k, v, real):
    """candidate(q, k, v) equals dense(q, k, v) on real tokens (2e-5), and so do the gradients of a loss over the real
    tokens' outputs with respect to q, k and v (5e-5)."""
    def loss_and_out(attention):
        def loss(q, k, v):
            out = attention(q, k, v)
            return jnp.sum(jnp.where(real[..., None, None], out, 0.0) ** 2), out
        return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)

    (_, expected), expected_grads = loss_and_out(dense)
    (_, out), grads = loss_and_out(candidate)
    np.testing.assert_allclose(np.asarray(out)[real], np.asarray(expected)[real], atol=2e-5)
    for got, want in zip(grads, expected_grads):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=5e-5)

def test_global_alibi_layer_query_chunked_matches_dense_forward_and_gradients():
    from bertjax.ops.blockwise_attention import blockwise_local_attention

    q, k, v, segments, _, slopes = feature_case()
    real = segments != 0

    def chunked(q, k, v):  # forced at this length (it starts at GLOBAL_CHUNKED_MIN_SEQ by default)
        return blockwise_local_attention(q, k, v, segment_ids=jnp.asarray(segments), local_window=None,
                                         scale=8 ** -0.5, alibi_slopes=jnp.asarray(slopes), global_query_chunk=16)

    def dense(q, k, v):
        return ops.attention(q, k, v, segment_ids=segments, implementation="xla", alibi_slopes=slopes)

    assert_matches_dense_with_gradients(chunked, dense, q, k, v, real)


def test_alibi_and_longformer_memory_grows_linearly_in_blockwise():
    """Compiled temporaries of forward + backward, seq 2048 -> 4096 (dense grows 4x: docs/benchmarks.md)."""
    def temp_bytes(implementation, seq, window, globals_):
        x = jax.ShapeDtypeStruct((1, seq, 2, 16), jnp.float32)
        glob = np.zeros((1, seq), bool)
        glob[0, :globals_] = True
        slopes = np.asarray(alibi_slopes(2), np.float32)

        def fwd_bwd(q, k, v):
            fn = lambda q, k, v: ops.attention(q, k, v, local_window=window, implementation=implementation,
                                               alibi_slopes=slopes if window is None else None,
                                               global_tokens=glob if globals_ else None,
                                               max_global_tokens=globals_ or None)
            out, vjp = jax.vjp(fn, q, k, v)
            return vjp(out)

        return jax.jit(fwd_bwd).lower(x, x, x).compile().memory_analysis().temp_size_in_bytes

    for window, globals_ in ((None, 0), (256, 8)):  # an ALiBi (global) layer; a Longformer layer
        block = [temp_bytes("xla_blockwise", seq, window, globals_) for seq in (2048, 4096)]
        assert block[1] / block[0] < 2.6, (window, block)


@pytest.mark.parametrize("backward", [{}, dict(backward_block_q=32, backward_block_k=16),
                                      dict(backward_kernel="triton_atomic")],
                         ids=["forward_tiles", "own_backward_tiles", "one_pass_backward"])
def test_pallas_gpu_alibi_and_global_tokens_match_dense_forward_and_gradients_in_interpret_mode(backward):
    """The kernel adds ALiBi per tile; global keys beyond the window join its softmax through the log-sum-exp, and
    global queries get their own rows (both in XLA). The log-sum-exp path's backward takes its own tiles too, and
    the one-pass backward (GQA: dq added per query head) takes the log-sum-exp cotangent into delta before it."""
    from bertjax.ops.pallas_gpu_attention import pallas_gpu_attention

    q, k, v, segments, glob, slopes = feature_case()
    real = segments != 0

    def kernel(q, k, v):  # small tiles: 45 tokens span several query and key blocks
        return pallas_gpu_attention(q, k, v, segment_ids=jnp.asarray(segments), local_window=8, scale=8 ** -0.5,
                                    interpret=True, alibi_slopes=jnp.asarray(slopes),
                                    global_tokens=jnp.asarray(glob & real), global_slots=2, block_q=16, block_k=16,
                                    **backward)

    def dense(q, k, v):
        return ops.attention(q, k, v, segment_ids=segments, local_window=8, implementation="xla",
                             alibi_slopes=slopes, global_tokens=glob)

    assert_matches_dense_with_gradients(kernel, dense, q, k, v, real)
