"""pallas_gpu's one-pass backward (`backward_kernel="triton_atomic"`, the registry's "pallas_gpu_atomic";
bertjax/ops/pallas_gpu_attention_one_pass.py), in interpret mode: against the two-kernel backward it replaces (dv the
same numbers, dq and dk within one rounding), on the stacked q/k/v path, and in a model. Against the dense XLA
reference: its five shape cases in tests/test_attention_kernels.py, ALiBi, GQA and global tokens in
tests/test_attention_features.py. Its sm_90 compile (relaxed atomics, no barriers) is
tests/test_pallas_gpu_export.py's."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax import ops
from bertjax.config import get_config
from bertjax.ops.attention import IMPLEMENTATIONS
from bertjax.ops.pallas_gpu_attention import pallas_gpu_attention, pallas_gpu_rope_attention
from kernel_helpers import assert_same_loss_and_gradients
from test_attention_kernels import forward_and_grads, make_inputs
from test_fused_qkv_attention import packed_inputs, split_reference


@pytest.mark.parametrize("window", [None, 16], ids=["global", "local16"])
def test_dv_as_the_two_kernel_backward_and_dq_dk_within_one_rounding(window):
    """bfloat16, on the dk/dv kernel's own tiles (32 keys held, 16 queries streamed; dq's 16 x 32 in the two-kernel
    backward): dv comes from the same products in the same order, so it is the same numbers; dq is the same
    float32 sum taken in another order (key blocks in each program's staggered order, added into one buffer), and
    delta (in dk's ds) a float32 row sum XLA may order differently from the dq kernel, so those two may differ by one
    bfloat16 rounding."""
    q, k, v, seg, cotangent, _ = make_inputs(77, 4, 2, 64, jnp.bfloat16)
    tiles = dict(block_q=16, block_k=32, dkv_block_q=16, dkv_block_k=32)

    def run(backward_kernel):
        fn = functools.partial(pallas_gpu_attention, interpret=True, backward_kernel=backward_kernel, **tiles)
        out, grads, _ = jax.jit(functools.partial(forward_and_grads, fn, window=window, scale=0.125))(
            q, k, v, seg, cotangent, cotangent)
        return out, grads

    out, (dq, dk, dv) = run("triton_atomic")
    want_out, (want_dq, want_dk, want_dv) = run("triton")
    np.testing.assert_array_equal(np.asarray(out, np.float32), np.asarray(want_out, np.float32))
    np.testing.assert_array_equal(np.asarray(dv, np.float32), np.asarray(want_dv, np.float32))
    for got, want in ((dq, want_dq), (dk, want_dk)):
        got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
        # one bfloat16 step (8 significant bits) at |want|, or at a hundredth of the largest gradient where
        # cancellation leaves an entry near zero
        step = np.maximum(np.abs(want), 0.01 * np.abs(want).max()) * 2.0 ** -7
        assert np.all(np.abs(got - want) <= step), np.max(np.abs(got - want) / step)
        assert np.mean(got == want) > 0.9


@pytest.mark.parametrize("window", [None, 32], ids=["global", "local32"])
def test_stacked_path_matches_split_attention_and_its_gradient(window):
    """pallas_gpu_rope_attention with the one-pass backward: the kernel writes the k and v slots of the stacked
    gradient, XLA the q slot once dq is complete (RoPE's backward applied); float32, 2e-6 as the two-kernel path."""
    qkv, positions, segments, weight = packed_inputs()

    def loss(fn):
        def value(qkv):
            out = fn(qkv)
            return jnp.sum(out * weight), out
        return jax.jit(jax.value_and_grad(value, has_aux=True))  # one compiled program, not op-by-op dispatch

    kernel = lambda qkv: pallas_gpu_rope_attention(qkv, positions, 10_000.0, segment_ids=segments,
                                                   local_window=window, scale=16 ** -0.5, interpret=True,
                                                   backward_kernel="triton_atomic", block_q=16, block_k=16)
    (_, want), want_grad = loss(lambda y: split_reference(y, positions, segments, window))(qkv)
    (_, got), grad = loss(kernel)(qkv)
    real = segments != 0
    np.testing.assert_allclose(np.asarray(got)[real], np.asarray(want)[real], atol=2e-6)
    np.testing.assert_allclose(grad, want_grad, atol=2e-6)


def test_stacked_path_refuses_a_backward_it_does_not_have():
    qkv, positions, segments, _ = packed_inputs()
    with pytest.raises(ValueError, match="backward_kernel must be one of"):
        pallas_gpu_rope_attention(qkv, positions, 10_000.0, segment_ids=segments, local_window=None, scale=0.25,
                                  interpret=True, backward_kernel="mosaic")


def test_registry_entry_serves_every_feature_and_auto_never_picks_it():
    assert IMPLEMENTATIONS["pallas_gpu_atomic"].features == IMPLEMENTATIONS["pallas_gpu"].features
    for platform in ("cpu", "gpu", "tpu"):
        assert ops.resolve_implementation("auto", frozenset(), platform=platform) != "pallas_gpu_atomic"


def test_modernbert_trains_the_same_as_with_the_two_kernel_backward():
    """Tiny ModernBERT (global and local layers, packed rows, padding) on the stacked q/k/v path, as pretraining
    runs it (the split path is the direct tests' above): loss and every parameter's gradient with
    "pallas_gpu_atomic" as with "pallas_gpu" (float32; the dq sums differ in order only). Two layers: layer 0
    global, layer 1 local (window 8); a third, local like the second, would only add compile time."""
    config = get_config("modernbert-tiny", attention_implementation="pallas_gpu", attention_interpret=True,
                        attention_fused_qkv=True, num_layers=2)
    assert config.global_attention_every == 3 and config.local_window == 8  # layer 0 global, layer 1 local
    assert_same_loss_and_gradients(config, attention_implementation="pallas_gpu_atomic")


def test_a_jax_without_the_atomics_internals_gets_an_error_naming_the_way_out():
    """The relaxed atomic add is built on JAX's Pallas Triton internals (bertjax/ops/triton_atomics.py): where they
    moved, selecting it fails at import with an error saying what to use instead (a subprocess: the module is
    imported once per process)."""
    import os
    import subprocess
    import sys

    script = ("from jax._src.pallas.triton import lowering\n"
              "del lowering._atomic_rmw\n"
              "import bertjax.ops.triton_atomics\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert result.returncode != 0
    assert "ImportError" in result.stderr and "use attention_implementation 'pallas_gpu'" in result.stderr
