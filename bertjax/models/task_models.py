"""Fine-tuning models: the shared backbone with a task head, output fields named as in transformers.

    config = get_config("bert-base", task=TaskConfig(num_labels=3))
    model = EncoderForSequenceClassification(config)
    out = model.apply({"params": params}, input_ids, attention_mask=mask)
    out.logits  # [batch, 3] float32

Packed rows: pass `segment_ids` (1, 2, ... per example, 0 = padding) and a static `max_segments=K`; sequence
classification then returns `logits` [batch, K, num_labels] and `segment_mask` [batch, K] (slot k = segment k + 1;
empty slots are zeros); `max_segments` fixes a shape, so under `jax.jit` pass it in `static_argnames`. Token
classification and QA are per token and need nothing special; multiple choice takes [batch, choices, seq] inputs
(initialise it with `model.example_input_ids(seq_len)`, which has the choices axis).

Parameters: embeddings/, encoder/, then `classifier/` (dense, norm, out as the family's layout has them).
"""

from __future__ import annotations

import contextlib
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from bertjax.models.model import MODEL_CLASSES, _Backbone, with_call_arguments
from bertjax.models.task_heads import SequenceHead, TokenHead


@struct.dataclass
class SequenceClassifierOutput:
    logits: jax.Array  # [batch, num_labels] float32; [batch, max_segments, num_labels] for packed rows
    last_hidden_state: jax.Array
    segment_mask: jax.Array | None = None  # [batch, max_segments] bool, only with max_segments


@struct.dataclass
class TokenClassifierOutput:
    logits: jax.Array  # [batch, seq, num_labels] float32
    last_hidden_state: jax.Array


@struct.dataclass
class QuestionAnsweringOutput:
    start_logits: jax.Array  # [batch, seq] float32
    end_logits: jax.Array  # [batch, seq] float32
    last_hidden_state: jax.Array


@struct.dataclass
class MultipleChoiceOutput:
    logits: jax.Array  # [batch, choices] float32
    last_hidden_state: jax.Array  # [batch, choices, seq, hidden]


def segment_starts(input_ids, attention_mask=None, segment_ids=None) -> jax.Array:
    """int32 [batch, seq]: 1 on the first token of every segment (of the row when unpacked), 0 elsewhere."""
    input_ids = jnp.asarray(input_ids)
    segments = jnp.ones(input_ids.shape, jnp.int32) if segment_ids is None else jnp.asarray(segment_ids, jnp.int32)
    if attention_mask is not None:
        segments = segments * (jnp.asarray(attention_mask) != 0)
    previous = jnp.pad(segments[:, :-1], ((0, 0), (1, 0)))
    return ((segments != previous) & (segments != 0)).astype(jnp.int32)


def around_first_separator(input_ids, sep_token_id: int, before: bool) -> jax.Array:
    """transformers' Longformer default global attention for QA (`before`: the question, tokens before the first
    separator) and multiple choice (the choice: tokens after the separator pair that follows the question). A
    single separator there (a BERT-style template, as bertjax's own tokenizer lays pairs out) is skipped alone, so
    the choice's first token stays global; RoBERTa's `</s></s>` gives transformers' positions exactly."""
    input_ids = jnp.asarray(input_ids)
    first = jnp.argmax(input_ids == sep_token_id, axis=-1)[..., None]  # 0 when a row has no separator
    positions = jnp.arange(input_ids.shape[-1])
    if before:
        return (positions < first).astype(jnp.int32)
    following = jnp.take_along_axis(input_ids, jnp.minimum(first + 1, input_ids.shape[-1] - 1), axis=-1)
    return (positions > first + (following == sep_token_id)).astype(jnp.int32)


