"""MosaicBERT in MosaicML's own checkpoint layout (`bert_layers.py`, run by transformers as remote code).

transformers has no MosaicBERT class. MosaicML's checkpoints (mosaicml/mosaic-bert-base and its long-sequence
variants) and models built on the same code (DNABERT-2) ship a config.json that says `model_type: "bert"` and
names MosaicML's classes in `auto_map` (`"AutoModelForMaskedLM": "bert_layers.BertForMaskedLM"`); that key, not
the class name, is what tells them from BERT. Their tensors are BERT's without a position table, with a fused
`attention.self.Wqkv` [3H, H] (query, key, value), a bias-free `mlp.gated_layers` [2I, H] whose first half is
activated with the exact GELU and whose second half is the linear gate, `mlp.wo` and `mlp.layernorm`; the MLM
decoder's bias is `cls.predictions.decoder.bias`. Attention adds ALiBi with the slopes of `alibi_slopes`, and the
MLM head's norm always has eps 1e-12.

Export writes the same layout with an `auto_map` that names MosaicML's code in mosaicml/mosaic-bert-base
(`repo--module.Class`), so transformers with `trust_remote_code=True` and network access runs it.
"""

from __future__ import annotations

from bertjax.config import EncoderConfig
from bertjax.hf.bert import DEFAULTS
from bertjax.hf.config_common import ACTIVATION_TO_HF, ConfigReader, Refusals
from bertjax.hf.family import HfFamily
from bertjax.hf.mapping import (TRANSPOSE, KeyMapping, ParamPath, TensorRule, attention_output, embedding,
                                fused, heads_bias, heads_in, layer_norm, linear, mlm_decoder)
from bertjax.hf.task_heads import HeadKeys, TaskHeads

REMOTE_MODULE = "bert_layers."  # MosaicML's modeling file, as auto_map names it
CODE_REPO = "mosaicml/mosaic-bert-base"  # where an exported directory's auto_map finds that file
HEAD_NORM_EPS = 1e-12  # BertPredictionHeadTransform's LayerNorm: fixed in MosaicML's code, whatever the config says
AUTO_CLASSES = {"AutoModel": "BertModel", "AutoModelForMaskedLM": "BertForMaskedLM",
                "AutoModelForSequenceClassification": "BertForSequenceClassification"}


def is_mosaicml_checkpoint(values: dict) -> bool:
    """A BERT config.json whose auto_map runs MosaicML's bert_layers.py."""
    auto_map = values.get("auto_map")
    if values.get("model_type") != "bert" or not isinstance(auto_map, dict):
        return False
    return any(isinstance(target, str) and target.split("--")[-1].startswith(REMOTE_MODULE)
               for target in auto_map.values())


def to_encoder_config(values: dict, head: str) -> EncoderConfig:
    read = ConfigReader(values, DEFAULTS)
    read.expect("is_decoder", (False,))
    norm_eps = read.number("layer_norm_eps")
    if head in ("masked_lm", "pretraining") and norm_eps != HEAD_NORM_EPS:
        # bertjax has one norm eps; MosaicML's MLM head hard-codes 1e-12 beside the layers' layer_norm_eps.
        raise ValueError(f"config.json: layer_norm_eps={norm_eps} with MosaicML's MLM head, whose norm always uses "
                         f"{HEAD_NORM_EPS}; bertjax models one eps for every norm. Load the encoder "
                         "(head='encoder') instead")
    return EncoderConfig(
        family="mosaicbert",
        vocab_size=read("vocab_size"), hidden_size=read("hidden_size"), num_layers=read("num_hidden_layers"),
        num_heads=read("num_attention_heads"), intermediate_size=read("intermediate_size"),
        # ALiBi has no table: this is the length MosaicML's code builds its bias for, not a bound bertjax needs.
        max_position_embeddings=read("max_position_embeddings"), type_vocab_size=read("type_vocab_size"),
        position_embedding="alibi", norm="layernorm", norm_eps=norm_eps, norm_bias=True, norm_placement="post",
        embedding_norm=True, final_norm=False, attention_bias=True, mlp_bias=True, mlp_up_bias=False,
        # The gated feed-forward always applies the exact GELU; hidden_act only reaches the MLM head's transform.
        activation="gelu", mlp="glu", global_attention_every=1, tie_word_embeddings=True, decoder_bias=True,
        head_dense_bias=True, head_activation=read.activation("hidden_act"), pooler=True,  # as bert.py's
        pad_token_id=read("pad_token_id"), dropout_rate=read.number("hidden_dropout_prob"),
        initializer_range=read.number("initializer_range"))


