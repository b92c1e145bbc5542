"""DeBERTa-v3 pretraining: replaced-token detection with gradient-disentangled embedding sharing (GDES).

The discriminator embeds with stop_gradient(generator's table) + its own zero-initialised residual, so the RTD loss
trains the residual only and the shared table learns from the generator's MLM loss alone. Checked on the
deberta-v3-tiny preset (disentangled attention in both models) by differentiating each loss term separately. The
sharded step on 8 fake CPU devices against one device: tests/test_train_sharding.py, in its shared subprocess.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.config import get_config
from bertjax.train.objectives.base import model_inputs
from bertjax.train.objectives.electra import replace_at, sample_replacements
from bertjax.train.run_config import load_run_config
from test_train_objectives import objective_for, tiny_batch

DEBERTA = get_config("deberta-v3-tiny", vocab_size=50)


@pytest.fixture(scope="module")
def gdes():
    """Everything the GDES tests read, from one compiled program (compiles dominate these tests)."""
    objective = objective_for("electra", DEBERTA, embedding_sharing="gdes", generator_size=1.0,
                              generator_depth=0.5, rtd_weight=50.0)
    params = nn.meta.unbox(jax.jit(objective.init_params)(jax.random.key(0)))  # one compile, not op by op
    # A trained-looking residual: at zero every check below would pass for a discriminator that ignored it.
    residual = params["discriminator"]["embeddings"]["word_embeddings"]["embedding"]
    assert not np.any(np.asarray(residual))  # zero-initialised, as the released code
    params["discriminator"]["embeddings"]["word_embeddings"]["embedding"] = 0.02 * jax.random.normal(
        jax.random.key(7), residual.shape)
    batch = tiny_batch(DEBERTA)
    key = jax.random.key(0)

    def sums(p):  # (RTD sum, MLM sum, the objective's loss)
        out = objective.loss_sums(p, {}, batch, key, deterministic=True)
        return out["rtd_loss"], out["mlm_loss"], objective.loss(out, objective.normalisers(batch))

    def reference_rtd(p):
        """The RTD sum of the exported discriminator (an ordinary model, effective table = generator table +
        residual) on the objective's corrupted input, rebuilt from the objective's pieces with the same key."""
        gen_model, gen_tree = objective.exports(p)["generator"]
        model, exported = objective.exports(p)["discriminator"]
        _, sample_key, _ = jax.random.split(key, 3)
        gen_logits = gen_model.apply({"params": gen_tree}, **model_inputs(objective.generator_config, batch),
                                     masked_positions=batch["masked_positions"]).logits
        used = batch["masked_weights"] > 0
        corrupted = replace_at(batch["input_ids"], batch["masked_positions"], used,
                               sample_replacements(sample_key, gen_logits, 1.0))
        original = replace_at(batch["input_ids"], batch["masked_positions"], used, batch["masked_ids"])
        real = batch["segment_ids"] > 0
        labels = ((corrupted != original) & real).astype(jnp.float32)

        def rtd(table):
            tree = {**exported, "embeddings": {**exported["embeddings"], "word_embeddings": {"embedding": table}}}
            z = model.apply({"params": tree}, **model_inputs(DEBERTA, batch, corrupted)).logits
            z = z.astype(jnp.float32)
            bce = jnp.maximum(z, 0) - z * labels + jnp.log1p(jnp.exp(-jnp.abs(z)))
            return jnp.sum(bce * real), z

        table = exported["embeddings"]["word_embeddings"]["embedding"]
        (_, logits), table_grad = jax.value_and_grad(rtd, has_aux=True)(table)
        return {"exported_word": table, "logits": logits, "table_grad": table_grad}

    def run(p):
        values, pullback = jax.vjp(sums, p)
        one_hot = lambda i: tuple(jnp.ones_like(v) if j == i else jnp.zeros_like(v) for j, v in enumerate(values))
        grads = {name: pullback(one_hot(i))[0] for i, name in enumerate(("rtd", "mlm", "total"))}
        return grads, reference_rtd(p)

    grads, reference = jax.jit(run)(params)
    return objective, params, batch, grads, reference


def _word(tree):
    return np.asarray(tree["embeddings"]["word_embeddings"]["embedding"])


def test_gdes_models_and_exported_discriminator(gdes):
    objective, params, batch, _, reference = gdes
    assert objective.generator_config.num_layers == DEBERTA.num_layers // 2  # half the depth, same width
    assert objective.generator_config.hidden_size == DEBERTA.hidden_size
    assert objective.generator_config.attention_kind == "disentangled"
    # The generator owns the full table; the discriminator a residual of the same shape (no position table:
    # DeBERTa-v3 has no absolute positions, and no token types).
    assert _word(params["generator"]).shape == _word(params["discriminator"]).shape
    assert set(params["discriminator"]["embeddings"]) == set(params["generator"]["embeddings"])
    np.testing.assert_allclose(reference["exported_word"], _word(params["generator"]) + _word(params["discriminator"]),
                               rtol=0, atol=1e-7)
    # The embedding norm is each model's own (not shared).
    exported = objective.exports(params)["discriminator"][1]
    norm = lambda tree: np.asarray(tree["embeddings"]["norm"]["scale"])
    np.testing.assert_array_equal(norm(exported), norm(params["discriminator"]))
    # The exported discriminator is an ordinary DeBERTa RTD model: one logit per token.
    assert reference["logits"].shape == batch["input_ids"].shape and np.isfinite(reference["logits"]).all()


def test_gdes_shared_embedding_gets_no_discriminator_gradient(gdes):
    grads = gdes[3]
    # The RTD loss reaches the discriminator's residual, never the generator's table (nor any generator leaf:
    # the samples are drawn under stop-gradient too).
    assert np.abs(_word(grads["rtd"]["discriminator"])).sum() > 0
    assert not np.any(_word(grads["rtd"]["generator"]))
    assert all(not np.any(np.asarray(g)) for g in jax.tree.leaves(grads["rtd"]["generator"]))
    # The MLM loss trains the generator's table and nothing of the discriminator.
    assert np.abs(_word(grads["mlm"]["generator"])).sum() > 0
    assert all(not np.any(np.asarray(g)) for g in jax.tree.leaves(grads["mlm"]["discriminator"]))
    # So in the full loss (MLM mean + 50 x RTD mean) the shared table's gradient is the MLM term's alone.
    np.testing.assert_allclose(_word(grads["total"]["generator"]), _word(grads["mlm"]["generator"]) / 11.0,
                               rtol=1e-4, atol=1e-8)  # tiny_batch: 11 used prediction slots


def test_gdes_residual_gradient_is_the_discriminator_table_gradient(gdes):
    """d RTD / d residual equals the gradient of the same discriminator loss with respect to its effective table
    (generator table + residual) taken on the exported model: the stop-gradient only cuts the generator's path."""
    grads, reference = gdes[3], gdes[4]
    np.testing.assert_allclose(_word(grads["rtd"]["discriminator"]), reference["table_grad"], rtol=1e-4, atol=1e-7)


def test_deberta_v3_configs_build_the_gdes_objective():
    base = load_run_config("configs/pretrain/deberta-v3-base.yaml")
    tiny = load_run_config("configs/pretrain/tiny-deberta-v3.yaml")
    for config in (base, tiny):
        assert config.objective.name == "electra" and config.objective.embedding_sharing == "gdes"
        assert config.objective.generator_depth == 0.5 and config.objective.rtd_weight == 50.0
        assert config.model.preset == "deberta-v3-base"
    assert base.data.seq_len == 512 and base.data.global_batch_size == 8192
