"""bertjax.intermediates against transformers' own `output_hidden_states` / `output_attentions` on the same
random weights, and the input-embedding gradient against a finite difference."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bertjax
from bertjax import intermediates
from test_hf_parity import bert_config, modernbert_config, padded_batch, perturb_

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

CASES = {
    "bert": lambda: transformers.BertForMaskedLM(bert_config()),
    # window 8 at seq 16: the local layer's probabilities are zero outside |i - j| <= 4
    "modernbert": lambda: transformers.ModernBertForMaskedLM(_eager(modernbert_config(3, 3, 8))),
}


def _eager(config):
    config._attn_implementation = "eager"  # the implementation that returns attention probabilities
    return config


@pytest.fixture(scope="module", params=sorted(CASES))
def pair(request, tmp_path_factory):
    torch.manual_seed(0)
    reference = CASES[request.param]().eval()
    perturb_(reference, seed=1)
    directory = tmp_path_factory.mktemp(request.param)
    reference.save_pretrained(directory)
    model, params = bertjax.from_pretrained(str(directory))
    ids, mask = padded_batch([16, 11], 16, pad_id=0, seed=2)
    with torch.no_grad():
        theirs = reference(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask), output_attentions=True,
                           output_hidden_states=True)
    return model, params, ids, mask, theirs


def test_attention_probabilities_match_transformers(pair):
    model, params, ids, mask, theirs = pair
    ours = jax.jit(lambda p: intermediates.attention_probabilities(model, p, ids, attention_mask=mask))(params)
    assert len(ours) == len(theirs.attentions) == model.config.num_layers
    real = mask.astype(bool)
    for layer, (a, b) in enumerate(zip(ours, theirs.attentions)):
        a, b = np.asarray(a), b.numpy()
        assert a.shape == b.shape
        # real queries only (transformers gives padding queries a softmax row too); padding keys carry 0 in both
        np.testing.assert_allclose(a.transpose(0, 2, 1, 3)[real], b.transpose(0, 2, 1, 3)[real], atol=1e-5,
                                   err_msg=f"layer {layer}")
        np.testing.assert_allclose(a.sum(-1).transpose(0, 2, 1)[real], 1.0, atol=1e-5)
    if model.config.local_window:  # ModernBERT layer 1 is local: nothing beyond the window
        distance = np.abs(np.arange(16)[:, None] - np.arange(16)[None, :])
        assert np.all(np.asarray(ours[1])[..., distance > model.config.local_window // 2] == 0)


def test_hidden_states_match_transformers(pair):
    model, params, ids, mask, theirs = pair
    ours = jax.jit(lambda p: intermediates.hidden_states(model, p, ids, attention_mask=mask))(params)
    assert len(ours) == len(theirs.hidden_states) == model.config.num_layers + 1
    real = mask.astype(bool)
    for a, b in zip(ours, theirs.hidden_states):
        np.testing.assert_allclose(np.asarray(a)[real], b.numpy()[real], atol=1e-4)


def test_input_embedding_gradient_is_the_derivative_and_leaves_outputs_alone(pair):
    model, params, ids, mask, _ = pair
    direction = jax.random.normal(jax.random.key(0), (*ids.shape, model.config.hidden_size))
    direction = direction * jnp.asarray(mask, jnp.float32)[..., None]
    step = 1e-3  # small against the embeddings themselves (~0.02 apart), large against float32 rounding

    @jax.jit  # the forwards, the gradient and the finite difference as one compiled program, not op by op
    def check(params):
        zeros = intermediates.input_perturbations(model, params, ids, attention_mask=mask)
        plain = model.apply({"params": params}, ids, attention_mask=mask).logits
        perturbed = model.apply({"params": params, "perturbations": zeros}, ids, attention_mask=mask).logits

        def score(perturbations):
            return model.apply({"params": params, "perturbations": perturbations}, ids,
                               attention_mask=mask).logits[0, 3, 7]

        grads = jax.grad(score)(zeros)["embeddings"]["input_embeddings"]
        shifted = lambda sign: score({"embeddings": {"input_embeddings": sign * step * direction}})
        finite_difference = (shifted(1.0) - shifted(-1.0)) / (2 * step)
        return plain, perturbed, grads, finite_difference

    plain, perturbed, grads, finite_difference = check(params)
    np.testing.assert_array_equal(np.asarray(plain), np.asarray(perturbed))
    assert grads.shape == direction.shape
    np.testing.assert_allclose(float(jnp.vdot(grads, direction)), float(finite_difference), rtol=2e-2)
    assert np.all(np.asarray(grads)[~mask.astype(bool)] == 0)  # padding cannot influence a real token


@pytest.mark.parametrize("preset", ["deberta-v3-tiny", "longformer-tiny", "xlnet-tiny"])
def test_every_family_records_hidden_states_and_only_standard_attention_its_probabilities(preset):
    """Every stack records its hidden states (the last one last_hidden_state); attention kinds other than
    "standard" record no probabilities, which is a ValueError naming the kind, not a KeyError."""
    model = bertjax.EncoderForMaskedLM(bertjax.get_config(preset))
    ids = jnp.array([[5, 10, 11, 6, 7, 8]])

    @jax.jit  # initialisation and both forwards as one compiled program, not hundreds of eager ops
    def run(key):
        params = bertjax.init_params(model, key)
        return params, intermediates.hidden_states(model, params, ids), model.apply({"params": params}, ids)

    params, states, outputs = run(jax.random.key(0))
    assert len(states) == model.config.num_layers + 1
    np.testing.assert_array_equal(np.asarray(states[-1]), np.asarray(outputs.last_hidden_state))
    with pytest.raises(ValueError, match=f"attention_kind={model.config.attention_kind!r} records no attention "
                                         "probabilities; only 'standard' attention does"):
        intermediates.attention_probabilities(model, params, ids)
