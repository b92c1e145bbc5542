"""DistilBERT (`model_type: distilbert`): config translation, key mapping and refusals.

BERT's post-norm layer under its own names (`q_lin`, `sa_layer_norm`, `ffn.lin1`, ...), no token types, no pooler,
LayerNorm eps fixed at 1e-12, and optionally a fixed sinusoidal position table (`sinusoidal_pos_embds`). Its
config.json names sizes `dim`, `n_layers`, `n_heads`, `hidden_dim`; transformers also accepts `hidden_size`,
`num_hidden_layers` and `num_attention_heads` for the first three (its `attribute_map`), and so does bertjax.
"""

from __future__ import annotations

import logging

import jax.numpy as jnp
import numpy as np

from bertjax.config import EncoderConfig
from bertjax.hf.config_common import ACTIVATION_TO_HF, ConfigReader, Refusals
from bertjax.hf.family import HfFamily
from bertjax.hf.task_heads import HeadKeys, TaskHeads, architectures, bert_like_keys
from bertjax.hf.mapping import (KeyMapping, Layout, ParamPath, TensorRule, attention_output, attention_projection,
                                embedding, layer_norm, linear, mlm_decoder)
from bertjax.models.embeddings import sinusoidal_table

logger = logging.getLogger(__name__)

DEFAULTS = {"vocab_size": 30522, "max_position_embeddings": 512, "sinusoidal_pos_embds": False, "n_layers": 6,
            "n_heads": 12, "dim": 768, "hidden_dim": 3072, "dropout": 0.1, "activation": "gelu",
            "initializer_range": 0.02, "pad_token_id": 0, "tie_word_embeddings": True}
NORM_EPS = 1e-12  # hard-coded in every DistilBERT LayerNorm; not a config key


def to_encoder_config(values: dict, head: str) -> EncoderConfig:
    read = ConfigReader(values, DEFAULTS)
    activation = read.activation("activation")
    sinusoidal = read("sinusoidal_pos_embds")
    if not isinstance(sinusoidal, bool):
        raise ValueError(f"config.json: sinusoidal_pos_embds must be true or false, got {sinusoidal!r}")
    return EncoderConfig(
        family="distilbert",
        vocab_size=read("vocab_size"), hidden_size=read("dim", "hidden_size"),
        num_layers=read("n_layers", "num_hidden_layers"), num_heads=read("n_heads", "num_attention_heads"),
        intermediate_size=read("hidden_dim"), max_position_embeddings=read("max_position_embeddings"),
        type_vocab_size=0, position_embedding="sinusoidal" if sinusoidal else "learned", position_offset=0,
        norm="layernorm", norm_eps=NORM_EPS, norm_bias=True, norm_placement="post", embedding_norm=True,
        final_norm=False, attention_bias=True, mlp_bias=True, activation=activation, mlp="dense",
        global_attention_every=1, tie_word_embeddings=read("tie_word_embeddings"), decoder_bias=True,
        head_dense_bias=True, head_activation=activation, pooler=False, pad_token_id=read("pad_token_id"),
        # bertjax has one dropout rate (no attention-probability dropout); dropout never changes inference.
        dropout_rate=read.number("dropout"), initializer_range=read.number("initializer_range"))


def to_hf_config(config: EncoderConfig, head: str) -> dict:
    refuse = Refusals(config, "distilbert")
    refuse.common()
    refuse.check(config.position_embedding in ("learned", "sinusoidal"),
                 f"position_embedding={config.position_embedding!r} (needs 'learned' or 'sinusoidal')")
    refuse.need(position_offset=0, type_vocab_size=0, norm_eps=NORM_EPS, norm_bias=True, norm_placement="post",
                embedding_norm=True, final_norm=False, attention_bias=True, mlp_bias=True, mlp="dense",
                global_attention_every=1, head_dense_bias=True, decoder_bias=True,
                head_activation=config.activation)
    if head == "encoder":
        refuse.check(not config.pooler, "pooler=True (DistilBertModel has no pooler)")
    refuse.raise_if_any()
    return {
        "model_type": "distilbert", "vocab_size": config.vocab_size, "dim": config.hidden_size,
        "n_layers": config.num_layers, "n_heads": config.num_heads, "hidden_dim": config.intermediate_size,
        "activation": ACTIVATION_TO_HF[config.activation], "dropout": config.dropout_rate,
        "attention_dropout": 0.0, "max_position_embeddings": config.max_position_embeddings,
        "sinusoidal_pos_embds": config.position_embedding == "sinusoidal",
        "initializer_range": config.initializer_range, "pad_token_id": config.pad_token_id,
        "tie_word_embeddings": config.tie_word_embeddings,
    }


