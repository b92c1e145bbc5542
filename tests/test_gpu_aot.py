"""Compiling for NVIDIA GPUs without one (bertjax/gpu_aot.py, `bertjax compile-check --topology h100`).

The topology names and the target description are checked everywhere; the compilation itself needs JAX's CUDA
plugin (`pip install "jax[cuda13]"`, several GB, not in the test extra), so it runs where that is installed and
skips elsewhere: there, the tiny pretraining config compiles for an H100 with its attention in bertjax's Triton
kernels, and a batch too large for the card is reported as not fitting.
"""

import subprocess
import sys

import pytest

from bertjax import gpu_aot


@pytest.mark.parametrize("topology, expected", [("h100", ("h100", 1)), ("h100:8", ("h100", 8)),
                                                ("h200:2", ("h200", 2))])
def test_topology_names(topology, expected):
    assert gpu_aot.is_gpu_topology(topology)
    assert gpu_aot.parse_topology(topology) == expected


@pytest.mark.parametrize("topology", ["h100:0", "h100:x", "a100", "H100", "h100:2:2"])
def test_bad_topology_names_are_refused(topology):
    with pytest.raises(ValueError, match="GPU topology"):
        gpu_aot.parse_topology(topology)


def test_tpu_names_are_not_gpu_topologies():
    assert not gpu_aot.is_gpu_topology("v5p:2x2x2") and not gpu_aot.is_gpu_topology("v5e:2x2")


def test_target_description_is_a_hopper_with_the_cards_memory():
    text = gpu_aot.target_config("h100")
    assert "cuda_compute_capability { major: 9 minor: 0 }" in text
    assert 'device_description_str: "NVIDIA H100 80GB HBM3"' in text  # the kind Pallas reads to pick its lowering
    assert f"device_memory_size: {81_559 * 2**20}" in text and "core_count: 132" in text
    assert text.count("{") == text.count("}")
    assert gpu_aot.device_memory_gib("h200:4") == pytest.approx(140.4, abs=0.1)


def test_without_the_cuda_plugin_the_error_says_what_to_install(monkeypatch):
    monkeypatch.setattr(gpu_aot, "cuda_plugin_available", lambda: False)
    with pytest.raises(RuntimeError, match=r'pip install "jax\[cuda13\]"'):
        gpu_aot.gpu_devices("h100")


needs_plugin = pytest.mark.skipif(not gpu_aot.cuda_plugin_available(),
                                  reason='needs JAX\'s CUDA plugin (pip install "jax[cuda13]")')


@needs_plugin
def test_compile_check_compiles_the_tiny_config_for_an_h100():
    def compile_check(*overrides):
        return subprocess.run([sys.executable, "-m", "bertjax.cli", "compile-check", "--config",
                               "configs/pretrain/tiny.yaml", "--topology", "h100", *overrides],
                              capture_output=True, text=True, timeout=900,
                              env={"JAX_PLATFORMS": "cpu", "CUDA_VISIBLE_DEVICES": "-1", "PATH": "/usr/bin:/bin"})

    result = compile_check("model.overrides.attention_implementation=auto")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "1 x NVIDIA H100 80GB HBM3" in result.stdout and "attention pallas_gpu" in result.stdout
    assert "Pallas kernel calls in the program (Triton): " in result.stdout
    assert "fits in the 59.7 GiB JAX may use of each GPU" in result.stdout


