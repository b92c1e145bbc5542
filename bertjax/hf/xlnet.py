"""XLNet checkpoints (`model_type: xlnet`): XLNetModel, XLNetLMHeadModel and the task heads with a sequence summary.

transformers keeps XLNet's attention tensors per head: q, k, v, r are [d_model, n_head, d_head] (bertjax's kernel
layout already), o is [d_model, n_head, d_head] (bertjax: [heads, head_dim, embed]); r_w_bias, r_r_bias, r_s_bias
and seg_embed are the content, position and segment biases and the two segment vectors. The LM head `lm_loss` is
tied to the word embedding. Only what changes outputs is translated: `attn_type` must be "bi" and `bi_data` false
(both pretraining-only options of the original code), memory (`mem_len`, `reuse_len`) never changes a forward pass
without `mems`, which bertjax does not take.
"""

from __future__ import annotations

import logging

from bertjax.config import FAMILY_POOLING, XLNET_TASK, EncoderConfig, XLNetOptions
from bertjax.hf.config_common import ACTIVATION_TO_HF, ConfigReader, Refusals
from bertjax.hf.family import HfFamily
from bertjax.hf.mapping import COPY, KeyMapping, Layout, TensorRule, embedding, layer_norm, linear, mlm_decoder
from bertjax.hf.task_heads import HeadKeys, TaskHeads

MODEL_TYPE = "xlnet"
# XLNet's token types: 0 and 1 for the two segments, 2 for <cls>, 3 for padding (XLNetTokenizer's token_type_ids).
TYPE_VOCAB_SIZE = 4

# transformers' XLNetConfig defaults (they describe xlnet-large), so a trimmed config.json means the same.
DEFAULTS = {"vocab_size": 32000, "d_model": 1024, "n_layer": 24, "n_head": 16, "d_inner": 4096,
            "ff_activation": "gelu", "attn_type": "bi", "initializer_range": 0.02, "layer_norm_eps": 1e-12,
            "dropout": 0.1, "clamp_len": -1, "pad_token_id": 5, "tie_word_embeddings": True}
# transformers' XLNet has no length limit (its config refuses max_position_embeddings); bertjax still bounds the
# input, at XLNet's pretraining length. Relative encodings are computed, so raising it after import is safe.
MAX_LENGTH = 512

# o: torch [d_model, n_head, d_head] <-> kernel [heads, head_dim, embed]; mask_emb: [1, 1, d_model] <-> [hidden].
_OUT = Layout(load=lambda w: (w.transpose(1, 2, 0),), save=lambda p: p[0].transpose(2, 0, 1))
_MASK_EMB = Layout(load=lambda x: (x.reshape(-1),), save=lambda p: p[0].reshape(1, 1, -1))

logger = logging.getLogger(__name__)


def to_encoder_config(values: dict, head: str) -> EncoderConfig:
    read = ConfigReader(values, DEFAULTS)
    read.expect("attn_type", ("bi",))
    read.expect("bi_data", (False,))
    if head in ("sequence_classification", "multiple_choice"):  # XLNetSequenceSummary: proj -> tanh
        read.expect("summary_use_proj", (True,))
        read.expect("summary_activation", ("tanh",))
        read.expect("summary_proj_to_labels", (False,))
        if values.get("summary_type") in ("first", "mean"):
            # XLNet rows are left-padded: transformers' "first" reads index 0 (padding on a short row) and its "mean"
            # averages the padding in. bertjax pools each row's real tokens; padding-free rows agree.
            logger.warning("XLNet summary_type=%r: bertjax pools the real tokens of each row, transformers also "
                           "the left padding, so the two agree only on rows without padding", values["summary_type"])
    hidden, heads = read("d_model", "hidden_size"), read("n_head", "num_attention_heads")
    if values.get("d_head") is not None and values["d_head"] != hidden // heads:  # XLNetConfig refuses it too
        raise ValueError(f"config.json: d_head={values['d_head']!r}, but XLNet's heads are d_model // n_head = "
                         f"{hidden // heads} wide")
    return EncoderConfig(
        family=MODEL_TYPE, vocab_size=read("vocab_size"), hidden_size=hidden, num_layers=read("n_layer"),
        num_heads=heads, intermediate_size=read("d_inner"), max_position_embeddings=MAX_LENGTH,
        type_vocab_size=TYPE_VOCAB_SIZE, position_embedding="none", norm="layernorm",
        norm_eps=read.number("layer_norm_eps"), norm_bias=True, norm_placement="post", embedding_norm=False,
        final_norm=False, attention_bias=False, mlp_bias=True, activation=read.activation("ff_activation"),
        mlp="dense", attention_kind="two_stream", xlnet=XLNetOptions(clamp_len=int(read("clamp_len"))),
        tie_word_embeddings=read("tie_word_embeddings"), decoder_bias=True, mlm_head_transform=False, pooler=False,
        pad_token_id=read("pad_token_id"), dropout_rate=read.number("dropout"),
        initializer_range=read.number("initializer_range"), task=XLNET_TASK)  # task heads: replaced from the file


