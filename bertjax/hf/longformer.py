"""Longformer (`model_type: longformer`): RoBERTa's layout and names under `longformer.`, plus per-layer
`attention_window` and the global projections `attention.self.{query,key,value}_global` in every layer.

transformers pads every input to a multiple of the largest window before attending; bertjax attends at the input's
own length (padding never changes a real token's output), so the two agree at every real position. The task
heads are RoBERTa's (`classifier.dense`/`classifier.out_proj`, multiple choice on the pooler).
"""

from __future__ import annotations

from bertjax.config import EncoderConfig, LongformerOptions
from bertjax.hf.bert import DEFAULTS, BertLikeConfig, HeadNames, bert_like_mapping
from bertjax.hf.config_common import Refusals
from bertjax.hf.family import HfFamily
from bertjax.hf.mapping import KeyMapping, attention_projection
from bertjax.hf.task_heads import HeadKeys, TaskHeads, architectures, bert_like_keys

# transformers' LongformerConfig defaults (RoBERTa's special ids, BERT's sizes).
_DEFAULTS = {**DEFAULTS, "pad_token_id": 1, "attention_window": 512, "sep_token_id": 2, "bos_token_id": 0,
             "eos_token_id": 2}
_BASE = BertLikeConfig("longformer", _DEFAULTS, positions_after_padding=True, head_follows_hidden_act=False)
_HEADS = HeadNames("lm_head.", "dense", "layer_norm", nsp=None)


def _windows(values: dict, num_layers: int) -> int | tuple[int, ...]:
    window = values.get("attention_window", _DEFAULTS["attention_window"])
    if isinstance(window, list):
        if len(window) != num_layers:
            raise ValueError(f"config.json: attention_window has {len(window)} entries for num_hidden_layers="
                             f"{num_layers}")
        return window[0] if len(set(window)) == 1 else tuple(window)
    return window


def to_encoder_config(values: dict, head: str) -> EncoderConfig:
    config = _BASE.to_encoder_config(values, head)
    windows = _windows(values, config.num_layers)
    sep = values.get("sep_token_id")
    return config.replace(attention_kind="longformer", longformer=LongformerOptions(
        attention_window=windows, sep_token_id=_DEFAULTS["sep_token_id"] if sep is None else sep))


def to_hf_config(config: EncoderConfig, head: str) -> dict:
    refuse = Refusals(config, "longformer")
    refuse.need(attention_kind="longformer")
    refuse.raise_if_any()
    plain = config.replace(attention_kind="standard", longformer=None)  # what RoBERTa's translation checks
    values = _BASE.to_hf_config(plain, head)
    windows = config.longformer.attention_window
    values["attention_window"] = (list(windows) if isinstance(windows, tuple)
                                  else [windows] * config.num_layers)
    values["sep_token_id"] = config.longformer.sep_token_id
    return values


def key_mapping(config: EncoderConfig, head: str) -> KeyMapping:
    mapping = bert_like_mapping(config, head, "longformer.", _HEADS)
    base = "" if head == "encoder" else "longformer."
    extra = []
    for i in range(config.num_layers):
        for name in ("query_global", "key_global", "value_global"):
            extra += attention_projection(f"{base}encoder.layer.{i}.attention.self.{name}",
                                          ("encoder", f"layers_{i}", "attention", name), config, config.num_heads)
    return KeyMapping(mapping.rules + extra, mapping.ignored, mapping.unused)


_TASK_HEADS = TaskHeads(
    base_prefix="longformer.", architectures=architectures("Longformer"), activation="tanh",
    keys=bert_like_keys(HeadKeys(out="classifier.out_proj", dense="classifier.dense"),
                        HeadKeys(out="classifier", dense="longformer.pooler.dense")))

FAMILY = HfFamily(
    model_type="longformer",
    architectures={"LongformerModel": "encoder", "LongformerForMaskedLM": "masked_lm"},
    to_encoder_config=to_encoder_config,
    to_hf_config=to_hf_config,
    key_mapping=key_mapping,
    task_heads=_TASK_HEADS,
)
