"""The Python API as a notebook user or a serving engineer calls it (audit of the API, findings F1-F8): boxed
parameters saved as a model directory, `bertjax.checked` under outer transformations, dropout's key, errors that
name the argument, the inference compile cache."""

from __future__ import annotations

import os
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bertjax
from bertjax.model_dirs import load_model_dir, save_model_dir


@pytest.fixture(scope="module")
def bert():
    model = bertjax.EncoderForMaskedLM(bertjax.get_config("bert-tiny"))
    return model, bertjax.init_params(model, jax.random.key(0))


def test_save_model_dir_takes_boxed_params_and_loads_them_back(bert, tmp_path):
    model, _ = bert
    boxed = model.init(jax.random.key(1), jnp.zeros((1, 8), jnp.int32))["params"]  # LogicallyPartitioned leaves
    save_model_dir(tmp_path / "boxed", model, boxed)
    loaded_model, loaded, _ = load_model_dir(tmp_path / "boxed")
    assert loaded_model.config == model.config
    unboxed = jax.tree.leaves(nn.meta.unbox(boxed))
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(loaded), unboxed))


def test_save_model_dir_refuses_another_models_params_before_writing(bert, tmp_path):
    model, params = bert
    wider = bertjax.EncoderForMaskedLM(model.config.replace(hidden_size=64, intermediate_size=128))
    with pytest.raises(ValueError, match=r"params/embeddings/norm/bias is \(32,\), the model's is \(64,\)"):
        save_model_dir(tmp_path / "wider", wider, params)
    missing = {**params, "mlm_head": {}}
    with pytest.raises(ValueError, match=r"params/mlm_head/\S+ is absent"):
        save_model_dir(tmp_path / "missing", model, missing)
    assert not os.path.exists(tmp_path / "wider") and not os.path.exists(tmp_path / "missing")


def test_checked_composes_with_grad_and_vmap_and_refuses_an_outer_jit(bert):
    """`bertjax.checked` is an outermost boundary: grad and vmap around it run its checks (a bad id is still the
    ValueError naming the range); an outer jit, where the checks could not report, is a TypeError saying so."""
    model, params = bert
    ids = jnp.ones((2, 4), jnp.int32)
    bad = ids.at[0, 0].set(model.config.vocab_size + 3)
    predict = bertjax.checked(lambda p, i: model.apply({"params": p}, i).logits)
    plain = lambda p, i: model.apply({"params": p}, i).logits
    grads = jax.grad(lambda p: predict(p, ids).sum())(params)
    expected = jax.grad(lambda p: plain(p, ids).sum())(params)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6), grads, expected)
    batched = jax.vmap(predict, in_axes=(None, 0))(params, ids[:, None])
    np.testing.assert_allclose(np.asarray(batched[:, 0]), np.asarray(plain(params, ids)), atol=1e-5)
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 128\); got min 1 and max 131"):
        jax.vmap(predict, in_axes=(None, 0))(params, bad[:, None])  # traced ids: the device-side check
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 128\)"):
        jax.grad(lambda p: predict(p, bad).sum())(params)
    with pytest.raises(TypeError, match=r"bertjax.checked\(fn\) is an outermost jit boundary"):
        jax.jit(predict)(params, ids)
    checked_grad = bertjax.checked(jax.grad(lambda p, i: plain(p, i).sum()))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5),
                 checked_grad(params, ids), expected)  # compiled against eager: float32 rounding
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 128\)"):
        checked_grad(params, bad)


