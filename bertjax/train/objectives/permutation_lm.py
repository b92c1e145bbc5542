"""Permutation language modelling (XLNet, Yang et al. 2019): predict 1/K of the tokens, each from the tokens
before it in a random factorisation order, through XLNet's query stream (bertjax/train/objectives/permutation.py
draws the orders on the device, per row, every step).

The data pipeline's batches are MLM batches; this objective reads the original tokens back from them (masked_ids
written at masked_positions) and ignores the MLM mask, so any packed pretraining data serves. The number of
predictions per row is random, so the differentiated loss divides the summed cross-entropy by the expected count
(real tokens / K): a count known before the step, which keeps gradient accumulation exact. The reported `loss` is
the mean over the predictions actually made.
"""

from __future__ import annotations

import dataclasses

import jax

from bertjax.models import MODEL_CLASSES
from bertjax.models.params import init_boxed
from bertjax.train import flops as flops_lib
from bertjax.train.objectives import losses
from bertjax.train.objectives.base import Objective, ObjectiveError, ObjectiveOptions, model_inputs
from bertjax.train.objectives.electra import replace_at
from bertjax.train.objectives.permutation import sample_permutation


@dataclasses.dataclass(frozen=True)
class PermutationLMOptions(ObjectiveOptions):
    name: str = "permutation_lm"
    prediction_ratio: int = 6  # K: a fraction 1/K of the tokens is predicted (the paper's K = 6)
    max_span: int = 5  # target span lengths 1..max_span, p(n) ∝ 1/n (the released code's max_gram)
    num_predict: int | None = None  # prediction slots per row; None: ceil(seq_len / prediction_ratio)

    def __post_init__(self) -> None:
        if self.prediction_ratio < 2:
            raise ValueError(f"objective.prediction_ratio must be >= 2, got {self.prediction_ratio}")
        if self.max_span < 1:
            raise ValueError(f"objective.max_span must be >= 1, got {self.max_span}")
        if self.num_predict is not None and self.num_predict < 1:
            raise ValueError(f"objective.num_predict must be positive or null, got {self.num_predict}")


class PermutationLM(Objective):
    name = "permutation_lm"
    options_class = PermutationLMOptions
    head = "masked_lm"

    def __init__(self, options, model_config, remat_policy="none"):
        super().__init__(options, model_config, remat_policy)
        if model_config.attention_kind != "two_stream":
            raise ObjectiveError(f"objective.name='permutation_lm' needs XLNet's two-stream attention (a model with "
                                 f"attention_kind: two_stream, e.g. preset xlnet-base); this model has "
                                 f"attention_kind={model_config.attention_kind!r}")

    @property
    def model(self):
        return MODEL_CLASSES[self.head](self.model_config, remat_policy=self.remat_policy)

    def init_params(self, key):
        return init_boxed(self.model, key)

    def num_predict(self, seq_len: int) -> int:
        return self.options.num_predict or -(-seq_len // self.options.prediction_ratio)

    def loss_sums(self, params, frozen, batch, key, deterministic):
        order_key, dropout_key = jax.random.split(key)
        ids = replace_at(batch["input_ids"], batch["masked_positions"], batch["masked_weights"] > 0,
                         batch["masked_ids"])  # the original tokens
        plm = sample_permutation(order_key, batch["segment_ids"], ratio=self.options.prediction_ratio,
                                 max_span=self.options.max_span, num_predict=self.num_predict(ids.shape[1]))
        output = self.model.apply({"params": params}, **model_inputs(self.model_config, batch, input_ids=ids),
                                  perm_mask=plm.perm_mask, target_mapping=plm.target_mapping,
                                  deterministic=deterministic, rngs=None if deterministic else {"dropout": dropout_key})
        labels = jax.numpy.take_along_axis(ids, plm.target_positions, axis=1)
        loss, weight, correct = losses.mlm_sums(output.logits, labels, plm.target_weights)
        return {"plm_loss": loss, "plm_weight": weight, "plm_correct": correct}

    def normalisers(self, batch):
        return {"plm_expected": losses.real_token_count(batch) / self.options.prediction_ratio}

    def loss(self, sums, norm):
        return sums["plm_loss"] / norm["plm_expected"]

    def metrics(self, sums):
        plm_loss = losses.mean(sums["plm_loss"], sums["plm_weight"])
        return {"loss": plm_loss, "plm_loss": plm_loss,
                "plm_accuracy": losses.mean(sums["plm_correct"], sums["plm_weight"])}

    def train_flops(self, *, seq_len, tokens, predictions, rows):
        # Content stream over every token, plus the query stream and the LM head at the 1/K predicted tokens; the
        # data's own MLM `predictions` count is not what this objective predicts. The query stream reads the content
        # stream's keys and values, so a prediction costs a layer pass without them. (The step runs the query
        # stream at every position and gathers the predicted ones, as transformers does: hardware FLOPs that model
        # FLOPs leave out.)
        config = self.model_config
        predicted = tokens / self.options.prediction_ratio
        layers = config.num_layers * config.layers_per_group
        query_stream = (flops_lib.forward_flops_per_token(config, seq_len)
                        - layers * flops_lib.key_value_flops_per_token(config))
        return 3.0 * (flops_lib.mlm_forward_flops(config, seq_len=seq_len, tokens=tokens, predictions=predicted)
                      + predicted * query_stream)

    def exports(self, params):
        return {"model": (MODEL_CLASSES[self.head](self.model_config), params)}
