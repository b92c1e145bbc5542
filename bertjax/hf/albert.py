"""ALBERT (`model_type: albert`): config translation, key mapping and refusals.

BERT's post-norm layer with a factorised embedding (tables and their LayerNorm at `embedding_size` E, then
`encoder.embedding_hidden_mapping_in` E -> H) and cross-layer sharing: `num_hidden_groups` groups of
`inner_group_num` distinct layers, step i of `num_hidden_layers` running every layer of group
int(i / (num_hidden_layers / num_hidden_groups)). The MLM head projects H -> E before the tied decoder; the
sentence-order head (`sop_classifier`) reads the pooled [CLS] state and comes out as `nsp_logits`.
"""

from __future__ import annotations

from bertjax.config import EncoderConfig
from bertjax.hf.config_common import ACTIVATION_TO_HF, ConfigReader, Refusals
from bertjax.hf.family import HfFamily
from bertjax.hf.task_heads import HeadKeys, TaskHeads, architectures, bert_like_keys
from bertjax.hf.mapping import (KeyMapping, ParamPath, TensorRule, attention_output, attention_projection, embedding,
                                layer_norm, linear, mlm_decoder)

DEFAULTS = {"embedding_size": 128, "num_hidden_groups": 1, "inner_group_num": 1, "hidden_act": "gelu_new",
            "hidden_dropout_prob": 0.0, "max_position_embeddings": 512, "type_vocab_size": 2,
            "initializer_range": 0.02, "layer_norm_eps": 1e-12, "pad_token_id": 0, "tie_word_embeddings": True}


def to_encoder_config(values: dict, head: str) -> EncoderConfig:
    read = ConfigReader(values, DEFAULTS)
    # Older ALBERT configs carry position_embedding_type; transformers 5 implements only absolute positions.
    read.expect("position_embedding_type", ("absolute",))
    hidden, embedding_size = read("hidden_size"), read("embedding_size")
    if embedding_size == hidden:
        raise ValueError(f"config.json: embedding_size == hidden_size ({hidden}): ALBERT still applies its E -> H "
                         "projection at equal widths, which bertjax builds only when embedding_size differs")
    num_layers, groups = read("num_hidden_layers"), read("num_hidden_groups")
    activation = read.activation("hidden_act")
    return EncoderConfig(
        family="albert",
        vocab_size=read("vocab_size"), hidden_size=hidden, num_layers=num_layers,
        num_heads=read("num_attention_heads"), intermediate_size=read("intermediate_size"),
        embedding_size=embedding_size, num_layer_groups=None if groups == num_layers else groups,
        layers_per_group=read("inner_group_num"),
        max_position_embeddings=read("max_position_embeddings"), type_vocab_size=read("type_vocab_size"),
        position_embedding="learned", position_offset=0,
        norm="layernorm", norm_eps=read.number("layer_norm_eps"), norm_bias=True, norm_placement="post",
        embedding_norm=True, final_norm=False, attention_bias=True, mlp_bias=True, activation=activation,
        mlp="dense", global_attention_every=1, tie_word_embeddings=read("tie_word_embeddings"),
        decoder_bias=True, head_dense_bias=True, head_activation=activation,
        pooler=True,  # AlbertModel's; AlbertForMaskedLM has none but never reads the flag (bert.py says why)
        pad_token_id=read("pad_token_id"),
        dropout_rate=read.number("hidden_dropout_prob"), initializer_range=read.number("initializer_range"))


def to_hf_config(config: EncoderConfig, head: str) -> dict:
    refuse = Refusals(config, "albert")
    refuse.common(factorised_embedding=True, layer_sharing=True)
    refuse.need(position_embedding="learned", position_offset=0, norm_bias=True, norm_placement="post",
                embedding_norm=True, final_norm=False, attention_bias=True, mlp_bias=True, mlp="dense",
                global_attention_every=1, head_dense_bias=True, decoder_bias=True,
                head_activation=config.activation)
    refuse.check(config.embed_dim != config.hidden_size,
                 f"embedding_size={config.embedding_size} (ALBERT always projects E -> H; needs E != hidden_size)")
    refuse.check(config.type_vocab_size >= 1, "type_vocab_size=0 (ALBERT always has token types)")
    if head == "encoder":
        refuse.check(config.pooler, "pooler=False (AlbertModel has a pooler)")
    refuse.raise_if_any()
    return {
        "model_type": "albert", "vocab_size": config.vocab_size, "embedding_size": config.embed_dim,
        "hidden_size": config.hidden_size, "num_hidden_layers": config.num_layers,
        "num_hidden_groups": config.layer_groups, "inner_group_num": config.layers_per_group,
        "num_attention_heads": config.num_heads, "intermediate_size": config.intermediate_size,
        "hidden_act": ACTIVATION_TO_HF[config.activation], "hidden_dropout_prob": config.dropout_rate,
        "attention_probs_dropout_prob": 0.0, "max_position_embeddings": config.max_position_embeddings,
        "type_vocab_size": config.type_vocab_size, "initializer_range": config.initializer_range,
        "layer_norm_eps": config.norm_eps, "pad_token_id": config.pad_token_id,
        "tie_word_embeddings": config.tie_word_embeddings,
        # The tokenizer owns the other special tokens; transformers' defaults (2, 3) would point into small vocabs.
        "bos_token_id": None, "eos_token_id": None,
    }


