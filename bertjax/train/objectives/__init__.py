"""Training objectives, by name. The run config's `objective:` section names one and gives its typed options:

    objective: {name: mlm}                                     # RoBERTa, ModernBERT
    objective: {name: mlm_nsp}                                 # BERT (data.sentence_objective: nsp)
    objective: {name: mlm_sop}                                 # ALBERT (data.sentence_objective: sop)
    objective: {name: electra, rtd_weight: 50}                 # ELECTRA: generator + discriminator
    objective: {name: distillation, teacher: runs/teacher}     # DistilBERT: frozen teacher
    objective: {name: permutation_lm, prediction_ratio: 6}     # XLNet: permutation LM on the query stream

Adding an objective is one module with an `Objective` subclass and one line in `OBJECTIVES`.
"""

from __future__ import annotations

from typing import Mapping

from bertjax.train.objectives.base import (MODEL_BATCH_KEYS, Objective, ObjectiveError, ObjectiveOptions, Sums,
                                           model_inputs)
from bertjax.train.objectives.distillation import Distillation
from bertjax.train.objectives.electra import Electra
from bertjax.train.objectives.mlm import MaskedLM, MaskedLMWithSentenceOrder, MaskedLMWithSentencePairs
from bertjax.train.objectives.permutation_lm import PermutationLM

OBJECTIVES: dict[str, type[Objective]] = {
    cls.name: cls for cls in (MaskedLM, MaskedLMWithSentencePairs, MaskedLMWithSentenceOrder, Electra, Distillation,
                                 PermutationLM)
}


def objective_class(name) -> type[Objective]:
    if name not in OBJECTIVES:
        raise ObjectiveError(f"objective.name: unknown objective {name!r}; known: {sorted(OBJECTIVES)}")
    return OBJECTIVES[name]


def parse_options(values: Mapping | None, parse_dataclass) -> ObjectiveOptions:
    """The typed options of the objective `values["name"]` names (default `mlm`); errors name `objective.<key>`."""
    if values is not None and not isinstance(values, Mapping):
        raise ObjectiveError(f"objective must be a mapping such as {{name: mlm}}, got {values!r}")
    values = dict(values or {})
    values.setdefault("name", "mlm")
    return parse_dataclass(objective_class(values["name"]).options_class, values, "objective")


def build_objective(options: ObjectiveOptions, model_config, remat_policy: str = "none") -> Objective:
    return objective_class(options.name)(options, model_config, remat_policy)


__all__ = ["MODEL_BATCH_KEYS", "OBJECTIVES", "Objective", "ObjectiveError", "ObjectiveOptions", "Sums",
           "build_objective", "model_inputs", "objective_class", "parse_options"]
