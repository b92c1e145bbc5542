"""The dense XLA attention against a plain numpy loop over query positions."""

import chex
import numpy as np
import pytest

from bertjax import ops


def numpy_attention(q, k, v, segment_ids, window, scale, slopes=None, global_tokens=None):
    batch, seq, heads, dim = q.shape
    group = heads // k.shape[2]
    out = np.zeros_like(q)
    glob = np.zeros((batch, seq), bool) if global_tokens is None else np.asarray(global_tokens, bool)
    for b in range(batch):
        for h in range(heads):
            for i in range(seq):
                keys = [j for j in range(seq) if segment_ids[b, i] != 0 and segment_ids[b, j] == segment_ids[b, i]
                        and (window is None or abs(i - j) <= window // 2 or glob[b, i] or glob[b, j])]
                if not keys:
                    continue
                s = np.array([q[b, i, h] @ k[b, j, h // group] for j in keys]) * scale
                if slopes is not None:  # ALiBi over distances inside the document (positions restart per segment)
                    start = min(j for j in range(seq) if segment_ids[b, j] == segment_ids[b, i])
                    s = s - slopes[h] * np.array([abs((i - start) - (j - start)) for j in keys])
                p = np.exp(s - s.max()); p /= p.sum()
                out[b, i, h] = sum(pj * v[b, j, h // group] for pj, j in zip(p, keys))
    return out


@pytest.mark.parametrize("window", [None, 4, 7, 64])
@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_dense_attention_matches_numpy(window, kv_heads):
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 13, 4, 8)).astype(np.float32)
    k = rng.standard_normal((2, 13, kv_heads, 8)).astype(np.float32)
    v = rng.standard_normal((2, 13, kv_heads, 8)).astype(np.float32)
    # Row 0: three packed documents (one of a single token) and a padding tail; row 1: one document, no padding.
    seg = np.array([[1, 1, 1, 1, 2, 3, 3, 3, 3, 3, 0, 0, 0], [1] * 13], np.int32)
    out = np.asarray(ops.attention(q, k, v, segment_ids=seg, local_window=window, implementation="xla"))
    ref = numpy_attention(q, k, v, seg, window, 1 / np.sqrt(8))
    valid = seg != 0
    np.testing.assert_allclose(out[valid], ref[valid], atol=1e-5, rtol=1e-5)
    assert np.isfinite(out).all()  # padding rows have no visible key and must stay finite


@pytest.mark.parametrize("window", [None, 4])
def test_alibi_and_global_tokens_match_numpy(window):
    """ALiBi per head plus global tokens in two documents, one global flag on padding (which must change nothing)."""
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((2, 13, heads, 8)).astype(np.float32) for heads in (4, 2, 2))
    seg = np.array([[1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 0, 0], [1] * 13], np.int32)
    glob = np.zeros((2, 13), bool)
    glob[0, [1, 8, 12]] = True  # one global token per document and one on padding
    glob[1, 12] = True
    slopes = np.array([0.5, 0.25, 0.125, 1 / 16], np.float32)
    out = np.asarray(ops.attention(q, k, v, segment_ids=seg, local_window=window, implementation="xla",
                                   alibi_slopes=slopes, global_tokens=glob))
    ref = numpy_attention(q, k, v, seg, window, 1 / np.sqrt(8), slopes, glob)
    valid = seg != 0
    np.testing.assert_allclose(out[valid], ref[valid], atol=1e-5, rtol=1e-5)
    probabilities = np.asarray(ops.attention_probabilities(q, k, segment_ids=seg, local_window=window,
                                                          scale=1 / np.sqrt(8), alibi_slopes=slopes,
                                                          global_tokens=glob))
    np.testing.assert_allclose(np.einsum("bhqk,bkhd->bqhd", probabilities, np.repeat(v, 2, axis=2))[valid],
                               ref[valid], atol=1e-5, rtol=1e-5)


def test_attention_rejects_bad_shapes():
    x = np.zeros((1, 4, 4, 8), np.float32)
    with pytest.raises(ValueError, match="kv_heads"):
        ops.attention(x, x[:, :, :3], x[:, :, :3])
    with pytest.raises(ValueError, match="segment_ids"):
        ops.attention(x, x, x, segment_ids=np.ones((1, 5), np.int32))
    with pytest.raises(ValueError, match="unknown attention implementation"):
        ops.attention(x, x, x, implementation="nope")
    with pytest.raises(ValueError, match="local_window"):
        ops.attention(x, x, x, local_window=0)
    with pytest.raises(ValueError, match="alibi_slopes"):
        ops.attention(x, x, x, alibi_slopes=np.ones(3, np.float32))
    with pytest.raises(ValueError, match="global_tokens"):
        ops.attention(x, x, x, local_window=2, global_tokens=np.ones((1, 3), bool))


def test_segment_positions_restart_per_document():
    seg = np.array([[1, 1, 1, 2, 2, 3, 0, 0]], np.int32)
    chex.assert_trees_all_equal(np.asarray(ops.segment_positions(seg)), np.array([[0, 1, 2, 0, 1, 0, 0, 1]]))


def test_rope_rotation_preserves_norm_and_relative_dot():
    rng = np.random.default_rng(1)
    q = rng.standard_normal((1, 6, 2, 8)).astype(np.float32)
    pos = np.arange(6)[None]
    rq = np.asarray(ops.apply_rope(q, pos, 10_000.0))
    np.testing.assert_allclose(np.linalg.norm(rq, axis=-1), np.linalg.norm(q, axis=-1), rtol=1e-5)
    # Same vectors at shifted positions give the same dot product: RoPE encodes only relative offsets.
    a = np.asarray(ops.apply_rope(np.repeat(q[:, :1], 6, 1), pos, 10_000.0))
    b = np.asarray(ops.apply_rope(np.repeat(q[:, 1:2], 6, 1), pos, 10_000.0))
    np.testing.assert_allclose((a[0, 0] * b[0, 2]).sum(-1), (a[0, 3] * b[0, 5]).sum(-1), rtol=1e-4, atol=1e-5)