def to_hf_config(config: EncoderConfig, head: str) -> dict:
    cfg = config
    refuse = Refusals(cfg, MODEL_TYPE)
    # Refusals.common's checks but the MLM transform: XLNet's LM head is the tied decoder alone.
    refuse.check(cfg.kv_heads == cfg.num_heads, f"num_kv_heads={cfg.num_kv_heads} (grouped-query attention)")
    refuse.check(cfg.attention_head_dim in (None, cfg.hidden_size // cfg.num_heads),
                 f"attention_head_dim={cfg.attention_head_dim} (heads are d_model // n_head wide)")
    refuse.exportable_activation("activation")
    refuse.need(norm="layernorm", attention_kind="two_stream", position_embedding="none", norm_bias=True,
                norm_placement="post", embedding_norm=False, final_norm=False, attention_bias=False,
                mlp_bias=True, mlp="dense", decoder_bias=True, mlm_head_transform=False, pooler=False)
    refuse.raise_if_any()
    if head in ("sequence_classification", "multiple_choice") and cfg.classifier_pooling in ("cls", "mean"):
        logger.warning("XLNet classifier_pooling=%r is written as summary_type=%r: transformers reads the left "
                       "padding too (bertjax pools the real tokens), so the two agree only on rows without padding",
                       cfg.classifier_pooling, "first" if cfg.classifier_pooling == "cls" else "mean")
    return {
        "model_type": MODEL_TYPE, "vocab_size": cfg.vocab_size, "d_model": cfg.hidden_size, "n_layer": cfg.num_layers,
        "n_head": cfg.num_heads, "d_head": cfg.head_dim, "d_inner": cfg.intermediate_size,
        "ff_activation": ACTIVATION_TO_HF[cfg.activation], "attn_type": "bi", "bi_data": False,
        "clamp_len": cfg.xlnet.clamp_len, "layer_norm_eps": cfg.norm_eps, "dropout": cfg.dropout_rate,
        "initializer_range": cfg.initializer_range, "pad_token_id": cfg.pad_token_id,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "summary_type": "last", "summary_use_proj": True, "summary_activation": "tanh",
        "bos_token_id": None, "eos_token_id": None,  # the tokenizer's; XLNetConfig's 1 and 2 name other tokens here
    }


def _layer(prefix: str, path: tuple[str, ...], cfg: EncoderConfig) -> list[TensorRule]:
    h, heads = cfg.hidden_size, (cfg.num_heads, cfg.head_dim)
    att, scope = f"{prefix}rel_attn.", path + ("attention",)
    rules = [TensorRule((f"{att}{name}",), (h, *heads), (scope + (ours, "kernel"),), COPY)
             for name, ours in (("q", "query"), ("k", "key"), ("v", "value"), ("r", "relative"))]
    rules.append(TensorRule((f"{att}o",), (h, *heads), (scope + ("out", "kernel"),), _OUT))
    rules += [TensorRule((f"{att}{name}",), heads, (scope + (ours,),), COPY)
              for name, ours in (("r_w_bias", "content_bias"), ("r_r_bias", "position_bias"),
                                 ("r_s_bias", "segment_bias"))]
    rules.append(TensorRule((f"{att}seg_embed",), (2, *heads), (scope + ("segment_embed",),), COPY))
    rules += layer_norm(f"{att}layer_norm", path + ("attention_norm",), h, bias=True)
    rules += linear(f"{prefix}ff.layer_1", path + ("mlp", "wi"), h, cfg.intermediate_size, bias=True)
    rules += linear(f"{prefix}ff.layer_2", path + ("mlp", "wo"), cfg.intermediate_size, h, bias=True)
    rules += layer_norm(f"{prefix}ff.layer_norm", path + ("mlp_norm",), h, bias=True)
    return rules


def key_mapping(cfg: EncoderConfig, head: str) -> KeyMapping:
    """XLNetModel's tensors carry no prefix; inside the head classes the backbone is `transformer.`."""
    base = "" if head == "encoder" else "transformer."
    rules: list[TensorRule] = [
        *embedding(f"{base}word_embedding", ("embeddings", "word_embeddings"), cfg.vocab_size, cfg.hidden_size),
        TensorRule((f"{base}mask_emb",), (1, 1, cfg.hidden_size), (("encoder", "mask_emb"),), _MASK_EMB),
    ]
    for i in range(cfg.num_layers):
        rules += _layer(f"{base}layer.{i}.", ("encoder", f"layers_{i}"), cfg)
    ignored: set[str] = set()
    unused: set[str] = set()
    if head == "masked_lm":
        decoder_rules, ignored = mlm_decoder("lm_loss", ("lm_loss.bias",), cfg)
        rules += decoder_rules
    else:  # an LM checkpoint read as another head: its LM head is dropped, as transformers does
        unused = {"lm_loss.bias", "lm_loss.weight"}
    return KeyMapping(rules, frozenset(ignored), frozenset(unused))


# XLNetSequenceSummary (the last token -> summary linear -> tanh -> dropout) then logits_proj; the pooling is
# config.json's summary_type.
_SUMMARY = HeadKeys(out="logits_proj", dense="sequence_summary.summary")
_TASK_HEADS = TaskHeads(
    base_prefix="transformer.",
    architectures={"XLNetForSequenceClassification": "sequence_classification",
                   "XLNetForTokenClassification": "token_classification",
                   "XLNetForQuestionAnsweringSimple": "question_answering",
                   "XLNetForMultipleChoice": "multiple_choice"},
    keys={"sequence_classification": _SUMMARY, "token_classification": HeadKeys(out="classifier"),
          "question_answering": HeadKeys(out="qa_outputs"), "multiple_choice": _SUMMARY},
    activation="tanh", dropout_key="summary_last_dropout", dropout_default=0.1,
    poolings={"last": "last", "cls": "first", "mean": "mean"}, pooling_default=FAMILY_POOLING[MODEL_TYPE],
    pooling_key="summary_type")

FAMILY = HfFamily(
    model_type=MODEL_TYPE,
    architectures={"XLNetModel": "encoder", "XLNetLMHeadModel": "masked_lm"},
    to_encoder_config=to_encoder_config,
    to_hf_config=to_hf_config,
    key_mapping=key_mapping,
    task_heads=_TASK_HEADS,
)
