"""Hugging Face checkpoint interop: load and write transformers checkpoint directories (safetensors).

    model, params = bertjax.hf.from_pretrained("path/to/checkpoint")   # config.json + model.safetensors
    bertjax.hf.save_pretrained("out/", model, params)                 # loadable by transformers

One module per family (`bert.py`, `roberta.py`, `modernbert.py`, ...) holds its config translation, key mapping
and refusals as an `HfFamily`; `registry.FAMILIES` lists them. Export writes the family `model.config.family`.
"""

from bertjax.hf.family import HfFamily
from bertjax.hf.pretrained import from_pretrained, save_pretrained, special_token_ids
from bertjax.hf.registry import ARCHITECTURES, FAMILIES

__all__ = ["ARCHITECTURES", "FAMILIES", "HfFamily", "from_pretrained", "save_pretrained", "special_token_ids"]