@with_call_arguments
class EncoderForSequenceClassification(_Backbone):
    """Sequence classification or regression (num_labels=1): one prediction per row, or per packed segment.

    `logits` [batch, num_labels] float32; with `max_segments=K` (a static Python int: `static_argnames` under
    jax.jit) and `segment_ids` 1..K, one per packed segment: `logits` [batch, K, num_labels] and `segment_mask`
    [batch, K].
    """

    @classmethod
    def default_global_attention(cls, config, input_ids, attention_mask=None, segment_ids=None):
        """Longformer: the global attention mask this head gives itself when the caller passes none."""
        return segment_starts(input_ids, attention_mask, segment_ids)

    def setup(self):
        super().setup()
        self.classifier = SequenceHead(self.config, self.config.task_or_default.num_labels)

    def __call__(self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None, segment_ids=None,
                 max_segments: int | None = None, deterministic: bool = True,
                 global_attention_mask=None) -> SequenceClassifierOutput:
        """Longformer: without a `global_attention_mask`, the first token of every segment (the pooled <s>) is global,
        as transformers' LongformerForSequenceClassification puts global attention on the first token."""
        if global_attention_mask is None and self.config.longformer is not None:
            global_attention_mask = self.default_global_attention(self.config, input_ids, attention_mask,
                                                                  segment_ids)
        hidden, inputs = self.encode_with_inputs(input_ids, attention_mask, token_type_ids, position_ids,
                                                 segment_ids, deterministic,
                                                 global_attention_mask=global_attention_mask)
        logits, segment_mask = self.classifier(hidden, inputs.segment_ids, max_segments, deterministic)
        if max_segments is None:
            return SequenceClassifierOutput(logits=logits[:, 0], last_hidden_state=hidden)
        return SequenceClassifierOutput(logits=logits, last_hidden_state=hidden, segment_mask=segment_mask)


@with_call_arguments
class EncoderForTokenClassification(_Backbone):
    """One label per token (named entities, tagging); padding positions get logits too and the loss masks them."""

    def setup(self):
        super().setup()
        self.classifier = TokenHead(self.config, self.config.task_or_default.num_labels)

    def __call__(self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None, segment_ids=None,
                 deterministic: bool = True, global_attention_mask=None) -> TokenClassifierOutput:
        hidden = self.encode(input_ids, attention_mask, token_type_ids, position_ids, segment_ids, deterministic,
                             global_attention_mask)
        return TokenClassifierOutput(logits=self.classifier(hidden, deterministic), last_hidden_state=hidden)


@with_call_arguments
class EncoderForQuestionAnswering(_Backbone):
    """Extractive QA: a start and an end logit per token (transformers' `qa_outputs`, 2 outputs)."""

    @classmethod
    def default_global_attention(cls, config, input_ids, attention_mask=None, segment_ids=None):
        """Longformer: the global attention mask this head gives itself when the caller passes none."""
        return around_first_separator(input_ids, config.longformer.sep_token_id, True)

    def setup(self):
        super().setup()
        self.classifier = TokenHead(self.config, 2, question_answering=True)

    def __call__(self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None, segment_ids=None,
                 deterministic: bool = True, global_attention_mask=None) -> QuestionAnsweringOutput:
        """Longformer: without a `global_attention_mask`, the question (tokens before the first separator) is
        global, as transformers' LongformerForQuestionAnswering does."""
        if global_attention_mask is None and self.config.longformer is not None:
            global_attention_mask = self.default_global_attention(self.config, input_ids, attention_mask,
                                                                  segment_ids)
        hidden = self.encode(input_ids, attention_mask, token_type_ids, position_ids, segment_ids, deterministic,
                             global_attention_mask)
        logits = self.classifier(hidden, deterministic)
        return QuestionAnsweringOutput(start_logits=logits[..., 0], end_logits=logits[..., 1],
                                       last_hidden_state=hidden)