def test_dropout_needs_deterministic_false_and_a_key_and_says_so():
    """Dropout runs only with deterministic=False and rngs={"dropout": key}; without the key, the error names the
    idiom (where Flax's names neither); the class docstrings (help()) list the call arguments."""
    model = bertjax.EncoderForMaskedLM(bertjax.get_config("bert-tiny", dropout_rate=0.1))
    params = bertjax.init_params(model, jax.random.key(0))
    ids = jnp.arange(5, 21, dtype=jnp.int32).reshape(2, 8)
    inference = model.apply({"params": params}, ids).logits
    with pytest.raises(ValueError, match=r"deterministic=False runs dropout, which needs a random key: .*"
                                         r"rngs=\{'dropout': key\}"):
        model.apply({"params": params}, ids, deterministic=False)
    dropped = model.apply({"params": params}, ids, deterministic=False, rngs={"dropout": jax.random.key(1)}).logits
    assert not np.allclose(np.asarray(dropped), np.asarray(inference))
    no_dropout = bertjax.EncoderForMaskedLM(model.config.replace(dropout_rate=0.0))  # nothing to drop: no key
    np.testing.assert_array_equal(no_dropout.apply({"params": params}, ids, deterministic=False).logits, inference)
    classifier = bertjax.EncoderForSequenceClassification(bertjax.get_config(
        "bert-tiny", dropout_rate=0.0, task=bertjax.TaskConfig(num_labels=2, classifier_dropout=0.1)))
    with pytest.raises(ValueError, match="needs a random key"):  # the head's dropout alone needs it too
        classifier.apply({"params": bertjax.init_params(classifier, jax.random.key(0))}, ids, deterministic=False)
    for cls in bertjax.MODEL_CLASSES.values():
        assert 'deterministic=False, rngs={"dropout": key}' in cls.__doc__ and "segment_ids:" in cls.__doc__, cls
    assert "masked_positions: int [batch, num]" in bertjax.EncoderForMaskedLM.__doc__
    assert "max_segments=K" in bertjax.EncoderForSequenceClassification.__doc__


def test_masked_positions_max_segments_and_segment_ids_errors_name_the_argument(bert):
    model, params = bert
    ids = jnp.arange(5, 13, dtype=jnp.int32).reshape(2, 4)
    apply = lambda **kw: model.apply({"params": params}, ids, **kw)
    with pytest.raises(ValueError, match=r"masked_positions must be \[batch=2, num\] .*got shape \(2,\)"):
        apply(masked_positions=jnp.array([0, 3]))
    with pytest.raises(ValueError, match=r"masked_positions must be \[batch=2, num\] .*got shape \(1, 2\)"):
        apply(masked_positions=jnp.array([[0, 3]]))
    with pytest.raises(ValueError, match="masked_positions must be integers, got float32"):
        apply(masked_positions=jnp.array([[0.0, 3.0], [1.0, 2.0]]))
    with pytest.raises(ValueError, match=r"segment_ids must be >= 0 \(packed texts 1, 2, \.\.\.; 0 marks padding\)"):
        apply(segment_ids=jnp.array([[-1, 1, 1, 1], [1, 1, 1, 1]]))

    classifier = bertjax.EncoderForSequenceClassification(bertjax.get_config("bert-tiny"))
    weights = bertjax.init_params(classifier, jax.random.key(0))
    four_texts = jnp.array([[1, 2, 3, 4], [1, 1, 2, 0]])
    classify = lambda segments, k: classifier.apply({"params": weights}, ids, segment_ids=segments, max_segments=k)
    with pytest.raises(ValueError, match=r"segment_ids must be in \[0, 3\) \(max_segments=2 slots: packed texts "
                                         r"1\.\.2, 0 padding\); got min 0 and max 4"):
        classify(four_texts, 2)
    with pytest.raises(ValueError, match=r"segment_ids must be in \[0, 3\)"):  # on the device, when checked
        bertjax.checked(lambda segments: classify(segments, 2))(four_texts)
    assert classify(four_texts, 4).segment_mask.shape == (2, 4)
    with pytest.raises(TypeError, match=r"max_segments must be a static Python int .*static_argnames"):
        jax.jit(classify)(four_texts, 4)
    with pytest.raises(TypeError, match="max_segments must be a static Python int"):
        classify(four_texts, 2.0)
    # deterministic too decides what is computed: traced, it was a bare TracerBoolConversionError.
    with pytest.raises(TypeError, match="deterministic is a traced value.*static_argnames='deterministic'"):
        jax.jit(classifier.apply)({"params": weights}, ids, deterministic=True)


