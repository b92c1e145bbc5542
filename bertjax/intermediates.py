"""Looking inside a model without changing it: hidden states, attention probabilities, input-embedding gradients.

The layers record what is asked for through Flax's standard collections, and record nothing otherwise (`sow` and
`perturb` are free when their collection is not passed), so the model a user trains and serves is the one they
inspect:

    states = hidden_states(model, params, input_ids)          # [embeddings, layer 1, ..., layer L]
    probs = attention_probabilities(model, params, input_ids)  # per layer, [batch, heads, seq, seq]

    # Gradient of any scalar with respect to the input embeddings (saliency):
    zeros = input_perturbations(model, params, input_ids)
    def score(perturbations):
        out = model.apply({"params": params, "perturbations": perturbations}, input_ids)
        return out.logits[0, 3, token_id]
    grads = jax.grad(score)(zeros)["embeddings"]["input_embeddings"]   # [batch, seq, embed]

The raw collections are there for anything else: `model.apply(variables, ..., mutable=["intermediates"])`
returns `(outputs, {"intermediates": ...})` with `encoder/hidden_states` and
`encoder/layers_<k>/attention/attention_probabilities`, and Flax's `capture_intermediates=True` adds the output of
every module. Hidden states are the layer stack's input and each layer's output, the last one being the model's
`last_hidden_state` (after a pre-norm model's final norm), as transformers' `hidden_states` are (XLNet's: its
content stream's; with `target_mapping` also `encoder/query_hidden_states`, the query stream's). Attention
probabilities come from the standard attention module (`attention_kind="standard"`; other kinds are a ValueError);
they cost a [seq, seq] matrix per head, so ask for them on short inputs.
"""

from __future__ import annotations

from typing import Any

import jax


def _intermediates(model, params, input_ids, **inputs) -> dict:
    _, state = model.apply({"params": params}, input_ids, mutable=["intermediates"], **inputs)
    return state["intermediates"]


def hidden_states(model, params, input_ids, **inputs) -> list[jax.Array]:
    """The embeddings' output and every layer step's output: num_layers + 1 arrays [batch, seq, hidden].

    `inputs` are the model's other arguments (attention_mask, segment_ids, ...). ALBERT's shared layers give one
    entry per step, as its depth counts them. XLNet's are its content stream's; with `target_mapping` its query
    stream's (whose last one is then last_hidden_state) are the collection's `encoder/query_hidden_states`.
    """
    return list(_intermediates(model, params, input_ids, **inputs)["encoder"]["hidden_states"])


def attention_probabilities(model, params, input_ids, **inputs) -> list[jax.Array]:
    """Each layer step's attention probabilities, float32 [batch, heads, seq, seq], in the order the stack runs.

    Local layers (ModernBERT) are zero outside their window; padding rows are zero.
    """
    config = model.config
    if config.attention_kind != "standard":
        raise ValueError(f"attention_probabilities: attention_kind={config.attention_kind!r} records no attention "
                         "probabilities; only 'standard' attention does")
    encoder = _intermediates(model, params, input_ids, **inputs)["encoder"]
    per_group = config.layers_per_group
    calls: dict[int, int] = {}
    steps = []
    for step in range(config.num_layers):  # shared layers record one entry per call: walk the stack's order
        for j in range(per_group):
            index = config.layer_group(step) * per_group + j
            recorded = encoder[f"layers_{index}"]["attention"]["attention_probabilities"]
            steps.append(recorded[calls.get(index, 0)])
            calls[index] = calls.get(index, 0) + 1
    return steps


def input_perturbations(model, params, input_ids, **inputs) -> dict[str, Any]:
    """Zeros shaped like the input embeddings, as the "perturbations" collection `model.apply` accepts.

    Passing them leaves the outputs unchanged; `jax.grad` with respect to them is the gradient with respect to the
    word embeddings of this input (`["embeddings"]["input_embeddings"]`, [batch, seq, embed]).
    """
    _, state = model.apply({"params": params}, input_ids, mutable=["perturbations"], **inputs)
    return state["perturbations"]
