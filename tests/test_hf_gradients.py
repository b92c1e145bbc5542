"""Loss and gradient parity with transformers (PyTorch, CPU): training through bertjax matches training there.

The forward tests (test_hf_parity.py and the family files) cannot see a backward-only bug: a wrong custom VJP, a
parameter that is read but gets no gradient, or a tied or shared tensor whose contributions are not summed. Each
case builds a tiny transformers model with every parameter perturbed (biases and norm scales too), loads it with
`bertjax.from_pretrained`, and compares the float32 loss and the gradient of every tensor, dropout off in both.
bertjax's gradient tree is given transformers' tensor names by bertjax's own export (`save_pretrained` applied
to the gradients), so the name and layout mapping under test is the one a user's fine-tuned model is written with.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import bertjax
from bertjax.hf import weights

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_hf_parity import TINY, VOCAB, perturb_  # noqa: E402

LOSS_ATOL = 1e-5
GRAD_RTOL = 1e-5  # per tensor: max |bertjax - transformers| / max |transformers|
IGNORE = -100  # transformers' label for positions without a loss
# One batch shape for every case, longer than the Longformer and ModernBERT local windows so that they mask.
LENGTHS, SEQ = (16, 11, 5), 16
LABELLED_FRACTION = 0.4  # of the real tokens, for MLM; the rest and all padding are IGNORE

# Tensors whose true gradient is exactly 0 (pattern: why), skipped by the relative comparison: torch returns
# rounding noise for them, and noise over noise is meaningless. Both libraries must give at most NOISE times the
# model's largest gradient instead (measured: noise <= 3e-11 of it, the smallest real tensor gradient >= 7e-7).
NOISE = 1e-9
ZERO_GRADIENT = {
    # A key bias adds q.b to every score of a query's row, and softmax is invariant to that shift.
    r"attention\.(self\.)?key(_global)?\.bias$": "softmax shift invariance",
    # Replaces the query stream's input only in two-stream pretraining calls (target_mapping); not read here.
    r"^transformer\.mask_emb$": "XLNet two-stream pretraining only",
}


def bert(**overrides):
    return transformers.BertConfig(**TINY, num_hidden_layers=2, intermediate_size=48, max_position_embeddings=32,
                                   attn_implementation="eager", **overrides)


def albert(**overrides):
    # 3 layers, 1 group: one set of layer weights runs 3 times, so its gradient is the sum of 3 contributions.
    return transformers.AlbertConfig(**TINY, embedding_size=16, num_hidden_layers=3, intermediate_size=48,
                                     max_position_embeddings=32, attn_implementation="eager", **overrides)


def deberta_v3(**overrides):
    return transformers.DebertaV2Config(**TINY, num_hidden_layers=2, intermediate_size=48, max_position_embeddings=32,
                                        relative_attention=True, position_buckets=8, max_relative_positions=20,
                                        pos_att_type="p2c|c2p", share_att_key=True, norm_rel_ebd="layer_norm",
                                        position_biased_input=False, type_vocab_size=0, **overrides)


def xlnet(**overrides):
    return transformers.XLNetConfig(vocab_size=VOCAB, d_model=32, n_layer=2, n_head=4, d_inner=48,
                                    ff_activation="gelu", pad_token_id=5, **overrides)


def longformer(**overrides):
    return transformers.LongformerConfig(**TINY, num_hidden_layers=2, intermediate_size=48,
                                         max_position_embeddings=SEQ + 18, type_vocab_size=1, layer_norm_eps=1e-5,
                                         pad_token_id=1, attention_window=[4, 8], attn_implementation="eager",
                                         **overrides)


def modernbert(**overrides):
    # Layers 0 and 2 global, layer 1 local (window 8 < SEQ).
    return transformers.ModernBertConfig(**TINY, num_hidden_layers=3, intermediate_size=48,
                                         global_attn_every_n_layers=2, local_attention=8, max_position_embeddings=64,
                                         pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1,
                                         sep_token_id=2, attn_implementation="sdpa", **overrides)


def eurobert(**overrides):
    # Grouped-query attention: 4 query heads share 2 key/value heads.
    return transformers.EuroBertConfig(**TINY, num_hidden_layers=2, num_key_value_heads=2, head_dim=12,
                                       intermediate_size=40, max_position_embeddings=64,
                                       rope_parameters={"rope_type": "default", "rope_theta": 500.0},
                                       pad_token_id=0, bos_token_id=1, eos_token_id=2, mask_token_id=3,
                                       attn_implementation="eager", **overrides)


# Longformer global tokens, on real tokens only, so that the *_global projections get gradients.
GLOBAL_TOKENS = np.zeros((len(LENGTHS), SEQ), np.int64)
GLOBAL_TOKENS[0, [0, 9]] = GLOBAL_TOKENS[1, 3] = GLOBAL_TOKENS[2, 4] = 1

# id: (transformers class, config factory, padding side, with token types, extra inputs to both libraries)
CASES = {
    "bert-mlm": ("BertForMaskedLM", bert, "right", True, {}),  # tied decoder: two uses of the word embeddings
    "albert-mlm": ("AlbertForMaskedLM", albert, "right", True, {}),
    "deberta-v3-mlm": ("DebertaV2ForMaskedLM", deberta_v3, "right", False, {}),
    "xlnet-mlm": ("XLNetLMHeadModel", xlnet, "left", True, {}),  # XLNet's tokenizer pads on the left
    "longformer-mlm": ("LongformerForMaskedLM", longformer, "right", False, {"global_attention_mask": GLOBAL_TOKENS}),
    "modernbert-mlm": ("ModernBertForMaskedLM", modernbert, "right", False, {}),
    "eurobert-mlm": ("EuroBertForMaskedLM", eurobert, "right", False, {}),
    "deberta-v3-classification": ("DebertaV2ForSequenceClassification", lambda: deberta_v3(num_labels=3), "right",
                                  False, {}),
}


def padded_batch(pad_id: int, side: str, token_types: bool) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    positions, lengths = np.arange(SEQ)[None, :], np.asarray(LENGTHS)[:, None]
    mask = (positions < lengths if side == "right" else positions >= SEQ - lengths).astype(np.int64)
    ids = np.where(mask == 1, rng.integers(6, VOCAB, mask.shape), pad_id)  # above every config's special ids
    inputs = {"input_ids": ids, "attention_mask": mask}
    if token_types:
        inputs["token_type_ids"] = rng.integers(0, 2, mask.shape) * mask
    return inputs


def random_labels(num_labels: int | None, mask: np.ndarray) -> np.ndarray:
    """Sequence labels in [0, num_labels), or MLM labels (num_labels None) on a subset of the real tokens."""
    rng = np.random.default_rng(1)
    if num_labels is not None:
        return rng.integers(0, num_labels, len(mask))
    labelled = (rng.random(mask.shape) < LABELLED_FRACTION) & (mask == 1)
    return np.where(labelled, rng.integers(0, VOCAB, mask.shape), IGNORE)


def reference_case(case_id: str, directory):
    """The perturbed transformers model (also saved to `directory`), its inputs and labels."""
    class_name, make_config, side, token_types, extra = CASES[case_id]
    torch.manual_seed(0)
    model = getattr(transformers, class_name)(make_config()).eval()
    perturb_(model, seed=1)
    model.save_pretrained(directory)
    inputs = {**padded_batch(model.config.pad_token_id, side, token_types), **extra}
    num_labels = model.config.num_labels if "SequenceClassification" in class_name else None
    return model, inputs, random_labels(num_labels, inputs["attention_mask"])


def transformers_loss_and_grads(model, inputs, labels) -> tuple[float, dict[str, np.ndarray]]:
    """Gradient of every parameter by transformers name; zeros where torch gives none (not in the graph)."""
    loss = model(**{k: torch.tensor(v) for k, v in inputs.items()}, labels=torch.tensor(labels)).loss
    loss.backward()
    grads = {name: (np.zeros(tuple(p.shape), np.float32) if p.grad is None else p.grad.numpy())
             for name, p in model.named_parameters()}
    return loss.item(), grads


def cross_entropy(logits, labels):
    """transformers' CrossEntropyLoss(ignore_index=-100): the mean over labelled positions."""
    labelled = labels != IGNORE
    per_position = optax.softmax_cross_entropy_with_integer_labels(logits, jnp.where(labelled, labels, 0))
    return jnp.sum(jnp.where(labelled, per_position, 0.0)) / jnp.sum(labelled)


