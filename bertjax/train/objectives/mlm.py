"""Masked language modelling, alone (`mlm`: RoBERTa, ModernBERT) or with a sentence-pair task on the pooled
first token: next-sentence prediction (`mlm_nsp`, BERT) or sentence-order prediction (`mlm_sop`, ALBERT)."""

from __future__ import annotations

from typing import ClassVar

import jax.numpy as jnp

from bertjax.models import MODEL_CLASSES
from bertjax.models.params import init_boxed
from bertjax.train import flops as flops_lib
from bertjax.train.objectives import losses
from bertjax.train.objectives.base import Objective, ObjectiveError, ObjectiveOptions, model_inputs


class MaskedLM(Objective):
    """Cross-entropy at the masked positions only, projected onto the vocabulary after gathering them."""

    name = "mlm"
    options_class = ObjectiveOptions  # no options besides the name
    head: ClassVar[str] = "masked_lm"

    @property
    def model(self):
        return MODEL_CLASSES[self.head](self.model_config, remat_policy=self.remat_policy)

    def init_params(self, key):
        return init_boxed(self.model, key)

    def apply(self, params, batch, key, deterministic, *, every_token: bool = False):
        """The model on the batch, its vocabulary logits at the masked slots (or, `every_token`, everywhere)."""
        return self.model.apply({"params": params}, **model_inputs(self.model_config, batch),
                                masked_positions=None if every_token else batch["masked_positions"],
                                deterministic=deterministic, rngs=None if deterministic else {"dropout": key})

    def loss_sums(self, params, frozen, batch, key, deterministic):
        output = self.apply(params, batch, key, deterministic)
        loss, weight, correct = losses.mlm_sums(output.logits, batch["masked_ids"], batch["masked_weights"])
        return {"mlm_loss": loss, "mlm_weight": weight, "mlm_correct": correct}

    def normalisers(self, batch):
        return {"mlm_weight": losses.prediction_count(batch)}

    def loss(self, sums, norm):
        return sums["mlm_loss"] / norm["mlm_weight"]

    def metrics(self, sums):
        mlm_loss = losses.mean(sums["mlm_loss"], sums["mlm_weight"])
        return {"loss": mlm_loss, "mlm_loss": mlm_loss,
                "mlm_accuracy": losses.mean(sums["mlm_correct"], sums["mlm_weight"])}

    def train_flops(self, *, seq_len, tokens, predictions, rows):
        return 3.0 * flops_lib.mlm_forward_flops(self.model_config, seq_len=seq_len, tokens=tokens,
                                                 predictions=predictions)

    def exports(self, params):
        return {"model": (MODEL_CLASSES[self.head](self.model_config), params)}


class MaskedLMWithSentencePairs(MaskedLM):
    """MLM plus a 2-way classifier on the pooled [CLS] state; the mean of each loss, summed (BERT's loss)."""

    name = "mlm_nsp"
    head = "pretraining"
    extra_batch_keys = frozenset({"nsp_labels"})
    sentence_objective: ClassVar[str] = "nsp"  # the data pipeline's pair builder that makes the labels

    def __init__(self, options, model_config, remat_policy="none"):
        super().__init__(options, model_config, remat_policy)
        from bertjax.hf.registry import FAMILIES

        # A family without them trained anyway: sentence B's token type 1 clamped to row 0 under jit (never marked),
        # a pooler built the family does not have, and no transformers class to export the run to, found at its end.
        family = FAMILIES.get(model_config.family)
        problems = [text for failed, text in (
            (model_config.type_vocab_size < 2, f"type_vocab_size={model_config.type_vocab_size} (sentence B is "
                                               "token type 1)"),
            (not model_config.pooler, "no pooler (the sentence classifier reads the pooled [CLS])"),
            (family is None or "pretraining" not in family.heads.values(),
             f"no {model_config.family} *ForPreTraining class in transformers to export it to"))
            if failed]
        if problems:
            raise ObjectiveError(f"objective.name={self.name!r} needs a BERT- or ALBERT-style model (model.preset); "
                                 f"this one has {'; '.join(problems)}: train it with objective.name: mlm")

    def check_data(self, data_config, produced, where):
        if data_config.sentence_objective != self.sentence_objective:
            raise ObjectiveError(f"objective.name={self.name!r} trains on {self.sentence_objective.upper()} pairs: "
                                 f"set {where}.sentence_objective: {self.sentence_objective} (it is "
                                 f"{data_config.sentence_objective!r})")
        super().check_data(data_config, produced, where)

    def loss_sums(self, params, frozen, batch, key, deterministic):
        output = self.apply(params, batch, key, deterministic)
        mlm = losses.mlm_sums(output.logits, batch["masked_ids"], batch["masked_weights"])
        nsp = losses.nsp_sums(output.nsp_logits, batch["nsp_labels"])
        return dict(zip(("mlm_loss", "mlm_weight", "mlm_correct", "nsp_loss", "nsp_count", "nsp_correct"),
                        mlm + nsp))

    def normalisers(self, batch):
        count = jnp.maximum(jnp.sum(batch["nsp_labels"] >= 0).astype(jnp.float32), 1.0)
        return {**super().normalisers(batch), "nsp_count": count}

    def loss(self, sums, norm):
        return super().loss(sums, norm) + sums["nsp_loss"] / norm["nsp_count"]

    def metrics(self, sums):
        # Named after the task the pairs were built for (sop_loss for ALBERT's), as the papers report them.
        out = super().metrics(sums)
        task = self.sentence_objective
        out[f"{task}_loss"] = losses.mean(sums["nsp_loss"], sums["nsp_count"])
        out[f"{task}_accuracy"] = losses.mean(sums["nsp_correct"], sums["nsp_count"])
        out["loss"] = out["mlm_loss"] + out[f"{task}_loss"]
        return out

    def train_flops(self, *, seq_len, tokens, predictions, rows):
        return super().train_flops(seq_len=seq_len, tokens=tokens, predictions=predictions, rows=rows) + \
            3.0 * rows * flops_lib.forward_flops_per_row_nsp(self.model_config)


class MaskedLMWithSentenceOrder(MaskedLMWithSentencePairs):
    """ALBERT's sentence-order prediction: the same head and loss, on pairs swapped half of the time."""

    name = "mlm_sop"
    sentence_objective = "sop"