def test_inference_runners_of_one_model_share_a_compiled_function_and_the_cache_is_bounded():
    from bertjax.inference import Runner, encoder_row_fn
    from bertjax.inference import runner as runner_module

    model = bertjax.EncoderModel(bertjax.get_config("bert-tiny"))
    params = bertjax.init_params(model, jax.random.key(0))
    first, second = encoder_row_fn(model), encoder_row_fn(bertjax.EncoderModel(bertjax.get_config("bert-tiny")))
    assert first == second and hash(first) == hash(second) and first != encoder_row_fn(model, "cls")
    batch = {"input_ids": np.full((2, 8), 7, np.int32), "segment_ids": np.array([[1] * 4 + [2] * 4, [1] * 8],
                                                                                np.int32)}
    runner = Runner(first)
    pooled = next(runner.run(params, [batch], max_segments=2))["segments"]["pooled"]
    again = Runner(second)
    assert again._fn is runner._fn  # one jitted function: its compiled programs serve both
    np.testing.assert_array_equal(next(again.run(params, [batch], max_segments=2))["segments"]["pooled"], pooled)
    assert runner.compiles == 1 and again.compiles == 0

    closures = [lambda p, b, k, i=i: encoder_row_fn(model)(p, b, k) for i in range(runner_module.JITTED_CACHE_SIZE + 4)]
    runners = [Runner(fn) for fn in closures]
    assert len(runner_module._JITTED) == runner_module.JITTED_CACHE_SIZE
    assert closures[0] not in runner_module._JITTED and closures[-1] in runner_module._JITTED
    # an evicted function's runner still holds it, and runs
    np.testing.assert_array_equal(next(runners[0].run(params, [batch], max_segments=2))["segments"]["pooled"], pooled)


KERNEL_FIELDS = [  # (preset, overrides, the error's start)
    ("bert-tiny", {"attention_implementation": "pallas_tpu"}, "attention implementation 'pallas_tpu' "
                                                              "(EncoderConfig.attention_implementation"),
    ("bert-tiny", {"attention_implementation": "pallas_gpu"}, "attention implementation 'pallas_gpu' "
                                                              "(EncoderConfig.attention_implementation"),
    ("modernbert-tiny", {"norm_implementation": "pallas_gpu"}, "norm implementation 'pallas_gpu' "
                                                               "(EncoderConfig.norm_implementation"),
    ("modernbert-tiny", {"glu_implementation": "pallas_gpu"}, "glu implementation 'pallas_gpu' "
                                                              "(EncoderConfig.glu_implementation"),
    ("deberta-v3-tiny", {"disentangled": {"implementation": "pallas_gpu"}},
     "disentangled attention implementation 'pallas_gpu' (EncoderConfig.disentangled.implementation"),
]


on_cpu = pytest.mark.skipif(jax.default_backend() != "cpu", reason="the Pallas kernels run on this machine")


@on_cpu
@pytest.mark.parametrize("preset,overrides,start", KERNEL_FIELDS, ids=[f"{p}-{o}" for p, o, _ in KERNEL_FIELDS])
def test_a_kernel_named_on_a_platform_it_cannot_compile_for_names_the_field(preset, overrides, start):
    """In the Python API, as in a run config: compiling a model whose kernel cannot run on this platform (not in
    interpret mode) is a ValueError naming the field, the platform and what runs here; tracing alone is not."""
    model = bertjax.EncoderForMaskedLM(bertjax.get_config(preset, **overrides))
    jax.eval_shape(lambda key: bertjax.init_params(model, key), jax.random.key(0))  # traces, compiles nothing
    with pytest.raises(ValueError, match=rf"^{re.escape(start)}.* runs only on (tpu|gpu), but this program is "
                                         r"compiled for cpu; what runs on cpu: \[.*'(xla|dense)'.*\] \(or .*interpret=True"):
        bertjax.init_params(model, jax.random.key(0))