def bertjax_loss_and_grads(directory, inputs, labels, grads_dir) -> tuple[float, dict[str, np.ndarray]]:
    model, params = bertjax.from_pretrained(str(directory), dtype=jnp.float32)
    kwargs = {k: jnp.asarray(v) for k, v in inputs.items()}
    ids = kwargs.pop("input_ids")

    def loss(p):
        logits = model.apply({"params": p}, ids, deterministic=True, **kwargs).logits  # dropout off, as .eval()
        return cross_entropy(logits, jnp.asarray(labels))

    value, grads = jax.jit(jax.value_and_grad(loss))(params)  # one compile, not one per op
    bertjax.save_pretrained(str(grads_dir), model, grads)  # gradients under transformers' names and layouts
    return float(value), weights.read_safetensors(str(grads_dir / weights.SAFETENSORS))


def zero_gradient_reason(name: str) -> str | None:
    return next((why for pattern, why in ZERO_GRADIENT.items() if re.search(pattern, name)), None)


def peak(x: np.ndarray) -> float:
    return float(np.abs(x).max())


@pytest.mark.parametrize("case_id", list(CASES))
def test_loss_and_gradients_match_transformers(case_id, tmp_path):
    model, inputs, labels = reference_case(case_id, tmp_path / "hf")
    expected_loss, expected = transformers_loss_and_grads(model, inputs, labels)
    loss, grads = bertjax_loss_and_grads(tmp_path / "hf", inputs, labels, tmp_path / "grads")
    assert abs(loss - expected_loss) <= LOSS_ATOL, (loss, expected_loss)

    # The export names every parameter transformers has (a tied decoder weight is one parameter in both), so
    # every tensor is either compared or a documented zero-gradient exclusion.
    assert set(grads) == set(expected)
    noise = NOISE * max(peak(g) for g in expected.values())
    excluded = {name: why for name in expected if (why := zero_gradient_reason(name))}
    not_zero = {name: (why, peak(expected[name]), peak(grads[name])) for name, why in excluded.items()
                if max(peak(expected[name]), peak(grads[name])) > noise}
    assert not not_zero, f"gradients that should be 0 (why, transformers, bertjax max abs): {not_zero}"

    compared = set(expected) - set(excluded)
    vanishing = sorted(name for name in compared if peak(expected[name]) <= noise)
    assert not vanishing, f"zero gradient in transformers, not a documented exclusion: {vanishing}"
    errors = {name: peak(grads[name] - expected[name]) / peak(expected[name]) for name in compared}
    worst = {name: f"{error:.1e}" for name, error in errors.items() if error > GRAD_RTOL}
    assert not worst, f"relative gradient error above {GRAD_RTOL}: {worst}"
