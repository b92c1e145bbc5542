"""bertjax: the BERT family of encoders in JAX/Flax."""

from bertjax.config import PRESETS, EncoderConfig, get_config
from bertjax.models import (MODEL_CLASSES, EncoderForMaskedLM, EncoderForPreTraining,
                            EncoderForReplacedTokenDetection, EncoderModel, EncoderOutput, MaskedLMOutput,
                            PreTrainingOutput, ReplacedTokenOutput, init_params, logical_axes)
from bertjax.models.checked import checked

__version__ = "0.1.0"


def from_pretrained(path, dtype=None, *, allow_pickle: bool = False):
    """Load a Hugging Face checkpoint directory: returns (model, params). See `bertjax.hf`.

    Safetensors only, unless `allow_pickle=True` (a `pytorch_model.bin` is a pickle: only for files you trust).
    """
    from bertjax.hf import from_pretrained as _load
    return _load(path, dtype=dtype, allow_pickle=allow_pickle)


def save_pretrained(path, model, params) -> None:
    """Write a directory that transformers loads with identical outputs. See `bertjax.hf`."""
    from bertjax.hf import save_pretrained as _save
    _save(path, model, params)


__all__ = ["PRESETS", "EncoderConfig", "get_config", "MODEL_CLASSES", "EncoderModel", "EncoderForMaskedLM",
           "EncoderForPreTraining", "EncoderForReplacedTokenDetection", "ReplacedTokenOutput", "EncoderOutput",
           "MaskedLMOutput", "PreTrainingOutput", "from_pretrained", "save_pretrained", "init_params", "logical_axes",
           "checked", "__version__"]
