"""Knowledge distillation as DistilBERT was trained (Sanh et al., 2019): a frozen teacher, a student initialised
from every other teacher layer, and three losses.

    loss = alpha_ce * T^2 * KL(p_teacher(T) || p_student(T))   at every real token (softened by T)
         + alpha_mlm * MLM cross-entropy                         at the masked positions
         + alpha_cos * (1 - cos(h_student, h_teacher))           at every real token (last hidden states)

The KL term is DistilBERT's released loss (`KLDivLoss` of the student's log-probabilities against the teacher's
probabilities, averaged over the tokens it covers): the teacher's distribution is the target at every real token,
as DistilBERT's training script does by default; `soft_targets: masked` restricts it to the masked positions (its
`--restrict_ce_to_mask`), which computes the vocabulary logits there only. The teacher is read from any model
directory bertjax loads; its parameters are sharded by their own logical axes, passed to the step as an argument
that is never donated, and never updated.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from bertjax.models import MODEL_CLASSES, abstract_params, logical_axes
from bertjax.train import flops as flops_lib
from bertjax.train import mesh as mesh_lib
from bertjax.train.objectives import losses
from bertjax.train.objectives.base import ObjectiveError, ObjectiveOptions, model_inputs
from bertjax.train.objectives.mlm import MaskedLM


log = logging.getLogger(__name__)

@dataclasses.dataclass(frozen=True, kw_only=True)
class DistillationOptions(ObjectiveOptions):
    name: str = "distillation"
    teacher: str  # a transformers directory, a bertjax model directory or a pretraining workdir (an MLM model)
    alpha_ce: float = 5.0
    alpha_mlm: float = 2.0
    alpha_cos: float = 1.0
    temperature: float = 2.0
    # "teacher_layers": embeddings, heads and evenly spaced layers copied from the teacher (12 -> 6 takes layers
    # 0 2 4 7 9 11, as DistilBERT); "random": the preset's random initialisation.
    student_init: Literal["teacher_layers", "random"] = "teacher_layers"
    # Where the teacher's distribution is the student's target: "all_tokens" (every real token, DistilBERT's
    # default) or "masked" (the masked positions only: DistilBERT's --restrict_ce_to_mask).
    soft_targets: Literal["all_tokens", "masked"] = "all_tokens"

    def __post_init__(self) -> None:
        if self.temperature <= 0:
            raise ValueError(f"objective.temperature must be positive, got {self.temperature}")
        for name in ("alpha_ce", "alpha_mlm", "alpha_cos"):
            if getattr(self, name) < 0:
                raise ValueError(f"objective.{name} must be >= 0, got {getattr(self, name)}")

    def tokenizer_path(self) -> str | None:
        """The teacher's tokenizer: a student must read the same token ids."""
        if "://" not in self.teacher and not Path(self.teacher).exists():
            raise ValueError(f"objective.teacher: {self.teacher!r} does not exist (a transformers directory, a bertjax "
                             "model directory or a pretraining workdir)")
        nested = Path(self.teacher) / "tokenizer"  # a pretraining workdir keeps it in a subdirectory
        return str(nested) if nested.is_dir() else self.teacher


def teacher_layer_map(teacher_layers: int, student_layers: int) -> list[int]:
    """Evenly spaced teacher layers, first and last included: 12 -> 6 gives [0, 2, 4, 7, 9, 11]."""
    if student_layers > teacher_layers:
        raise ObjectiveError(f"the student has {student_layers} layers, more than the teacher's {teacher_layers}")
    if student_layers == 1:
        return [0]
    step = (teacher_layers - 1) / (student_layers - 1)
    return [int(np.floor(i * step + 0.5)) for i in range(student_layers)]


def load_teacher(path: str):
    """(model, params, tokenizer) of the teacher directory (the same reader as every command's --model)."""
    from bertjax.model_dirs import load_model_dir
    return load_model_dir(path)


