"""Fine-tuning heads: per-segment pooling, a sequence head and a token head, shared by every family.

Every family's classification head is the same computation under different names: pool the token states, then
dense -> activation -> (ModernBERT: norm) -> dropout -> linear; the dropouts sit where the family's transformers heads
have theirs (HEAD_DROPOUTS). BERT/ALBERT call the dense layer their pooler,
RoBERTa/ELECTRA a classification head, DistilBERT `pre_classifier`, ModernBERT `head`; the Hugging Face key
mappings (bertjax/hf/task_heads.py) name them. The knobs are EncoderConfig's classifier_* fields and
EncoderConfig.task (labels, dropout, pooling).

Pooling is per segment (bertjax/models/pooling.py), so a packed row yields one prediction per example.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.config import EncoderConfig
from bertjax.models.common import ACTIVATIONS, dense, norm
from bertjax.models.pooling import pool_segments, segment_membership


def _transform(cfg: EncoderConfig, x: jax.Array) -> jax.Array:
    """dense -> classifier_activation -> [norm]; called inside a head's compact method, so parameters are the
    head's children `dense` and `norm`."""
    x = dense(cfg, cfg.hidden_size, ("embed", "mlp"), use_bias=cfg.head_dense_bias, name="dense")(x)
    x = ACTIVATIONS[cfg.classifier_activation](x)
    if cfg.classifier_norm:
        x = norm(cfg, "norm")(x)
    return x


@dataclasses.dataclass(frozen=True)
class HeadDropouts:
    """Where a family's transformers heads apply dropout, and at which rate, so that fine-tuning is regularised as
    it is there: "classifier" (task.classifier_dropout, else the encoder's dropout_rate: the family's classifier
    dropout key), "hidden" (the encoder's dropout_rate) or None (no dropout). Sequence heads (classification,
    multiple choice) have a dropout before the pooled dense layer and one before the output layer; per-token heads
    (token classification, question answering) one before the output layer."""

    sequence: tuple[str | None, str | None] = (None, "classifier")
    multiple_choice: tuple[str | None, str | None] = (None, "classifier")
    token: str | None = "classifier"
    question: str | None = None  # BertForQuestionAnswering and most others: qa_outputs on the hidden states


# By EncoderConfig.family; BERT's (ALBERT's, MosaicBERT's) otherwise. Read off each family's modeling file.
HEAD_DROPOUTS = {
    # RobertaClassificationHead: dropout -> dense -> tanh -> dropout -> out_proj; multiple choice on the pooler
    # with hidden_dropout_prob.
    "roberta": HeadDropouts(sequence=("classifier", "classifier"), multiple_choice=(None, "hidden")),
    "longformer": HeadDropouts(sequence=("hidden", "hidden"), multiple_choice=(None, "hidden"), token="hidden"),
    # ElectraClassificationHead as RoBERTa's; multiple choice through SequenceSummary, whose summary_last_dropout
    # (0.1, bertjax builds the default summary) is the default hidden rate.
    "electra": HeadDropouts(sequence=("classifier", "classifier"), multiple_choice=(None, "hidden")),
    # Token classification with `dropout`, question answering with qa_dropout (both 0.1 by default).
    "distilbert": HeadDropouts(token="hidden", question="hidden"),
    # ContextPooler's pooler_dropout is 0 by default; token classification uses hidden_dropout_prob, not cls_dropout.
    "deberta": HeadDropouts(token="hidden"),
    "deberta-v2": HeadDropouts(token="hidden"),
    # The summary drops out before its dense layer only when config.json sets summary_first_dropout (not modelled:
    # published configs have none); no token-head dropout.
    "xlnet": HeadDropouts(token=None),
    "modernbert": HeadDropouts(question="classifier"),  # classifier_dropout before every head's classifier
    "eurobert": HeadDropouts(sequence=(None, None), token=None),  # no dropout in its heads
}


def head_dropouts(cfg: EncoderConfig) -> HeadDropouts:
    return HEAD_DROPOUTS.get(cfg.family, HeadDropouts())


def _rate(cfg: EncoderConfig, which: str | None) -> float:
    if which is None:
        return 0.0
    rate = cfg.task_or_default.classifier_dropout if which == "classifier" else None
    return cfg.dropout_rate if rate is None else rate


def _dropout(cfg: EncoderConfig, which: str | None, x: jax.Array, deterministic: bool) -> jax.Array:
    rate = _rate(cfg, which)
    return nn.Dropout(rate)(x, deterministic=deterministic) if rate > 0.0 else x


def _out(cfg: EncoderConfig, x: jax.Array, num_outputs: int, dropout: str | None,
         deterministic: bool) -> jax.Array:
    x = _dropout(cfg, dropout, x, deterministic)
    logits = dense(cfg, num_outputs, ("mlp", "classes"), use_bias=True, name="out")(x)
    return logits.astype(jnp.float32)


class SequenceHead(nn.Module):
    """One prediction per segment: pool -> [dropout] -> dense -> activation -> [norm] -> [dropout] -> out (the
    dropouts the family's head has: HEAD_DROPOUTS; `multiple_choice` picks that head's).

    Returns (logits [batch, K, num_outputs] float32, segment_mask [batch, K]); empty slots hold zeros.
    "late" pooling (EuroBERT) runs the head on every token and averages the logits over the segment instead.
    """

    config: EncoderConfig
    num_outputs: int
    multiple_choice: bool = False

    @nn.compact
    def __call__(self, hidden: jax.Array, segment_ids: jax.Array, max_segments: int | None = None,
                 deterministic: bool = True) -> tuple[jax.Array, jax.Array]:
        cfg = self.config
        dropouts = head_dropouts(cfg)
        before, after = dropouts.multiple_choice if self.multiple_choice else dropouts.sequence

        def head(x):
            return _out(cfg, _transform(cfg, _dropout(cfg, before, x, deterministic)), self.num_outputs, after,
                        deterministic)

        pooling = cfg.classifier_pooling
        member = segment_membership(segment_ids, max_segments)
        if pooling == "late":
            logits = pool_segments(head(hidden), member, "mean")
        else:
            logits = head(pool_segments(hidden, member, pooling))
        segment_mask = jnp.any(member, axis=1)
        return jnp.where(segment_mask[..., None], logits, 0.0), segment_mask


class TokenHead(nn.Module):
    """One prediction per token: [dense -> activation -> norm (ModernBERT)] -> [dropout] -> out (the dropout the
    family's token-classification head has, or with `question_answering` its QA head's: HEAD_DROPOUTS)."""

    config: EncoderConfig
    num_outputs: int
    question_answering: bool = False

    @nn.compact
    def __call__(self, hidden: jax.Array, deterministic: bool = True) -> jax.Array:
        cfg = self.config
        if cfg.classifier_token_transform:
            hidden = _transform(cfg, hidden)
        dropouts = head_dropouts(cfg)
        return _out(cfg, hidden, self.num_outputs, dropouts.question if self.question_answering else dropouts.token,
                    deterministic)
