"""ELECTRA checkpoints: ElectraModel, ElectraForMaskedLM (the generator), ElectraForPreTraining (the discriminator).

ELECTRA is BERT's layer stack with three differences that matter for interop: embeddings of width
`embedding_size` followed by `embeddings_project` (E -> H) when E != H, no pooler, and its own heads. The
generator's MLM transform always applies the exact GELU whatever `hidden_act` says; the discriminator's
prediction head applies `hidden_act`. An ELECTRA config has every key BERT has, so export must name ELECTRA from
the model's family, never by trying BERT first.
"""

from __future__ import annotations

from bertjax.config import EncoderConfig
from bertjax.hf.bert import BertLikeConfig, bert_like_backbone
from bertjax.hf.family import HfFamily
from bertjax.hf.task_heads import HeadKeys, TaskHeads, architectures, bert_like_keys
from bertjax.hf.mapping import KeyMapping, layer_norm, linear, mlm_decoder

MODEL_TYPE = "electra"

# transformers' ElectraConfig defaults (they describe electra-small), so a trimmed config.json means the same.
DEFAULTS = {"vocab_size": 30522, "embedding_size": 128, "hidden_size": 256, "num_hidden_layers": 12,
            "num_attention_heads": 4, "intermediate_size": 1024, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
            "max_position_embeddings": 512, "type_vocab_size": 2, "initializer_range": 0.02,
            "layer_norm_eps": 1e-12, "pad_token_id": 0, "tie_word_embeddings": True}


# BERT's config translation with ELECTRA's embedding width and no pooler; the generator's MLM transform always
# applies the exact GELU (head_activation "gelu"), the discriminator's prediction head `hidden_act`.
_CONFIG = BertLikeConfig(MODEL_TYPE, DEFAULTS, positions_after_padding=False, head_follows_hidden_act=False,
                         factorised_embedding=True, pooler=False, sequence_summary=True)


def key_mapping(cfg: EncoderConfig, head: str) -> KeyMapping:
    """ElectraModel's tensors carry no prefix; inside the head classes the backbone is `electra.`."""
    e, h = cfg.embed_dim, cfg.hidden_size
    rules, ignored = bert_like_backbone(cfg, "" if head == "encoder" else "electra.")
    if head == "masked_lm":
        rules += linear("generator_predictions.dense", ("mlm_head", "dense"), h, e, bias=True)
        rules += layer_norm("generator_predictions.LayerNorm", ("mlm_head", "norm"), e, bias=True)
        decoder_rules, decoder_ignored = mlm_decoder("generator_lm_head", ("generator_lm_head.bias",), cfg)
        rules += decoder_rules
        ignored |= decoder_ignored
    if head == "replaced_token_detection":
        rules += linear("discriminator_predictions.dense", ("rtd_head", "dense"), h, h, bias=True)
        rules += linear("discriminator_predictions.dense_prediction", ("rtd_head", "prediction"), h, 1, bias=True)
    return KeyMapping(rules, frozenset(ignored))


# ElectraClassificationHead: dense -> exact GELU -> out_proj; multiple choice's ElectraSequenceSummary is the same
# on the first token with the default summary_* keys (checked on import).
_TASK_HEADS = TaskHeads(
    base_prefix="electra.", architectures=architectures("Electra"), activation="gelu",
    keys=bert_like_keys(HeadKeys(out="classifier.out_proj", dense="classifier.dense"),
                        HeadKeys(out="classifier", dense="sequence_summary.summary")))

FAMILY = HfFamily(
    model_type=MODEL_TYPE,
    architectures={"ElectraModel": "encoder", "ElectraForMaskedLM": "masked_lm",
                   "ElectraForPreTraining": "replaced_token_detection"},
    to_encoder_config=_CONFIG.to_encoder_config,
    to_hf_config=_CONFIG.to_hf_config,
    key_mapping=key_mapping,
    task_heads=_TASK_HEADS,
)
