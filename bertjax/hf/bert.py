"""BERT (`model_type: bert`): config translation, key mapping and refusals.

Post-norm, learned absolute positions, token types, biases everywhere, a [CLS] tanh pooler and an NSP head.
RoBERTa (`bertjax/hf/roberta.py`) is this layout under other names, so the builders here take the names.
"""

from __future__ import annotations

import dataclasses

from bertjax.config import EncoderConfig
from bertjax.hf.config_common import ACTIVATION_TO_HF, ConfigReader, Refusals
from bertjax.hf.family import HfFamily
from bertjax.hf.task_heads import HeadKeys, TaskHeads, architectures, bert_like_keys
from bertjax.hf.mapping import (KeyMapping, ParamPath, TensorRule, attention_output, attention_projection, embedding,
                                layer_norm, linear, mlm_decoder)

DEFAULTS = {"hidden_act": "gelu", "hidden_dropout_prob": 0.1, "max_position_embeddings": 512, "type_vocab_size": 2,
            "initializer_range": 0.02, "layer_norm_eps": 1e-12, "pad_token_id": 0, "tie_word_embeddings": True}


@dataclasses.dataclass(frozen=True)
class BertLikeConfig:
    """What separates BERT's config.json from RoBERTa's."""

    model_type: str
    defaults: dict
    positions_after_padding: bool  # RoBERTa: position ids start at pad_token_id + 1
    head_follows_hidden_act: bool  # BERT's MLM transform uses hidden_act; RoBERTa's lm_head always exact GELU
    factorised_embedding: bool = False  # ELECTRA: embeddings of `embedding_size`, projected to hidden_size
    pooler: bool = True  # whether the family's base model has the [CLS] tanh pooler (ELECTRA's has none)
    sequence_summary: bool = False  # multiple choice through a SequenceSummary (ELECTRA), its summary_* keys read

    def to_encoder_config(self, values: dict, head: str) -> EncoderConfig:
        read = ConfigReader(values, self.defaults)
        read.expect("is_decoder", (False,))
        read.expect("add_cross_attention", (False,))
        read.expect("position_embedding_type", ("absolute",))  # older files carry it; relative kinds are refused
        if head == "multiple_choice" and self.sequence_summary:  # bertjax builds the default summary
            read.expect("summary_type", ("first",))
            read.expect("summary_use_proj", (True,))
            read.expect("summary_activation", ("gelu",))
            read.expect("summary_proj_to_labels", (False,))
        activation = read.activation("hidden_act")
        if self.positions_after_padding and "pad_token_id" in values and values["pad_token_id"] is None:
            # transformers numbers positions from pad_token_id + 1 and fails on such a file at the first forward
            raise ValueError(f"config.json: pad_token_id is null, but {self.model_type} numbers positions from "
                             "pad_token_id + 1; set it to the tokenizer's padding id")
        pad = read("pad_token_id")
        return EncoderConfig(
            family=self.model_type,
            vocab_size=read("vocab_size"), hidden_size=read("hidden_size"), num_layers=read("num_hidden_layers"),
            num_heads=read("num_attention_heads"), intermediate_size=read("intermediate_size"),
            embedding_size=read("embedding_size") if self.factorised_embedding else None,
            max_position_embeddings=read("max_position_embeddings"), type_vocab_size=read("type_vocab_size"),
            position_embedding="learned", position_offset=pad + 1 if self.positions_after_padding else 0,
            norm="layernorm", norm_eps=read.number("layer_norm_eps"), norm_bias=True, norm_placement="post",
            embedding_norm=True, final_norm=False, attention_bias=True, mlp_bias=True, activation=activation,
            mlp="dense", global_attention_every=1, tie_word_embeddings=read("tie_word_embeddings"),
            decoder_bias=True, head_dense_bias=True,
            head_activation=activation if self.head_follows_hidden_act else "gelu",
            # Whether the family's base model (EncoderModel) has a pooler: BertModel/RobertaModel always do. The MLM
            # classes are built without one, but the MLM model never reads the flag: the family's value makes an
            # export of a preset come back equal, and EncoderModel(config) the base model the family has.
            pooler=self.pooler, pad_token_id=pad,
            # bertjax has one dropout rate (no attention-probability dropout); dropout never changes inference.
            dropout_rate=read.number("hidden_dropout_prob"), initializer_range=read.number("initializer_range"))

    def to_hf_config(self, config: EncoderConfig, head: str) -> dict:
        refuse = Refusals(config, self.model_type)
        refuse.common(factorised_embedding=self.factorised_embedding)
        refuse.need(position_embedding="learned", norm_bias=True, norm_placement="post", embedding_norm=True,
                    final_norm=False, attention_bias=True, mlp_bias=True, mlp="dense", global_attention_every=1,
                    head_dense_bias=True, decoder_bias=True)
        refuse.need(position_offset=config.pad_token_id + 1 if self.positions_after_padding else 0)
        refuse.need(head_activation=config.activation if self.head_follows_hidden_act else "gelu")
        refuse.check(config.type_vocab_size >= 1, "type_vocab_size=0 (the family always has token types)")
        if head == "encoder" or not self.pooler:
            refuse.check(config.pooler == self.pooler, f"pooler={config.pooler} (the {self.model_type} base model "
                                                       f"has {'a' if self.pooler else 'no'} pooler)")
        refuse.raise_if_any()
        embedding_size = {"embedding_size": config.embed_dim} if self.factorised_embedding else {}
        return {
            "model_type": self.model_type, "vocab_size": config.vocab_size, **embedding_size,
            "hidden_size": config.hidden_size,
            "num_hidden_layers": config.num_layers, "num_attention_heads": config.num_heads,
            "intermediate_size": config.intermediate_size, "hidden_act": ACTIVATION_TO_HF[config.activation],
            "hidden_dropout_prob": config.dropout_rate, "attention_probs_dropout_prob": 0.0,
            "max_position_embeddings": config.max_position_embeddings, "type_vocab_size": config.type_vocab_size,
            "initializer_range": config.initializer_range, "layer_norm_eps": config.norm_eps,
            "pad_token_id": config.pad_token_id, "tie_word_embeddings": config.tie_word_embeddings,
            "is_decoder": False, "add_cross_attention": False,
            # The tokenizer owns these (a checkpoint's own ids come back through save_pretrained's token_ids);
            # RobertaConfig's defaults 0 and 2 would name other tokens of another vocabulary.
            "bos_token_id": None, "eos_token_id": None,
        }