class Distillation(MaskedLM):
    name = "distillation"
    options_class = DistillationOptions

    def __init__(self, options, model_config, remat_policy="none"):
        super().__init__(options, model_config, remat_policy)
        self._teacher = None

    @property
    def teacher(self):
        """(model, params, tokenizer), loaded once."""
        if self._teacher is None:
            model, params, tokenizer = load_teacher(self.options.teacher)
            if type(model) is not MODEL_CLASSES["masked_lm"]:
                raise ObjectiveError(f"objective.teacher: {self.options.teacher} holds a {type(model).__name__}; "
                                     "distillation needs a masked-LM teacher")
            self._teacher = (model, params, tokenizer)
        return self._teacher

    def check_compatible(self) -> None:
        teacher_config = self.teacher[0].config
        student = self.model_config
        if teacher_config.vocab_size != student.vocab_size:
            raise ObjectiveError(f"objective.teacher: the teacher's vocabulary ({teacher_config.vocab_size} tokens) "
                                 f"differs from the student's ({student.vocab_size}); train the student with the "
                                 "teacher's tokenizer (leave tokenizer.path unset) and vocab_size")
        if self.options.student_init == "teacher_layers":
            # At setup, naming the key: a deeper student was refused only when the state was first created.
            try:
                mapping = teacher_layer_map(teacher_config.num_layers, student.num_layers)
            except ObjectiveError as error:
                raise ObjectiveError(f"objective.student_init=teacher_layers: {error}; lower model.overrides."
                                     "num_layers, or set objective.student_init: random") from None

            def kinds(config, layer):
                window = config.layer_window(layer)
                return "global" if window is None else f"window {window}"

            mismatched = [f"student layer {s} ({kinds(student, s)}) from teacher layer {t} ({kinds(teacher_config, t)})"
                          for s, t in enumerate(mapping) if kinds(student, s) != kinds(teacher_config, t)]
            if mismatched:  # ModernBERT's every-third-global pattern does not survive an even spacing
                log.warning("objective.student_init=teacher_layers copies layers into ones that attend otherwise: "
                            "%s; the copies start from weights trained for the other attention", "; ".join(mismatched))
        if teacher_config.hidden_size != student.hidden_size and self.options.alpha_cos > 0:
            raise ObjectiveError(f"objective.alpha_cos: the cosine loss compares hidden states, but the teacher's "
                                 f"hidden_size is {teacher_config.hidden_size} and the student's {student.hidden_size}"
                                 "; set objective.alpha_cos: 0 or match the sizes")

    def check_data(self, data_config, produced, where):
        super().check_data(data_config, produced, where)
        from bertjax.models.inputs import position_limit

        teacher = self.teacher[0].config
        limit = position_limit(teacher)
        if limit is not None and data_config.seq_len + teacher.position_offset > limit:
            raise ObjectiveError(f"{where}.seq_len ({data_config.seq_len}) does not fit the teacher's "
                                 f"max_position_embeddings ({teacher.max_position_embeddings}, objective.teacher "
                                 f"{self.options.teacher}): the teacher reads every row the student does")

    def frozen_description(self):
        from bertjax.models.params import params_fingerprint

        model, params, _ = self.teacher
        teacher = self.options.teacher
        return {"teacher": teacher if "://" in teacher else str(Path(teacher).resolve()),
                "fingerprint": params_fingerprint(params, repr(model.config))}

    # -- parameters ---------------------------------------------------------------------------------------------
    def frozen_params(self, mesh, abstract=False):
        self.check_compatible()
        model, params, _ = self.teacher
        shapes = abstract_params(model)
        shardings = mesh_lib.logical_shardings(logical_axes(model), shapes, mesh)
        if abstract:
            placed = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), shapes, shardings)
        else:
            # From the host: a teacher read from a directory sits on this process's own device, and a put from
            # there onto a mesh spanning other hosts is a cross-host transfer the runtime refuses.
            placed = jax.device_put(jax.device_get(params), shardings)
        return {"teacher": placed}, {"teacher": shardings}

    def warm_start(self, params, frozen):
        """The student's first parameters: the teacher's where shapes allow (see `student_init`)."""
        if self.options.student_init == "random":
            return params
        teacher = traverse_util.flatten_dict(frozen["teacher"])
        student = traverse_util.flatten_dict(params)
        layer_map = teacher_layer_map(self.teacher[0].config.num_layers, self.model_config.num_layers)
        copied = {}
        for path, value in student.items():
            source = path
            if path[0] == "encoder" and path[1].startswith("layers_"):
                source = (path[0], f"layers_{layer_map[int(path[1].removeprefix('layers_'))]}", *path[2:])
            if source not in teacher or teacher[source].shape != value.shape:
                raise ObjectiveError(f"objective.student_init=teacher_layers: the student's {'/'.join(path)} "
                                     f"{value.shape} has no teacher parameter of that shape; use the teacher's "
                                     "preset with fewer layers, or student_init: random")
            copied[path] = teacher[source].astype(value.dtype)
        return traverse_util.unflatten_dict(copied)

    # -- loss ---------------------------------------------------------------------------------------------------
    def loss_sums(self, params, frozen, batch, key, deterministic):
        everywhere = self.options.soft_targets == "all_tokens"
        # With soft targets at every token both models score the vocabulary at every position, and the MLM loss
        # reads the masked slots out of the student's; otherwise both score the masked slots only.
        positions = None if everywhere else batch["masked_positions"]
        teacher_model = self.teacher[0]
        student = self.apply(params, batch, key, deterministic, every_token=everywhere)
        teacher = teacher_model.apply({"params": frozen["teacher"]}, **model_inputs(teacher_model.config, batch),
                                      masked_positions=positions, deterministic=True)
        teacher_logits = jax.lax.stop_gradient(teacher.logits.astype(jnp.float32))
        teacher_hidden = jax.lax.stop_gradient(teacher.last_hidden_state.astype(jnp.float32))
        weights = batch["masked_weights"].astype(jnp.float32)
        real = (batch["segment_ids"] > 0).astype(jnp.float32)
        t = self.options.temperature
        log_p_student = jax.nn.log_softmax(student.logits.astype(jnp.float32) / t, axis=-1)
        log_p_teacher = jax.nn.log_softmax(teacher_logits / t, axis=-1)
        kl = jnp.sum(jnp.exp(log_p_teacher) * (log_p_teacher - log_p_student), axis=-1)
        masked_logits = student.logits
        if everywhere:
            masked_logits = jnp.take_along_axis(student.logits, batch["masked_positions"][..., None], axis=1)
        mlm_loss, mlm_weight, mlm_correct = losses.mlm_sums(masked_logits, batch["masked_ids"], weights)
        h_student = student.last_hidden_state.astype(jnp.float32)
        if h_student.shape == teacher_hidden.shape:
            cosine = jnp.sum(h_student * teacher_hidden, -1) / jnp.maximum(
                jnp.linalg.norm(h_student, axis=-1) * jnp.linalg.norm(teacher_hidden, axis=-1), 1e-8)
            cosine_loss = jnp.sum((1.0 - cosine) * real)
        else:  # a narrower student: no cosine term (check_compatible requires alpha_cos 0 then)
            cosine_loss = jnp.zeros((), jnp.float32)
        return {"kl_loss": jnp.sum(kl * (real if everywhere else weights)) * t * t, "mlm_loss": mlm_loss,
                "mlm_weight": mlm_weight, "mlm_correct": mlm_correct, "cosine_loss": cosine_loss,
                "token_count": jnp.sum(real)}

    def normalisers(self, batch):
        return {"mlm_weight": losses.prediction_count(batch), "token_count": losses.real_token_count(batch)}

    def _kl_count(self) -> str:
        """The count the KL sum is averaged over: the tokens that carry soft targets."""
        return "token_count" if self.options.soft_targets == "all_tokens" else "mlm_weight"

    def loss(self, sums, norm):
        o = self.options
        return (o.alpha_ce * sums["kl_loss"] / norm[self._kl_count()]
                + o.alpha_mlm * sums["mlm_loss"] / norm["mlm_weight"]
                + o.alpha_cos * sums["cosine_loss"] / norm["token_count"])

    def metrics(self, sums):
        o = self.options
        out = {"kl_loss": losses.mean(sums["kl_loss"], sums[self._kl_count()]),
               "mlm_loss": losses.mean(sums["mlm_loss"], sums["mlm_weight"]),
               "mlm_accuracy": losses.mean(sums["mlm_correct"], sums["mlm_weight"]),
               "cosine_loss": losses.mean(sums["cosine_loss"], sums["token_count"])}
        out["loss"] = o.alpha_ce * out["kl_loss"] + o.alpha_mlm * out["mlm_loss"] + o.alpha_cos * out["cosine_loss"]
        return out

    def train_flops(self, *, seq_len, tokens, predictions, rows):
        if self.options.soft_targets == "all_tokens":
            predictions = tokens  # both models score the vocabulary at every token
        teacher_forward = flops_lib.mlm_forward_flops(self.teacher[0].config, seq_len=seq_len, tokens=tokens,
                                                      predictions=predictions)
        return super().train_flops(seq_len=seq_len, tokens=tokens, predictions=predictions, rows=rows) + \
            teacher_forward
