"""ELECTRA checkpoints: ElectraModel, ElectraForMaskedLM (the generator), ElectraForPreTraining (the discriminator).

ELECTRA is BERT's layer stack with three differences that matter for interop: embeddings of width
`embedding_size` followed by `embeddings_project` (E -> H) when E != H, no pooler, and its own heads. The
generator's MLM transform always applies the exact GELU whatever `hidden_act` says; the discriminator's
prediction head applies `hidden_act`. An ELECTRA config has every key BERT has, so export must name ELECTRA from
the model's family, never by trying BERT first.
"""

from __future__ import annotations

from bertjax.config import EncoderConfig
from bertjax.hf.bert import bert_layer
from bertjax.hf.config_common import ACTIVATION_TO_HF, ConfigReader, Refusals
from bertjax.hf.family import HfFamily
from bertjax.hf.task_heads import HeadKeys, TaskHeads, architectures, bert_like_keys
from bertjax.hf.mapping import KeyMapping, TensorRule, embedding, layer_norm, linear, mlm_decoder

MODEL_TYPE = "electra"

# transformers' ElectraConfig defaults (they describe electra-small), so a trimmed config.json means the same.
DEFAULTS = {"vocab_size": 30522, "embedding_size": 128, "hidden_size": 256, "num_hidden_layers": 12,
            "num_attention_heads": 4, "intermediate_size": 1024, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
            "max_position_embeddings": 512, "type_vocab_size": 2, "initializer_range": 0.02,
            "layer_norm_eps": 1e-12, "pad_token_id": 0, "tie_word_embeddings": True}


def to_encoder_config(values: dict, head: str) -> EncoderConfig:
    read = ConfigReader(values, DEFAULTS)
    read.expect("is_decoder", (False,))
    read.expect("add_cross_attention", (False,))
    read.expect("position_embedding_type", ("absolute",))  # older files carry it; relative kinds are refused
    if head == "multiple_choice":  # ElectraSequenceSummary: bertjax builds its default (first token, proj, gelu)
        read.expect("summary_type", ("first",))
        read.expect("summary_use_proj", (True,))
        read.expect("summary_activation", ("gelu",))
        read.expect("summary_proj_to_labels", (False,))
    return EncoderConfig(
        family=MODEL_TYPE,
        vocab_size=read("vocab_size"), hidden_size=read("hidden_size"), num_layers=read("num_hidden_layers"),
        num_heads=read("num_attention_heads"), intermediate_size=read("intermediate_size"),
        embedding_size=read("embedding_size"), max_position_embeddings=read("max_position_embeddings"),
        type_vocab_size=read("type_vocab_size"), position_embedding="learned", position_offset=0,
        norm="layernorm", norm_eps=float(read("layer_norm_eps")), norm_bias=True, norm_placement="post",
        embedding_norm=True, final_norm=False, attention_bias=True, mlp_bias=True,
        activation=read.activation("hidden_act"), mlp="dense", global_attention_every=1,
        tie_word_embeddings=read("tie_word_embeddings"), decoder_bias=True, head_dense_bias=True,
        head_activation="gelu", mlm_head_transform=True, pooler=False, pad_token_id=read("pad_token_id"),
        # bertjax has one dropout rate (no attention-probability dropout); dropout never changes inference.
        dropout_rate=float(read("hidden_dropout_prob")), initializer_range=float(read("initializer_range")))


def to_hf_config(config: EncoderConfig, head: str) -> dict:
    cfg = config
    refuse = Refusals(cfg, MODEL_TYPE)
    refuse.common(factorised_embedding=True)
    refuse.check(cfg.type_vocab_size >= 1, "type_vocab_size=0 (ELECTRA always has token types)")
    refuse.need(norm_bias=True, norm_placement="post", embedding_norm=True, final_norm=False,
                position_embedding="learned", position_offset=0, attention_bias=True, mlp_bias=True, mlp="dense",
                global_attention_every=1, pooler=False, head_dense_bias=True, decoder_bias=True,
                head_activation="gelu")
    refuse.raise_if_any()
    return {
        "model_type": MODEL_TYPE, "vocab_size": cfg.vocab_size, "embedding_size": cfg.embed_dim,
        "hidden_size": cfg.hidden_size, "num_hidden_layers": cfg.num_layers, "num_attention_heads": cfg.num_heads,
        "intermediate_size": cfg.intermediate_size, "hidden_act": ACTIVATION_TO_HF[cfg.activation],
        "hidden_dropout_prob": cfg.dropout_rate, "attention_probs_dropout_prob": 0.0,
        "max_position_embeddings": cfg.max_position_embeddings, "type_vocab_size": cfg.type_vocab_size,
        "initializer_range": cfg.initializer_range, "layer_norm_eps": cfg.norm_eps, "pad_token_id": cfg.pad_token_id,
        "tie_word_embeddings": cfg.tie_word_embeddings, "is_decoder": False, "add_cross_attention": False,
    }


def key_mapping(cfg: EncoderConfig, head: str) -> KeyMapping:
    """ElectraModel's tensors carry no prefix; inside the head classes the backbone is `electra.`."""
    e, h = cfg.embed_dim, cfg.hidden_size
    base = "" if head == "encoder" else "electra."
    emb = f"{base}embeddings."
    rules: list[TensorRule] = [
        *embedding(f"{emb}word_embeddings", ("embeddings", "word_embeddings"), cfg.vocab_size, e),
        *embedding(f"{emb}position_embeddings", ("embeddings", "position_embeddings"), cfg.max_position_embeddings,
                   e),
        *embedding(f"{emb}token_type_embeddings", ("embeddings", "token_type_embeddings"), cfg.type_vocab_size, e),
        *layer_norm(f"{emb}LayerNorm", ("embeddings", "norm"), e, bias=True),
    ]
    if e != h:
        rules += linear(f"{base}embeddings_project", ("embeddings", "projection"), e, h, bias=True)
    for i in range(cfg.num_layers):
        rules += bert_layer(f"{base}encoder.layer.{i}.", ("encoder", f"layers_{i}"), cfg)
    ignored = {f"{emb}position_ids", f"{emb}token_type_ids"}  # buffers older transformers versions saved
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
    to_encoder_config=to_encoder_config,
    to_hf_config=to_hf_config,
    key_mapping=key_mapping,
    task_heads=_TASK_HEADS,
)