def bert_layer(key: str, path: ParamPath, cfg: EncoderConfig) -> list[TensorRule]:
    h, i = cfg.hidden_size, cfg.intermediate_size
    return [
        *attention_projection(f"{key}attention.self.query", path + ("attention", "query"), cfg, cfg.num_heads),
        *attention_projection(f"{key}attention.self.key", path + ("attention", "key"), cfg, cfg.kv_heads),
        *attention_projection(f"{key}attention.self.value", path + ("attention", "value"), cfg, cfg.kv_heads),
        *attention_output(f"{key}attention.output.dense", path + ("attention", "out"), cfg),
        *layer_norm(f"{key}attention.output.LayerNorm", path + ("attention_norm",), h, bias=True),
        *linear(f"{key}intermediate.dense", path + ("mlp", "wi"), h, i, bias=True),
        *linear(f"{key}output.dense", path + ("mlp", "wo"), i, h, bias=True),
        *layer_norm(f"{key}output.LayerNorm", path + ("mlp_norm",), h, bias=True),
    ]


@dataclasses.dataclass(frozen=True)
class HeadNames:
    mlm_prefix: str  # "cls.predictions." (BERT) or "lm_head." (RoBERTa)
    mlm_dense: str
    mlm_norm: str
    nsp: str | None  # BERT's next-sentence classifier; RoBERTa has none