@needs_plugin
def test_inference_program_compiles_for_h100s_with_one_kernel_call_per_layer():
    """What `bertjax embed` and `predict` run on a GPU (the inference Runner over a data mesh of two H100s, packed
    rows, bfloat16) compiles with the Triton attention kernel inside each device's program, one call per layer."""
    import jax
    import jax.numpy as jnp

    from bertjax.config import get_config
    from bertjax.inference.rows import encoder_row_fn
    from bertjax.inference.runner import Runner, data_mesh
    from bertjax.models import EncoderModel, abstract_params

    config = get_config("modernbert-tiny", attention_implementation="pallas_gpu", dtype="bfloat16", num_layers=3,
                        max_position_embeddings=256)
    model = EncoderModel(config)
    runner = Runner(encoder_row_fn(model), mesh=data_mesh(gpu_aot.gpu_devices("h100:2")))
    params = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, jnp.bfloat16, sharding=runner._replicated),
                          abstract_params(model, seq_len=256))
    batch = {name: jax.ShapeDtypeStruct((4, 256), jnp.int32) for name in ("input_ids", "segment_ids")}
    compiled = runner.lower(params, batch, max_segments=4).compile()
    text = compiled.as_text()
    assert text.count("__gpu$xla.gpu.triton") == config.num_layers, "one attention kernel call per layer"
    assert "all-gather" not in text  # rows stay on their device: the kernel runs per device, not on gathered rows


@needs_plugin
def test_the_attention_benchs_mosaic_gpu_reference_compiles_for_an_h100():
    """bench/attention_bench.py times JAX's own Hopper FlashAttention (Pallas Mosaic GPU) beside pallas_gpu and
    cuDNN: its forward and backward compile for an H100 on the float16 inputs it is given, as one Mosaic GPU call
    each way (tests/test_gpu_session.py checks on CPU that it declines what it cannot express)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from bench.attention_bench import INPUT_DTYPES, MOSAIC_GPU, attention_fn, forward_backward

    fn = attention_fn(MOSAIC_GPU, None, 0.125)
    sharding = NamedSharding(Mesh(gpu_aot.gpu_devices("h100"), ("d",)), PartitionSpec())
    array = jax.ShapeDtypeStruct((1, 1024, 12, 64), INPUT_DTYPES[MOSAIC_GPU], sharding=sharding)
    segments = jax.ShapeDtypeStruct((1, 1024), jnp.int32, sharding=sharding)
    forward = jax.jit(fn).lower(array, array, array, segments).compile().as_text()
    both = jax.jit(forward_backward(fn)).lower(array, array, array, segments, array).compile().as_text()
    assert forward.count('custom_call_target="mosaic_gpu') == 1
    assert both.count('custom_call_target="mosaic_gpu') == 3  # forward, then the dq and dk/dv kernels


@needs_plugin
def test_deviceless_products_are_cublas_as_the_cards_autotuner_chose():
    """Without a device XLA would lower a product to a Triton GEMM fusion; `compile_lowered` gives the cuBLAS call
    an H100's autotuner chose for every product of the train step, so memory and kernels match the card's."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    sharding = NamedSharding(Mesh(gpu_aot.gpu_devices("h100"), ("d",)), PartitionSpec())
    a = jax.ShapeDtypeStruct((1024, 768), jnp.bfloat16, sharding=sharding)
    b = jax.ShapeDtypeStruct((768, 2304), jnp.bfloat16, sharding=sharding)
    lowered = jax.jit(lambda a, b: jax.nn.gelu(a @ b)).lower(a, b)
    assert "__triton_nested_gemm_fusion" in lowered.compile().as_text()
    text = gpu_aot.compile_lowered(lowered).as_text()
    assert 'custom_call_target="__cublas' in text and "__triton_nested_gemm_fusion" not in text



def compiled_two_gpu_tiny_step(*overrides: str):
    """The optimized HLO of the tiny pretraining config's train step (with these run-config overrides) compiled for
    two H100s, and its model config."""
    pytest.importorskip("grain")  # bertjax.data's batch shapes
    import jax

    from bertjax.data import batch_sharding, batch_spec
    from bertjax.train import mesh as mesh_lib
    from bertjax.train.run_config import load_run_config
    from bertjax.train.setup import setup_run

    config = load_run_config("configs/pretrain/tiny.yaml", list(overrides))
    setup = setup_run(config, vocab_size=config.tokenizer.vocab_size, pad_id=0,
                      devices=gpu_aot.gpu_devices("h100:2"), attention_platform="gpu", compile_only=True)
    phase = setup.phases[0]
    batch = {name: jax.ShapeDtypeStruct(shape, dtype, sharding=batch_sharding(setup.mesh, mesh_lib.BATCH_AXES))
             for name, (shape, dtype) in batch_spec(phase.data, process_count=1).items()}
    lowered = setup.steps_for(phase)[0].lower(setup.abstract_state(), setup.frozen, batch)
    return gpu_aot.compile_lowered(lowered).as_text(), setup.model_config


