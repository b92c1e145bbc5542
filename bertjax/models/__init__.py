from bertjax.models.model import (MODEL_CLASSES, EncoderForMaskedLM, EncoderForPreTraining, EncoderModel,
                                  EncoderOutput, MaskedLMOutput, PreTrainingOutput)
from bertjax.models.params import abstract_params, init_params, logical_axes

__all__ = ["abstract_params", "init_params", "logical_axes", "MODEL_CLASSES", "EncoderForMaskedLM",
           "EncoderForPreTraining", "EncoderModel", "EncoderOutput", "MaskedLMOutput", "PreTrainingOutput"]
