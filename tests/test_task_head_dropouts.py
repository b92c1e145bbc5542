"""Fine-tuning heads drop out where the family's transformers head does (bertjax.models.task_heads.HEAD_DROPOUTS).

The reference is transformers itself: with every dropout of the config at 0 but the family's classifier dropout
key at 0.5, a head whose transformers class applies that key changes between train and eval mode, and one that has
no dropout there (BERT's QA head, XLNet's token head), or uses the encoder's rate instead (DeBERTa's token head,
Longformer's heads), does not. bertjax's head, loaded from the same directory, must behave alike. It applied the
classifier dropout before every head's output layer.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bertjax
from bertjax.hf.registry import FAMILIES

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_hf_parity import bert_config, modernbert_config, roberta_config  # noqa: E402
from test_hf_family_albert_distilbert import distilbert_config  # noqa: E402
from test_hf_task_heads import CLASS_SUFFIX, electra_config, eurobert_config, task_batch  # noqa: E402
from test_deberta import v3_config  # noqa: E402
from test_longformer import longformer_config  # noqa: E402
from test_xlnet_model import xlnet_config  # noqa: E402

# Every dropout key of these families' configs: all 0, then the family's classifier key 0.5.
DROPOUT_KEYS = ("hidden_dropout_prob", "attention_probs_dropout_prob", "dropout", "attention_dropout", "qa_dropout",
                "seq_classif_dropout", "classifier_dropout", "classifier_dropout_prob", "cls_dropout",
                "pooler_dropout", "summary_last_dropout", "embedding_dropout", "mlp_dropout")

# (family case, transformers prefix, config factory, head, whether transformers' head drops out at the key)
CASES = [
    ("bert", "Bert", bert_config, "token_classification", True),
    ("bert", "Bert", bert_config, "question_answering", False),
    ("roberta", "Roberta", roberta_config, "sequence_classification", True),
    ("roberta", "Roberta", roberta_config, "multiple_choice", False),  # hidden_dropout_prob on the pooler
    ("longformer", "Longformer", longformer_config, "sequence_classification", False),
    ("distilbert", "DistilBert", distilbert_config, "token_classification", False),  # `dropout`
    ("distilbert", "DistilBert", distilbert_config, "question_answering", False),  # qa_dropout
    ("distilbert", "DistilBert", distilbert_config, "sequence_classification", True),
    ("deberta-v2", "DebertaV2", v3_config, "token_classification", False),  # hidden_dropout_prob
    ("deberta-v2", "DebertaV2", v3_config, "sequence_classification", True),
    ("electra", "Electra", electra_config, "multiple_choice", False),  # its summary's own dropout
    ("xlnet", "XLNet", xlnet_config, "token_classification", False),
    ("xlnet", "XLNet", xlnet_config, "sequence_classification", True),
    ("modernbert", "ModernBert", lambda: modernbert_config(2, 2, 8), "question_answering", True),
    ("eurobert", "EuroBert", eurobert_config, "sequence_classification", False),
]


def _changes_in_transformers(model, ids, mask, extra) -> bool:
    def run():
        with torch.no_grad():
            out = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                        **{k: torch.tensor(v) for k, v in extra.items()})
        return (out.start_logits if hasattr(out, "start_logits") else out.logits).numpy()

    model.eval()
    quiet = run()
    model.train()
    torch.manual_seed(1)
    return bool(np.abs(run() - quiet).max() > 1e-6)


@pytest.mark.parametrize("family,prefix,factory,head,drops", CASES, ids=[f"{c[0]}-{c[3]}" for c in CASES])
def test_head_dropout_is_where_transformers_has_it(family, prefix, factory, head, drops, tmp_path):
    hf_config = factory()
    for key in DROPOUT_KEYS:
        if hasattr(hf_config, key):
            setattr(hf_config, key, 0.0)
    key = FAMILIES[hf_config.model_type].task_heads.dropout_key
    if key:
        setattr(hf_config, key, 0.5)
    if head == "sequence_classification":
        hf_config.num_labels = 3
    torch.manual_seed(0)
    reference = getattr(transformers, f"{prefix}For{CLASS_SUFFIX[head]}")(hf_config)
    reference.save_pretrained(tmp_path)
    ids, mask, extra = task_batch(head, hf_config.pad_token_id or 0, prefix in ("Bert", "XLNet", "Electra"))
    if prefix == "XLNet":  # left padding, as its tokenizer pads
        ids, mask = ids[..., ::-1].copy(), mask[..., ::-1].copy()
    assert _changes_in_transformers(reference, ids, mask, extra) == drops

    model, params = bertjax.from_pretrained(str(tmp_path))
    inputs = dict(attention_mask=jnp.asarray(mask), **{k: jnp.asarray(v) for k, v in extra.items()})
    quiet = model.apply({"params": params}, jnp.asarray(ids), **inputs)
    noisy = model.apply({"params": params}, jnp.asarray(ids), deterministic=False,
                        rngs={"dropout": jax.random.key(1)}, **inputs)
    name = "start_logits" if head == "question_answering" else "logits"
    changed = float(jnp.max(jnp.abs(getattr(noisy, name) - getattr(quiet, name))))
    assert (changed > 1e-6) == drops, changed