@needs_plugin
def test_norm_glu_and_stacked_attention_kernels_compile_into_a_two_gpu_train_step_per_device():
    """The tiny pretraining config with every norm in the residual add + norm kernel (pallas_gpu_norm), every MLP's
    GeGLU in the GLU kernel (pallas_gpu_glu) and attention on the stacked q/k/v projection
    (pallas_gpu_rope_attention), compiled for two H100s: each norm and each GLU is one Triton call each way, each
    layer's attention its three (forward, dq, dk/dv, the last writing into the buffer the dq kernel began), all run
    on each GPU's rows (nothing gathered, as XLA would to replicate a Triton call outside a shard_map)."""
    text, model = compiled_two_gpu_tiny_step("model.overrides.norm_implementation=pallas_gpu",
                                             "model.overrides.glu_implementation=pallas_gpu",
                                             "model.overrides.attention_fused_qkv=true")
    # Per layer an attention and an MLP norm (ModernBERT's layer 0 has no attention norm), the embedding norm, the
    # final norm and the MLM head's.
    norms = 2 * model.num_layers - (0 if model.first_layer_attention_norm else 1) + 3
    assert model.norm_implementation == "pallas_gpu" and model.norm_placement == "pre" and model.attention_fused_qkv
    assert text.count('name = "bertjax_add_norm_forward"') == norms
    assert text.count('name = "bertjax_add_norm_backward"') == norms
    for kernel in ("bertjax_flash_forward", "bertjax_flash_dq", "bertjax_flash_dkv", "bertjax_glu_forward",
                   "bertjax_glu_backward"):
        assert text.count(f'name = "{kernel}"') == model.num_layers, kernel
    assert "all-gather" not in text


@needs_plugin
def test_mosaic_kernels_compile_into_a_two_gpu_train_step():
    """attention_implementation pallas_gpu_mosaic in the tiny pretraining config at bfloat16 (head_dim 32, padded to
    64 for wgmma), compiled for two H100s: each layer's attention is three Mosaic GPU calls (forward, dq, dk/dv) and
    no Triton one, on each GPU's rows."""
    text, model = compiled_two_gpu_tiny_step("model.overrides.attention_implementation=pallas_gpu_mosaic",
                                             "model.overrides.dtype=bfloat16")
    assert text.count('custom_call_target="mosaic_gpu') == 3 * model.num_layers
    assert "bertjax_flash" not in text
    assert "all-gather" not in text


@needs_plugin
def test_mosaic_static_report_reads_registers_and_shared_memory_from_mosaic_gpus_dumps():
    """bench.mosaic_gpu_static compiles each Mosaic GPU kernel for sm_90a and reads ptxas's registers and spills and
    Mosaic GPU's shared memory from its dumps: at the defaults (head_dim 64, 64-row tiles, 2 stages) no kernel
    spills, and the shared memory equals what check_supported counts."""
    import jax.numpy as jnp

    from bench.mosaic_gpu_static import compile_kernel
    from bertjax.ops.mosaic_gpu_attention import shared_memory_bytes

    for kernel in ("forward", "dq", "dkv"):
        found = compile_kernel(kernel, "global", 64, 64, 2)
        assert 0 < found["registers"] <= 255 and found["spill_stores"] == found["spill_loads"] == 0, kernel
        assert found["shared"] == shared_memory_bytes(kernel, jnp.bfloat16, 64, 64, 2), kernel
        assert found["ptx"].count("wgmma.mma_async") > 0, kernel