@with_call_arguments
class EncoderForMultipleChoice(_Backbone):
    """Inputs [batch, choices, seq]; each choice is encoded as its own row and scored by one logit."""

    @classmethod
    def default_global_attention(cls, config, input_ids, attention_mask=None, segment_ids=None):
        """Longformer: the global attention mask this head gives itself when the caller passes none."""
        return around_first_separator(input_ids, config.longformer.sep_token_id, False)

    def setup(self):
        super().setup()
        self.classifier = SequenceHead(self.config, 1, multiple_choice=True)

    def example_input_ids(self, seq_len: int = 1) -> jax.Array:
        return jnp.zeros((1, 1, seq_len), jnp.int32)

    def __call__(self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None, segment_ids=None,
                 deterministic: bool = True, global_attention_mask=None) -> MultipleChoiceOutput:
        """Longformer: without a `global_attention_mask`, each choice's answer tokens (after the separator pair
        that follows the question) are global, as transformers' LongformerForMultipleChoice does."""
        if not isinstance(input_ids, jax.Array):  # as given: an int32 cast here would wrap an int64 id past the check
            input_ids = np.asarray(input_ids)
        if global_attention_mask is None and self.config.longformer is not None:
            global_attention_mask = self.default_global_attention(self.config, input_ids, attention_mask,
                                                                  segment_ids)
        if input_ids.ndim != 3:
            raise ValueError(f"multiple choice input_ids must be [batch, choices, seq], got shape {input_ids.shape}")
        batch, choices, seq = input_ids.shape

        def rows(x):
            if x is None:
                return None
            if jnp.shape(x) != (batch, choices, seq):
                raise ValueError(f"multiple choice inputs must all have shape {(batch, choices, seq)}, "
                                 f"got {jnp.shape(x)}")
            return jnp.reshape(x, (batch * choices, seq))

        hidden, inputs = self.encode_with_inputs(rows(input_ids), rows(attention_mask), rows(token_type_ids),
                                                 rows(position_ids), rows(segment_ids), deterministic,
                                                 global_attention_mask=rows(global_attention_mask))
        logits, _ = self.classifier(hidden, inputs.segment_ids, None, deterministic)
        return MultipleChoiceOutput(logits=logits.reshape(batch, choices),
                                    last_hidden_state=hidden.reshape(batch, choices, seq, -1))


MODEL_CLASSES.update({
    "sequence_classification": EncoderForSequenceClassification,
    "token_classification": EncoderForTokenClassification,
    "question_answering": EncoderForQuestionAnswering,
    "multiple_choice": EncoderForMultipleChoice,
})
# The heads the fine-tuning code and the Hugging Face task mappings know.
TASK_HEADS = ("sequence_classification", "token_classification", "question_answering", "multiple_choice")


def with_global_token_bound(model, *datasets: dict[str, np.ndarray]):
    """`model` with `longformer.max_global_tokens` set to the most global tokens a row of `datasets` (arrays with
    input_ids and segment_ids, as fine-tuning encodes them) gets from the head's default mask; `model` itself when
    it is no Longformer task head with such a mask, or when its own bound holds them.

    Under jax.jit the mask is traced, and without a static bound every position would be a global slot: a
    [seq, seq] program for a handful of global tokens. The data is known before the steps compile, so its count is
    the bound. A bound of the model's own that the data exceeds is an error: under jit the global tokens past it
    would be dropped in silence."""
    longformer = model.config.longformer
    make_mask = getattr(type(model), "default_global_attention", None)
    if longformer is None or make_mask is None:
        return model
    most = 1
    with _on_host():  # host data: the masks need no accelerator memory
        for arrays in datasets:
            ids, segments = np.asarray(arrays["input_ids"]), np.asarray(arrays["segment_ids"])
            if ids.size:
                flags = np.asarray(make_mask(model.config, ids, None, segments)) != 0
                most = max(most, int((flags & (segments != 0)).reshape(-1, ids.shape[-1]).sum(axis=1).max()))
    bound = longformer.max_global_tokens
    if bound is not None:
        if most > bound:
            raise ValueError(f"a row of the data has {most} global tokens (the {type(model).__name__} default "
                             f"mask), more than the model's longformer.max_global_tokens={bound}: raise it to "
                             f"{most} or more in its model config")
        return model
    bounded = model.config.replace(longformer=dataclasses.replace(longformer, max_global_tokens=most))
    return model.clone(config=bounded)


def _on_host():
    try:
        return jax.default_device(jax.devices("cpu")[0])
    except RuntimeError:  # JAX_PLATFORMS without cpu
        return contextlib.nullcontext()
