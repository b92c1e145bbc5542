"""`HfFamily`: everything bertjax knows about one Hugging Face model_type, in one value.

A family module (`bertjax/hf/bert.py`, `albert.py`, ...) defines `FAMILY = HfFamily(...)`; `bertjax/hf/registry.py`
lists them. Import reads `config.model_type` and `config.architectures[0]` to pick the family and head; export
picks the family named by `EncoderConfig.family`, never by trying families in turn (a DistilBERT or ELECTRA
config would pass as BERT).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

from bertjax.config import EncoderConfig
from bertjax.hf.mapping import KeyMapping


@dataclasses.dataclass(frozen=True)
class HfFamily:
    model_type: str  # transformers' config.model_type, and the value of EncoderConfig.family
    architectures: Mapping[str, str]  # transformers class name -> bertjax head name in bertjax.models.MODEL_CLASSES
    # config.json values -> EncoderConfig (with family=model_type) for the given head.
    to_encoder_config: Callable[[dict, str], EncoderConfig]
    # EncoderConfig -> config.json values (without "architectures"); a ValueError listing every field the family
    # cannot express.
    to_hf_config: Callable[[EncoderConfig, str], dict]
    # Tensor names <-> parameter paths for (config, head).
    key_mapping: Callable[[EncoderConfig, str], KeyMapping]

    def architecture_for(self, head: str) -> str:
        for name, target in self.architectures.items():
            if target == head:
                return name
        raise ValueError(f"transformers has no {self.model_type} architecture for the bertjax head {head!r}; "
                         f"{self.model_type} architectures: {sorted(self.architectures)}")