def to_hf_config(config: EncoderConfig, head: str) -> dict:
    refuse = Refusals(config, "mosaicbert", split_mlp_bias=True)
    refuse.common()
    refuse.need(position_embedding="alibi", norm_bias=True, norm_placement="post", embedding_norm=True,
                final_norm=False, attention_bias=True, mlp_bias=True, mlp_up_bias=False, mlp="glu", activation="gelu",
                global_attention_every=1, tie_word_embeddings=True, decoder_bias=True, head_dense_bias=True)
    refuse.exportable_activation("head_activation")
    refuse.check(config.type_vocab_size >= 1, "type_vocab_size=0 (MosaicBERT always has token types)")
    if head in ("masked_lm", "pretraining"):
        refuse.check(config.norm_eps == HEAD_NORM_EPS, f"norm_eps={config.norm_eps} (MosaicML's MLM head norm "
                                                       f"uses {HEAD_NORM_EPS})")
    if head == "encoder":
        refuse.check(config.pooler, "pooler=False (MosaicML's BertModel has a pooler)")
    refuse.raise_if_any()
    return {
        "model_type": "bert",
        "auto_map": {"AutoConfig": f"{CODE_REPO}--configuration_bert.BertConfig",
                     **{auto: f"{CODE_REPO}--{REMOTE_MODULE}{cls}" for auto, cls in AUTO_CLASSES.items()}},
        "vocab_size": config.vocab_size, "hidden_size": config.hidden_size,
        "num_hidden_layers": config.num_layers, "num_attention_heads": config.num_heads,
        "intermediate_size": config.intermediate_size, "hidden_act": ACTIVATION_TO_HF[config.head_activation],
        "hidden_dropout_prob": config.dropout_rate,
        # MosaicML's code runs its fused attention kernel only without attention dropout, which bertjax has none of.
        "attention_probs_dropout_prob": 0.0,
        "max_position_embeddings": config.max_position_embeddings,
        "alibi_starting_size": config.max_position_embeddings, "type_vocab_size": config.type_vocab_size,
        "initializer_range": config.initializer_range, "layer_norm_eps": config.norm_eps,
        "pad_token_id": config.pad_token_id, "tie_word_embeddings": True, "is_decoder": False,
    }


def mosaic_layer(key: str, path: ParamPath, cfg: EncoderConfig) -> list[TensorRule]:
    h, i, d = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    attention = path + ("attention",)
    qkv_paths = (attention + ("query",), attention + ("key",), attention + ("value",))
    qkv, qkv_bias = heads_in(cfg.num_heads, d), heads_bias(cfg.num_heads, d)
    gate_paths = (path + ("mlp", "wi_0"), path + ("mlp", "wi_1"))  # activated half, then the linear gate
    return [
        TensorRule((f"{key}attention.self.Wqkv.weight",), (3 * h, h), tuple(p + ("kernel",) for p in qkv_paths),
                   fused(qkv, qkv, qkv)),
        TensorRule((f"{key}attention.self.Wqkv.bias",), (3 * h,), tuple(p + ("bias",) for p in qkv_paths),
                   fused(qkv_bias, qkv_bias, qkv_bias)),
        *attention_output(f"{key}attention.output.dense", attention + ("out",), cfg),
        *layer_norm(f"{key}attention.output.LayerNorm", path + ("attention_norm",), h, bias=True),
        TensorRule((f"{key}mlp.gated_layers.weight",), (2 * i, h), tuple(p + ("kernel",) for p in gate_paths),
                   fused(TRANSPOSE, TRANSPOSE)),
        *linear(f"{key}mlp.wo", path + ("mlp", "wo"), i, h, bias=True),
        *layer_norm(f"{key}mlp.layernorm", path + ("mlp_norm",), h, bias=True),
    ]


def mosaic_mapping(cfg: EncoderConfig, head: str) -> KeyMapping:
    h = cfg.hidden_size
    base = "" if head == "encoder" else "bert."
    e = f"{base}embeddings."
    rules = [
        *embedding(f"{e}word_embeddings", ("embeddings", "word_embeddings"), cfg.vocab_size, h),
        *embedding(f"{e}token_type_embeddings", ("embeddings", "token_type_embeddings"), cfg.type_vocab_size, h),
        *layer_norm(f"{e}LayerNorm", ("embeddings", "norm"), h, bias=True),
    ]
    for i in range(cfg.num_layers):
        rules += mosaic_layer(f"{base}encoder.layer.{i}.", ("encoder", f"layers_{i}"), cfg)
    # Buffers: the precomputed ALiBi bias (persistent in some versions of the code) and the token-type zeros.
    ignored = {f"{base}encoder.alibi", f"{e}token_type_ids"}
    if head == "encoder":
        rules += linear("pooler.dense", ("pooler", "dense"), h, h, bias=True)
    if head == "masked_lm":
        rules += linear("cls.predictions.transform.dense", ("mlm_head", "dense"), h, h, bias=True)
        rules += layer_norm("cls.predictions.transform.LayerNorm", ("mlm_head", "norm"), h, bias=True)
        decoder_rules, decoder_ignored = mlm_decoder("cls.predictions.decoder", ("cls.predictions.decoder.bias",), cfg)
        rules += decoder_rules
        ignored |= decoder_ignored
    return KeyMapping(rules, frozenset(ignored))


# MosaicML wrote one task head: sequence classification on BERT's tanh pooler. Other task heads start on the
# encoder from a fresh init (`from_pretrained(..., head=...)`) and are not written back.
_TASK_HEADS = TaskHeads(
    base_prefix="bert.", architectures={"BertForSequenceClassification": "sequence_classification"},
    activation="tanh", keys={"sequence_classification": HeadKeys(out="classifier", dense="bert.pooler.dense")})

FAMILY = HfFamily(
    model_type="mosaicbert",
    architectures={"BertModel": "encoder", "BertForMaskedLM": "masked_lm"},
    to_encoder_config=to_encoder_config,
    to_hf_config=to_hf_config,
    key_mapping=mosaic_mapping,
    task_heads=_TASK_HEADS,
    claims=is_mosaicml_checkpoint,
)