@on_cpu
def test_ops_attention_names_the_implementation_and_checks_the_platform_compiled_for():
    from bertjax.ops.platform_guard import KernelChoice, require_platform

    q = jnp.ones((1, 8, 2, 16), jnp.float32)
    for call in (lambda: bertjax.ops.attention(q, q, q, implementation="pallas_gpu"),
                 lambda: jax.jit(lambda x: bertjax.ops.attention(x, x, x, implementation="pallas_tpu"))(q)):
        with pytest.raises(ValueError, match=r"attention implementation 'pallas_.pu' \(EncoderConfig\.attention_"
                                             r"implementation, or implementation= of bertjax\.ops\.attention\)"):
            call()
    # The platform checked is the one lowered for, not this machine's: ahead-of-time compiles for a TPU or a GPU
    # from a CPU host (bertjax.tpu_aot, bertjax.gpu_aot, jax.export) pass it.
    tpu_only = KernelChoice("test kernel", "a field", frozenset({"tpu"}), (("x", None),), "interpret=True")
    gpu_only = KernelChoice("test kernel", "a field", frozenset({"gpu"}), (("x", None),), "interpret=True")
    x = jnp.arange(4.0)
    traced = lambda choice: jax.jit(lambda v: require_platform(v, choice, False) * 2).trace(x)
    traced(tpu_only).lower(lowering_platforms=("tpu",))
    traced(gpu_only).lower(lowering_platforms=("cuda",))
    with pytest.raises(ValueError, match=r"test kernel \(a field\) runs only on tpu, but this program is compiled "
                                         r"for gpu; what runs on gpu: \['x'\]"):
        traced(tpu_only).lower(lowering_platforms=("cuda",))
    # interpret mode runs anywhere; where it may run, the guard is the identity under grad and vmap
    np.testing.assert_array_equal(require_platform(x, tpu_only, interpret=True), x)
    here = KernelChoice("test kernel", "a field", frozenset({jax.default_backend()}), (), "interpret=True")
    np.testing.assert_array_equal(jax.grad(lambda v: (require_platform(v, here, False) ** 2).sum())(x), 2 * x)
    np.testing.assert_array_equal(jax.vmap(lambda v: require_platform(v, here, False))(x[:, None]), x[:, None])


def test_jax_export_with_a_symbolic_batch_and_length_runs_every_size():
    """Serving exports one function for every batch size (and, where attention allows, every length): choices
    made from shapes (stacking projections, blockwise or dense attention) must not compare symbolic sizes."""
    from jax import export

    cases = [("bert-tiny", "b, 16"), ("modernbert-tiny", "b, s")]  # stacked q/k/v; a local window's path
    for preset, spec in cases:
        model = bertjax.EncoderForMaskedLM(bertjax.get_config(preset, vocab_size=64))
        params = bertjax.init_params(model, jax.random.key(0))
        forward = jax.jit(lambda p, ids, model=model: model.apply({"params": p}, ids).logits)
        shape = export.symbolic_shape(spec, constraints=["s <= 64"] if "s" in spec else ())
        exported = export.export(forward)(params, jax.ShapeDtypeStruct(shape, jnp.int32))
        # The serving artefact: serialized (the serve extra's flatbuffers), read back, called at any shape.
        exported = export.deserialize(exported.serialize())
        for batch, seq in ((1, 16), (3, 16)) if "s" not in spec else ((2, 5), (1, 40)):
            ids = jnp.asarray(np.random.default_rng(batch).integers(5, 64, (batch, seq)), jnp.int32)
            np.testing.assert_allclose(np.asarray(exported.call(params, ids)), np.asarray(forward(params, ids)),
                                       rtol=0, atol=1e-5, err_msg=f"{preset} {batch}x{seq}")
    # Without the bound, the length check says which constraint to give (it was JAX's inconclusive comparison).
    bert = bertjax.EncoderForMaskedLM(bertjax.get_config("bert-tiny", vocab_size=64))
    unbounded = jax.ShapeDtypeStruct(export.symbolic_shape("b, s"), jnp.int32)
    with pytest.raises(ValueError, match=r'constraints=\["s <= 64"\]'):
        export.export(jax.jit(lambda p, ids: bert.apply({"params": p}, ids).logits))(
            bertjax.init_params(bert, jax.random.key(0)), unbounded)
    model = bertjax.EncoderForMaskedLM(bertjax.get_config("deberta-v3-tiny", vocab_size=64))
    params = bertjax.init_params(model, jax.random.key(0))
    with pytest.raises(ValueError, match="disentangled attention needs a fixed sequence length"):
        export.export(jax.jit(lambda p, ids: model.apply({"params": p}, ids).logits))(
            params, jax.ShapeDtypeStruct(export.symbolic_shape("b, s"), jnp.int32))
