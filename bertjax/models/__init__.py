from bertjax.models import disentangled  # noqa: F401  (registers the "disentangled" attention kind)
from bertjax.models import longformer  # noqa: F401  (registers the "longformer" attention kind)
from bertjax.models.model import (MODEL_CLASSES, EncoderForMaskedLM, EncoderForNextSentencePrediction,
                                  EncoderForPreTraining, EncoderForReplacedTokenDetection, EncoderModel, EncoderOutput,
                                  MaskedLMOutput, NextSentenceOutput, PreTrainingOutput, ReplacedTokenOutput)
from bertjax.models.params import abstract_params, init_boxed, init_params, logical_axes
from bertjax.models.task_models import (TASK_HEADS, EncoderForMultipleChoice, EncoderForQuestionAnswering,
                                        EncoderForSequenceClassification, EncoderForTokenClassification,
                                        MultipleChoiceOutput, QuestionAnsweringOutput, SequenceClassifierOutput,
                                        TokenClassifierOutput)
from bertjax.models import xlnet  # registers attention_kind "two_stream"  # noqa: E402,F401

__all__ = ["abstract_params", "init_boxed", "init_params", "logical_axes", "MODEL_CLASSES", "TASK_HEADS",
           "EncoderForMaskedLM", "EncoderForPreTraining", "EncoderForNextSentencePrediction",
           "EncoderForReplacedTokenDetection", "EncoderModel", "EncoderOutput", "MaskedLMOutput", "NextSentenceOutput",
           "PreTrainingOutput", "ReplacedTokenOutput",
           "EncoderForSequenceClassification", "EncoderForTokenClassification", "EncoderForQuestionAnswering",
           "EncoderForMultipleChoice", "SequenceClassifierOutput", "TokenClassifierOutput", "QuestionAnsweringOutput",
           "MultipleChoiceOutput"]
