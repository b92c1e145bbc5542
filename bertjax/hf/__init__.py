"""Hugging Face checkpoint interop: load and write transformers checkpoint directories (safetensors).

    model, params = bertjax.hf.from_pretrained("path/to/checkpoint")   # config.json + model.safetensors
    bertjax.hf.save_pretrained("out/", model, params)                 # loadable by transformers
"""

from bertjax.hf.config_translation import ARCHITECTURES, TRANSLATORS
from bertjax.hf.mapping import KEY_MAPPINGS
from bertjax.hf.pretrained import from_pretrained, save_pretrained

__all__ = ["ARCHITECTURES", "KEY_MAPPINGS", "TRANSLATORS", "from_pretrained", "save_pretrained"]
