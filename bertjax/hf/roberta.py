"""RoBERTa (`model_type: roberta`): BERT's layout with positions after the padding index, one token type, no NSP,
and an MLM head (`lm_head`) that always applies the exact GELU."""

from __future__ import annotations

from bertjax.hf.bert import DEFAULTS, BertLikeConfig, HeadNames, bert_like_mapping
from bertjax.hf.family import HfFamily
from bertjax.hf.task_heads import HeadKeys, TaskHeads, architectures, bert_like_keys

_CONFIG = BertLikeConfig("roberta", {**DEFAULTS, "pad_token_id": 1}, positions_after_padding=True,
                         head_follows_hidden_act=False)
_HEADS = HeadNames("lm_head.", "dense", "layer_norm", nsp=None)

# Sequence classification has its own dense layer (RobertaClassificationHead); multiple choice uses the pooler.
_TASK_HEADS = TaskHeads(
    base_prefix="roberta.", architectures=architectures("Roberta"), activation="tanh",
    keys=bert_like_keys(HeadKeys(out="classifier.out_proj", dense="classifier.dense"),
                        HeadKeys(out="classifier", dense="roberta.pooler.dense")))

FAMILY = HfFamily(
    model_type="roberta",
    architectures={"RobertaModel": "encoder", "RobertaForMaskedLM": "masked_lm"},
    to_encoder_config=_CONFIG.to_encoder_config,
    to_hf_config=_CONFIG.to_hf_config,
    key_mapping=lambda cfg, head: bert_like_mapping(cfg, head, "roberta.", _HEADS),
    task_heads=_TASK_HEADS,
)