def bert_like_backbone(cfg: EncoderConfig, base: str) -> tuple[list[TensorRule], set[str]]:
    """The embeddings (of width embedding_size, projected to hidden_size where they differ: ELECTRA) and the layer
    stack of BERT's layout under `base` ("bert.", "electra.", "" for a bare model): (rules, ignored keys)."""
    h, width = cfg.hidden_size, cfg.embed_dim
    e = f"{base}embeddings."
    rules = [
        *embedding(f"{e}word_embeddings", ("embeddings", "word_embeddings"), cfg.vocab_size, width),
        *embedding(f"{e}position_embeddings", ("embeddings", "position_embeddings"), cfg.max_position_embeddings,
                   width),
        *layer_norm(f"{e}LayerNorm", ("embeddings", "norm"), width, bias=True),
    ]
    if cfg.type_vocab_size:
        rules += embedding(f"{e}token_type_embeddings", ("embeddings", "token_type_embeddings"),
                           cfg.type_vocab_size, width)
    if width != h:
        rules += linear(f"{base}embeddings_project", ("embeddings", "projection"), width, h, bias=True)
    for i in range(cfg.num_layers):
        rules += bert_layer(f"{base}encoder.layer.{i}.", ("encoder", f"layers_{i}"), cfg)
    # Buffers older transformers versions saved alongside the weights.
    return rules, {f"{e}position_ids", f"{e}token_type_ids"}


def bert_like_mapping(cfg: EncoderConfig, head: str, base_prefix: str, names: HeadNames) -> KeyMapping:
    """`base_prefix` names the base model inside the head classes (`bert.`); the bare model has none."""
    h = cfg.hidden_size
    base = "" if head == "encoder" else base_prefix
    rules, ignored = bert_like_backbone(cfg, base)
    pooler = linear(f"{base}pooler.dense", ("pooler", "dense"), h, h, bias=True)
    if head in ("encoder", "pretraining", "next_sentence"):
        rules += pooler
    if head in ("masked_lm", "pretraining"):
        p = names.mlm_prefix
        rules += linear(f"{p}{names.mlm_dense}", ("mlm_head", "dense"), h, h, bias=True)
        rules += layer_norm(f"{p}{names.mlm_norm}", ("mlm_head", "norm"), h, bias=True)
        decoder_rules, decoder_ignored = mlm_decoder(f"{p}decoder", (f"{p}decoder.bias", f"{p}bias"), cfg)
        rules += decoder_rules
        ignored |= decoder_ignored
    nsp = linear(names.nsp, ("nsp_head", "dense"), h, 2, bias=True) if names.nsp else []
    if head in ("pretraining", "next_sentence"):
        rules += nsp
    # Published MLM checkpoints (bert-base-uncased) still carry the pretraining pooler and NSP head.
    unused = [key for rule in (pooler + nsp if head == "masked_lm" else []) for key in rule.hf_keys]
    return KeyMapping(rules, frozenset(ignored), frozenset(unused))


_CONFIG = BertLikeConfig("bert", DEFAULTS, positions_after_padding=False, head_follows_hidden_act=True)
_HEADS = HeadNames("cls.predictions.", "transform.dense", "transform.LayerNorm", "cls.seq_relationship")

_TASK_HEADS = TaskHeads(
    base_prefix="bert.", architectures=architectures("Bert"), activation="tanh",  # the pooler is the dense layer
    keys=bert_like_keys(HeadKeys(out="classifier", dense="bert.pooler.dense"),
                        HeadKeys(out="classifier", dense="bert.pooler.dense")))

FAMILY = HfFamily(
    model_type="bert",
    architectures={"BertModel": "encoder", "BertForMaskedLM": "masked_lm", "BertForPreTraining": "pretraining",
                   "BertForNextSentencePrediction": "next_sentence"},
    to_encoder_config=_CONFIG.to_encoder_config,
    to_hf_config=_CONFIG.to_hf_config,
    key_mapping=lambda cfg, head: bert_like_mapping(cfg, head, "bert.", _HEADS),
    task_heads=_TASK_HEADS,
)
