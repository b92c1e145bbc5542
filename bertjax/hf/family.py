"""`HfFamily`: everything bertjax knows about one Hugging Face model_type, in one value.

A family module (`bertjax/hf/bert.py`, `albert.py`, ...) defines `FAMILY = HfFamily(...)`; `bertjax/hf/registry.py`
lists them. Import reads `config.model_type` and `config.architectures[0]` to pick the family and head; export
picks the family named by `EncoderConfig.family`, never by trying families in turn (a DistilBERT or ELECTRA
config would pass as BERT). Callers use `encoder_config`, `hf_config` and `mapping`, which add the family's
fine-tuning heads (`task_heads`, see bertjax/hf/task_heads.py) to what the family module translates.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

from bertjax.config import EncoderConfig
from bertjax.hf.config_common import Refusals
from bertjax.hf.mapping import KeyMapping
from bertjax.hf.task_heads import TaskHeads
from bertjax.models.task_models import TASK_HEADS


@dataclasses.dataclass(frozen=True)
class HfFamily:
    model_type: str  # transformers' config.model_type, and the value of EncoderConfig.family
    architectures: Mapping[str, str]  # transformers class name -> bertjax head name in bertjax.models.MODEL_CLASSES
    # config.json values -> EncoderConfig (with family=model_type) for the given head.
    to_encoder_config: Callable[[dict, str], EncoderConfig]
    # EncoderConfig -> config.json values (without "architectures"); a ValueError listing every field the family
    # cannot express.
    to_hf_config: Callable[[EncoderConfig, str], dict]
    # Tensor names <-> parameter paths for (config, head); for task heads, the backbone's only.
    key_mapping: Callable[[EncoderConfig, str], KeyMapping]
    task_heads: TaskHeads | None = None  # the family's fine-tuning heads
    # For a family whose config.json carries another family's model_type and runs remote code (MosaicBERT says
    # "bert"): whether a config.json is this family's. Checked before model_type.
    claims: Callable[[dict], bool] | None = None

    @property
    def heads(self) -> dict[str, str]:
        """Every transformers class name of the family -> bertjax head, task heads included."""
        return {**self.architectures, **(self.task_heads.architectures if self.task_heads else {})}

    def encoder_config(self, values: dict, head: str) -> EncoderConfig:
        config = self.to_encoder_config(values, head)
        return self.task_heads.configure(config, values, head) if self.task_heads else config

    def hf_config(self, config: EncoderConfig, head: str) -> dict:
        if head in TASK_HEADS and self.task_heads:  # head layout and labels first
            # Only the head's settings here: to_hf_config refuses the encoder's.
            refuse = Refusals(config, self.model_type, split_mlp_bias=True)
            self.task_heads.refuse(refuse, config, head)
            refuse.raise_if_any()
            return {**self.to_hf_config(config, head), **self.task_heads.to_hf(config)}
        if self.task_heads:
            return {**self.to_hf_config(config, head), **self.task_heads.classifier_to_hf(config)}
        return self.to_hf_config(config, head)

    def mapping(self, config: EncoderConfig, head: str) -> KeyMapping:
        mapping = self.key_mapping(config, head)
        if head in TASK_HEADS and self.task_heads:
            mapping = dataclasses.replace(mapping, rules=mapping.rules + self.task_heads.rules(config, head))
        return mapping

    def architecture_for(self, head: str) -> str:
        for name, target in self.heads.items():
            if target == head:
                return name
        raise ValueError(f"there is no {self.model_type} architecture for the bertjax head {head!r}; "
                         f"{self.model_type} architectures: {sorted(self.heads)} (`bertjax convert --to-hf DIR "
                         "--head encoder` writes the bare encoder, without the head)")
