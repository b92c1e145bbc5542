"""Ahead-of-time compilation for a TPU v5e 2x2 slice from CPU: a tiny ModernBERT with splash attention compiles,
data-parallel, forward and backward. Skipped unless the libtpu wheel is installed (extra "tpu-aot")."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from bertjax import tpu_aot
from bertjax.config import get_config
from bertjax.models import EncoderForMaskedLM, init_params

pytestmark = pytest.mark.skipif(not tpu_aot.libtpu_available(), reason=tpu_aot.INSTALL_HINT)


def test_tiny_modernbert_forward_backward_compiles_for_v5e_2x2():
    config = get_config("modernbert-tiny", attention_implementation="pallas_tpu")
    model = EncoderForMaskedLM(config)
    batch, seq = 8, 192  # 2 rows per chip; 192 tokens span several windows (8) and pad to one 256-token tile

    def loss(params, input_ids, segment_ids):
        logits = model.apply({"params": params}, input_ids, segment_ids=segment_ids).logits
        return jnp.mean(logits.astype(jnp.float32))

    params = jax.eval_shape(lambda: init_params(model, jax.random.key(0)))
    tokens = jax.ShapeDtypeStruct((batch, seq), jnp.int32)
    mesh = tpu_aot.topology_mesh("v5e:2x2")
    assert mesh.devices.size == 4 and mesh.devices.flat[0].platform == "tpu"
    replicated, by_batch = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
    compiled = tpu_aot.aot_compile(jax.value_and_grad(loss), params, tokens, tokens, mesh=mesh,
                                   in_shardings=(replicated, by_batch, by_batch), print_memory=False)

    hlo = compiled.as_text()
    assert "tpu_custom_call" in hlo  # the splash (Mosaic) kernels are in the program
    assert f"s32[{batch // 4},{seq}]" in hlo  # each chip holds a quarter of the batch
    stats = compiled.memory_analysis()
    param_bytes = sum(np.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(params))
    # Every parameter is on every chip (TPU tiling pads small arrays, so only a lower bound is exact).
    assert stats.argument_size_in_bytes >= param_bytes + 2 * (batch // 4) * seq * 4
    assert "memory_analysis (per device)" in tpu_aot.memory_report(compiled)


def test_topology_mesh_rejects_wrong_axis_sizes():
    with pytest.raises(ValueError, match="need 8 devices"):
        tpu_aot.topology_mesh("v5e:2x2", {"data": 2, "tensor": 4})


def test_every_example_topology_has_one_device_per_chip():
    """As a TPU VM runs them (megacore on v4; libtpu's default splits a v4 chip into its two TensorCores, which
    jax.make_mesh refuses): `compile-check --topology v4:2x2x1` crashed with an AssertionError."""
    import math

    for topology in tpu_aot.EXAMPLE_TOPOLOGIES:
        chips = math.prod(int(n) for n in topology.split(":")[1].split("x"))
        assert len(tpu_aot.topology_devices(topology)) == chips, topology
    for name in ("", "v5e"):  # libtpu compiled these for its default slice, v5p:2x2x2, without a word
        with pytest.raises(ValueError, match="expected GENERATION:SHAPE"):
            tpu_aot.topology_devices(name)
    # What launch/tpu_pod.sh takes (v4/v5p types count TensorCores, two per chip): the error says the chips.
    for name, shape in (("v5p-32", "v5p:2x2x4"), ("v5litepod-8", "v5e:2x4"), ("v6e-16", "v6e:4x4")):
        with pytest.raises(ValueError, match=f"e.g. --topology {shape}$"):
            tpu_aot.topology_devices(name)
        assert len(tpu_aot.topology_devices(shape)) == math.prod(int(n) for n in shape.split(":")[1].split("x"))


def test_compile_check_compiles_for_a_v4_slice(capsys):
    from bertjax.cli import main

    assert main(["compile-check", "--config", "configs/pretrain/tiny.yaml", "--topology", "v4:2x2x1",
                 "data.global_batch_size=8", "data.seq_len=64", "tokenizer.vocab_size=512"]) == 0
    assert "fits in 32 GiB" in capsys.readouterr().out


@pytest.mark.parametrize("config, objective", [("tiny-electra.yaml", "electra"), ("tiny-albert.yaml", "mlm_sop"),
                                               ("tiny-deberta-v3.yaml", "electra")])
def test_compile_check_compiles_the_objective_step_for_v5e(config, objective, capsys):
    """`bertjax compile-check` on the shipped tiny configs: the whole sharded train step of ELECTRA (generator +
    discriminator), ALBERT (MLM + SOP) and DeBERTa-v3 (disentangled attention, GDES) compiles for a v5e 2x2 slice
    (base-size results: docs/benchmarks.md)."""
    from bertjax.cli import main

    overrides = ["model.overrides.hidden_size=64", "model.overrides.num_layers=2", "model.overrides.embedding_size=32",
                 "data.global_batch_size=8", "data.seq_len=64", "model.overrides.max_position_embeddings=64",
                 "tokenizer.vocab_size=512", "mesh.data=2", "mesh.fsdp=2"]
    assert main(["compile-check", "--config", f"configs/pretrain/{config}", "--topology", "v5e:2x2", *overrides]) == 0
    out = capsys.readouterr().out
    assert f"objective {objective}" in out and "fits in 16 GiB" in out


def test_alibi_longformer_attention_compiles_for_v5e_with_bertjax_kernel():
    """pallas_tpu's own flash kernel (ALiBi from positions, window-bounded grid, log-sum-exp merge with global keys)
    lowers through Mosaic for a real v5e: forward, dq and dk/dv kernels in one data-parallel program."""
    from bertjax import ops
    from bertjax.config import alibi_slopes

    batch, seq, heads, dim = 4, 384, 2, 64  # three 128-row tiles, a window of 128 skips the far one
    slopes = jnp.asarray(alibi_slopes(heads), jnp.float32)

    def loss(q, k, v, segment_ids, global_tokens):
        out = ops.attention(q, k, v, segment_ids=segment_ids, local_window=128, implementation="pallas_tpu",
                            alibi_slopes=slopes, global_tokens=global_tokens, max_global_tokens=2)
        return jnp.sum(out.astype(jnp.float32) ** 2)

    x = jax.ShapeDtypeStruct((batch, seq, heads, dim), jnp.bfloat16)
    mesh = tpu_aot.topology_mesh("v5e:2x2")
    by_batch = NamedSharding(mesh, P("data"))
    compiled = tpu_aot.aot_compile(jax.value_and_grad(loss, argnums=(0, 1, 2)), x, x, x,
                                   jax.ShapeDtypeStruct((batch, seq), jnp.int32),
                                   jax.ShapeDtypeStruct((batch, seq), jnp.bool_), mesh=mesh,
                                   in_shardings=(by_batch,) * 5, print_memory=False)
    hlo = compiled.as_text()
    assert hlo.count("tpu_custom_call") >= 3  # forward, dq, dk/dv
    for kernel in ("bertjax_tpu_flash_forward", "bertjax_tpu_flash_dq", "bertjax_tpu_flash_dkv"):
        assert kernel in hlo
    assert compiled.memory_analysis().temp_size_in_bytes < 64 * 2**20


def test_compile_check_names_parameters_the_mesh_cannot_split(capsys):
    """A vocabulary that tensor=4 does not divide (BERT's 30522; here 4098) keeps the word embeddings and their
    Adam moments whole on every chip: compile-check says so, naming the parameter (it used to be silent). A
    vocabulary of 4096 splits, and the note compile-check prints is None for it (checked without a second compile)."""
    from bertjax.cli import main
    from bertjax.train.run_config import load_run_config
    from bertjax.train.setup import setup_run
    from bertjax.train.state import unsplit_parameters_note

    config = "configs/pretrain/tiny.yaml"
    overrides = ["data.global_batch_size=8", "data.seq_len=64", "model.overrides.hidden_size=128",
                 "model.overrides.num_heads=4", "model.overrides.num_layers=1", "model.overrides.intermediate_size=256",
                 "mesh.data=1", "mesh.fsdp=1", "mesh.tensor=4"]
    assert main(["compile-check", "--config", config, "--topology", "v5e:2x2", *overrides,
                 "tokenizer.vocab_size=4098"]) == 0
    out = capsys.readouterr().out
    assert ("warning: mesh {'data': 1, 'fsdp': 1, 'tensor': 4}: 1 parameter(s) stay whole on every chip" in out
            and "embeddings/word_embeddings/embedding (2.0 MiB; vocab 4098 over tensor=4)" in out), out
    divisible = load_run_config(config, [*overrides, "tokenizer.vocab_size=4096"])
    setup = setup_run(divisible, vocab_size=4096, pad_id=0, devices=tpu_aot.topology_devices("v5e:2x2"),
                      attention_platform="tpu", compile_only=True)
    assert unsplit_parameters_note(setup.objective.init_params, setup.mesh) is None
