"""bertjax: the BERT family of encoders in JAX/Flax."""

from bertjax.platforms import quiet_libtpu

quiet_libtpu()  # before JAX first looks for a TPU: libtpu (the tpu-aot extra) is silent on machines without one

from bertjax.config import PRESETS, EncoderConfig, TaskConfig, get_config
from bertjax.models import (MODEL_CLASSES, EncoderForMaskedLM, EncoderForMultipleChoice,
                            EncoderForNextSentencePrediction, EncoderForPreTraining, EncoderForQuestionAnswering,
                            EncoderForReplacedTokenDetection, EncoderForSequenceClassification,
                            EncoderForTokenClassification, EncoderModel, EncoderOutput, MaskedLMOutput,
                            MultipleChoiceOutput, NextSentenceOutput, PreTrainingOutput, QuestionAnsweringOutput,
                            ReplacedTokenOutput, SequenceClassifierOutput, TokenClassifierOutput, init_params,
                            logical_axes)
from bertjax.models.checked import checked

__version__ = "0.1.0"


def from_pretrained(path, dtype=None, *, head=None, seed=0, allow_pickle: bool = False, **task):
    """Load a Hugging Face checkpoint directory: returns (model, params). `head="sequence_classification"` (and
    TaskConfig fields such as num_labels=3) starts a new task head on the checkpoint's encoder. Safetensors only,
    unless `allow_pickle=True` (a `pytorch_model.bin` is a pickle: only for files you trust). See
    `bertjax.hf.pretrained.from_pretrained`."""
    from bertjax.hf import from_pretrained as _load
    return _load(path, dtype=dtype, head=head, seed=seed, allow_pickle=allow_pickle, **task)


def save_pretrained(path, model, params, token_ids=None) -> None:
    """Write a directory that transformers loads with identical outputs. `token_ids`: special-token ids
    (`bertjax.hf.special_token_ids(source_dir)`) to carry into config.json where the model's config sets none.
    See `bertjax.hf.save_pretrained`."""
    from bertjax.hf import save_pretrained as _save
    _save(path, model, params, token_ids=token_ids)


__all__ = ["PRESETS", "EncoderConfig", "TaskConfig", "get_config", "MODEL_CLASSES", "EncoderModel",
           "EncoderForMaskedLM", "EncoderForPreTraining", "EncoderForNextSentencePrediction", "NextSentenceOutput",
           "EncoderForReplacedTokenDetection", "ReplacedTokenOutput",
           "EncoderForSequenceClassification", "EncoderForTokenClassification", "EncoderForQuestionAnswering",
           "EncoderForMultipleChoice", "SequenceClassifierOutput", "TokenClassifierOutput", "QuestionAnsweringOutput",
           "MultipleChoiceOutput", "EncoderOutput", "MaskedLMOutput", "PreTrainingOutput", "from_pretrained",
           "save_pretrained", "init_params", "logical_axes", "checked", "__version__"]
