"""Family members without a published-checkpoint mapping yet still build from the one config and train."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bertjax
from bertjax.models import abstract_params

VARIANTS = {
    "albert": dict(embedding_size=16, num_layer_groups=1, activation="gelu_tanh", num_layers=3),
    "distilbert": dict(type_vocab_size=0, pooler=False),
    "eurobert": dict(norm="rmsnorm", norm_bias=False, norm_placement="pre", embedding_norm=False, final_norm=True,
                     attention_bias=False, mlp_bias=False, mlp="glu", activation="silu", position_embedding="rope",
                     num_kv_heads=2, type_vocab_size=0, head_dense_bias=False),
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_variant_forward_and_gradient(name):
    config = bertjax.get_config("bert-tiny", **VARIANTS[name])
    model = bertjax.EncoderForMaskedLM(config)
    ids = jnp.asarray(np.random.default_rng(0).integers(1, config.vocab_size, (2, 12)), jnp.int32)
    mask = jnp.asarray([[1] * 12, [1] * 7 + [0] * 5])

    def loss(p):
        logits = model.apply({"params": p}, ids, attention_mask=mask).logits
        return -jnp.mean(jax.nn.log_softmax(logits)[..., 3])

    # initialisation, forward and gradient as one compiled program, not hundreds of eager ops
    value, grads = jax.jit(lambda key: jax.value_and_grad(loss)(bertjax.init_params(model, key)))(jax.random.key(0))
    assert np.isfinite(value)
    assert all(np.isfinite(g).all() for g in jax.tree.leaves(grads))
    assert any(float(jnp.abs(g).max()) > 0 for g in jax.tree.leaves(grads))


def test_albert_shares_one_layer_and_factorises_embeddings():
    config = bertjax.get_config("bert-tiny", **VARIANTS["albert"])
    params = abstract_params(bertjax.EncoderForMaskedLM(config))  # shapes only: nothing computed
    assert [k for k in params["encoder"] if k.startswith("layers_")] == ["layers_0"]
    assert params["embeddings"]["word_embeddings"]["embedding"].shape == (config.vocab_size, 16)
    assert params["embeddings"]["projection"]["kernel"].shape == (16, config.hidden_size)


def test_gqa_has_fewer_key_value_heads():
    config = bertjax.get_config("bert-tiny", **VARIANTS["eurobert"])
    attention = abstract_params(bertjax.EncoderModel(config))["encoder"]["layers_0"]["attention"]
    assert attention["query"]["kernel"].shape == (32, 4, 8)
    assert attention["key"]["kernel"].shape == (32, 2, 8)