def albert_layer(key: str, path: ParamPath, cfg: EncoderConfig) -> list[TensorRule]:
    h, i = cfg.hidden_size, cfg.intermediate_size
    return [
        *attention_projection(f"{key}attention.query", path + ("attention", "query"), cfg, cfg.num_heads),
        *attention_projection(f"{key}attention.key", path + ("attention", "key"), cfg, cfg.num_heads),
        *attention_projection(f"{key}attention.value", path + ("attention", "value"), cfg, cfg.num_heads),
        *attention_output(f"{key}attention.dense", path + ("attention", "out"), cfg),
        *layer_norm(f"{key}attention.LayerNorm", path + ("attention_norm",), h, bias=True),
        *linear(f"{key}ffn", path + ("mlp", "wi"), h, i, bias=True),
        *linear(f"{key}ffn_output", path + ("mlp", "wo"), i, h, bias=True),
        *layer_norm(f"{key}full_layer_layer_norm", path + ("mlp_norm",), h, bias=True),
    ]


def key_mapping(cfg: EncoderConfig, head: str) -> KeyMapping:
    h, e = cfg.hidden_size, cfg.embed_dim
    base = "" if head == "encoder" else "albert."
    emb = f"{base}embeddings."
    rules = [
        *embedding(f"{emb}word_embeddings", ("embeddings", "word_embeddings"), cfg.vocab_size, e),
        *embedding(f"{emb}position_embeddings", ("embeddings", "position_embeddings"), cfg.max_position_embeddings,
                   e),
        *embedding(f"{emb}token_type_embeddings", ("embeddings", "token_type_embeddings"), cfg.type_vocab_size, e),
        *layer_norm(f"{emb}LayerNorm", ("embeddings", "norm"), e, bias=True),
        *linear(f"{base}encoder.embedding_hidden_mapping_in", ("embeddings", "projection"), e, h, bias=True),
    ]
    # bertjax names group g's j-th layer layers_{g * layers_per_group + j} (see bertjax.models.encoder).
    for g in range(cfg.layer_groups):
        for j in range(cfg.layers_per_group):
            rules += albert_layer(f"{base}encoder.albert_layer_groups.{g}.albert_layers.{j}.",
                                  ("encoder", f"layers_{g * cfg.layers_per_group + j}"), cfg)
    ignored = {f"{emb}position_ids", f"{emb}token_type_ids"}  # buffers older transformers versions saved
    pooler = linear(f"{base}pooler", ("pooler", "dense"), h, h, bias=True)
    sop = linear("sop_classifier.classifier", ("nsp_head", "dense"), h, 2, bias=True)
    if head in ("encoder", "pretraining"):
        rules += pooler
    if head in ("masked_lm", "pretraining"):
        rules += linear("predictions.dense", ("mlm_head", "dense"), h, e, bias=True)
        rules += layer_norm("predictions.LayerNorm", ("mlm_head", "norm"), e, bias=True)
        decoder_rules, decoder_ignored = mlm_decoder("predictions.decoder",
                                                     ("predictions.decoder.bias", "predictions.bias"), cfg)
        rules += decoder_rules
        ignored |= decoder_ignored
    if head == "pretraining":
        rules += sop
    # Published ALBERT MLM checkpoints (albert-base-v2) still hold the pretraining pooler; transformers drops it.
    unused = [key for rule in (pooler + sop if head == "masked_lm" else []) for key in rule.hf_keys]
    return KeyMapping(rules, frozenset(ignored), frozenset(unused))


_TASK_HEADS = TaskHeads(
    base_prefix="albert.", architectures=architectures("Albert"), activation="tanh",
    keys=bert_like_keys(HeadKeys(out="classifier", dense="albert.pooler"), HeadKeys(out="classifier",
                                                                                  dense="albert.pooler")),
    dropout_key="classifier_dropout_prob", dropout_default=0.1)

FAMILY = HfFamily(
    model_type="albert",
    architectures={"AlbertModel": "encoder", "AlbertForMaskedLM": "masked_lm", "AlbertForPreTraining": "pretraining"},
    to_encoder_config=to_encoder_config,
    to_hf_config=to_hf_config,
    key_mapping=key_mapping,
    task_heads=_TASK_HEADS,
)