def fixed_table(key: str, table: np.ndarray, save_dtype) -> TensorRule:
    """A tensor the file carries but bertjax computes (the sinusoidal table): written on save in `save_dtype`; on
    load it must equal the formula (rounded to the file's dtype), since a table trained away from it would
    silently be replaced."""
    def load(tensor: np.ndarray) -> tuple:
        expected = table.astype(tensor.dtype)
        if not np.allclose(tensor.astype(np.float64), expected.astype(np.float64), rtol=0.0, atol=1e-6):
            raise ValueError(f"tensor {key!r} differs from the sinusoidal table that config.json's "
                             "sinusoidal_pos_embds=true promises (it was trained after initialisation?); set "
                             "sinusoidal_pos_embds to false in config.json to load it as a learned table")
        if tensor.dtype != table.dtype:  # transformers reads the rounded table back; bertjax computes it exactly
            logger.warning("tensor %r holds the sinusoidal table in %s; bertjax computes it in float32, where "
                           "transformers uses the file's rounded values, so outputs differ from transformers' by "
                           "that rounding (about 5e-3 in the hidden states for bfloat16, 5e-4 for float16)", key,
                           tensor.dtype)
        return ()

    return TensorRule((key,), table.shape, (), Layout(load=load, save=lambda _: table.astype(save_dtype)))


def distilbert_layer(key: str, path: ParamPath, cfg: EncoderConfig) -> list[TensorRule]:
    h, i = cfg.hidden_size, cfg.intermediate_size
    return [
        *attention_projection(f"{key}attention.q_lin", path + ("attention", "query"), cfg, cfg.num_heads),
        *attention_projection(f"{key}attention.k_lin", path + ("attention", "key"), cfg, cfg.num_heads),
        *attention_projection(f"{key}attention.v_lin", path + ("attention", "value"), cfg, cfg.num_heads),
        *attention_output(f"{key}attention.out_lin", path + ("attention", "out"), cfg),
        *layer_norm(f"{key}sa_layer_norm", path + ("attention_norm",), h, bias=True),
        *linear(f"{key}ffn.lin1", path + ("mlp", "wi"), h, i, bias=True),
        *linear(f"{key}ffn.lin2", path + ("mlp", "wo"), i, h, bias=True),
        *layer_norm(f"{key}output_layer_norm", path + ("mlp_norm",), h, bias=True),
    ]


def key_mapping(cfg: EncoderConfig, head: str) -> KeyMapping:
    h = cfg.hidden_size
    base = "" if head == "encoder" else "distilbert."
    emb = f"{base}embeddings."
    rules = [*embedding(f"{emb}word_embeddings", ("embeddings", "word_embeddings"), cfg.vocab_size, h)]
    if cfg.position_embedding == "sinusoidal":
        rules.append(fixed_table(f"{emb}position_embeddings.weight", sinusoidal_table(cfg.max_position_embeddings, h),
                                 jnp.dtype(cfg.param_dtype)))
    else:
        rules += embedding(f"{emb}position_embeddings", ("embeddings", "position_embeddings"),
                           cfg.max_position_embeddings, h)
    rules += layer_norm(f"{emb}LayerNorm", ("embeddings", "norm"), h, bias=True)
    for i in range(cfg.num_layers):
        rules += distilbert_layer(f"{base}transformer.layer.{i}.", ("encoder", f"layers_{i}"), cfg)
    ignored = {f"{emb}position_ids"}  # a buffer older transformers versions saved
    if head == "masked_lm":
        rules += linear("vocab_transform", ("mlm_head", "dense"), h, h, bias=True)
        rules += layer_norm("vocab_layer_norm", ("mlm_head", "norm"), h, bias=True)
        decoder_rules, decoder_ignored = mlm_decoder("vocab_projector", ("vocab_projector.bias",), cfg)
        rules += decoder_rules
        ignored |= decoder_ignored
    return KeyMapping(rules, frozenset(ignored))


_TASK_HEADS = TaskHeads(
    base_prefix="distilbert.", architectures=architectures("DistilBert"), activation="relu",
    keys=bert_like_keys(HeadKeys(out="classifier", dense="pre_classifier"),
                        HeadKeys(out="classifier", dense="pre_classifier")),
    dropout_key="seq_classif_dropout", dropout_default=0.2)

FAMILY = HfFamily(
    model_type="distilbert",
    architectures={"DistilBertModel": "encoder", "DistilBertForMaskedLM": "masked_lm"},
    to_encoder_config=to_encoder_config,
    to_hf_config=to_hf_config,
    key_mapping=key_mapping,
    task_heads=_TASK_HEADS,
)
