from bertjax.models.model import (MODEL_CLASSES, EncoderForMaskedLM, EncoderForPreTraining,
                                  EncoderForReplacedTokenDetection, EncoderModel, EncoderOutput, MaskedLMOutput,
                                  PreTrainingOutput, ReplacedTokenOutput)
from bertjax.models.params import abstract_params, init_boxed, init_params, logical_axes

__all__ = ["abstract_params", "init_boxed", "init_params", "logical_axes", "MODEL_CLASSES", "EncoderForMaskedLM",
           "EncoderForPreTraining", "EncoderForReplacedTokenDetection", "EncoderModel", "EncoderOutput",
           "MaskedLMOutput", "PreTrainingOutput", "ReplacedTokenOutput"]
