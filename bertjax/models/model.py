"""Top-level models. One backbone (embeddings + layer stack) shared by every head.

    model = EncoderForMaskedLM(get_config("modernbert-base"))
    params = model.init(jax.random.key(0), input_ids)["params"]
    out = model.apply({"params": params}, input_ids, attention_mask=mask)
    out.logits  # [batch, seq, vocab]
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from bertjax.config import EncoderConfig
from bertjax.models.embeddings import Embeddings
from bertjax.models.encoder import EncoderStack
from bertjax.models.heads import Classifier, MaskedLMHead, Pooler, ReplacedTokenHead
from bertjax.models.inputs import EncoderInputs, check_ids, prepare_inputs


@struct.dataclass
class EncoderOutput:
    last_hidden_state: jax.Array
    pooler_output: jax.Array | None = None


@struct.dataclass
class MaskedLMOutput:
    logits: jax.Array  # [batch, seq, vocab], or [batch, num_masked, vocab] when masked_positions is given
    last_hidden_state: jax.Array


@struct.dataclass
class PreTrainingOutput:
    logits: jax.Array
    nsp_logits: jax.Array  # [batch, 2]: is-next / not-next (or in-order / swapped for SOP)
    last_hidden_state: jax.Array


@struct.dataclass
class NextSentenceOutput:
    logits: jax.Array  # [batch, 2]: is-next / not-next
    last_hidden_state: jax.Array


@struct.dataclass
class ReplacedTokenOutput:
    logits: jax.Array  # [batch, seq] float32: > 0 means "this token was replaced"
    last_hidden_state: jax.Array


# attention_kind -> the layer stack running it, for kinds whose layers do not fit EncoderStack's one stream (XLNet's
# "two_stream" registers here when bertjax.models.xlnet is imported). These stacks also take the permutation inputs
# `perm_mask` and `target_mapping`.
STACKS: dict[str, type[nn.Module]] = {}
PERMUTATION_INPUTS = ("perm_mask", "target_mapping")


CALL_ARGUMENTS = """
    Called as `model.apply({"params": params}, input_ids, attention_mask=None, token_type_ids=None,
    position_ids=None, segment_ids=None, ..., deterministic=True)`:

      input_ids: int [batch, seq] token ids in [0, vocab_size).
      attention_mask: [batch, seq]; 0 makes a token absent (padding).
      token_type_ids: [batch, seq] ids in [0, type_vocab_size); only models with token types take them.
      position_ids: [batch, seq] rows of the position table; default: each segment's present tokens counted.
      segment_ids: [batch, seq] packed texts 1, 2, ... (tokens attend within their own); 0 marks padding.
      deterministic: True (the default) runs without dropout, as inference and transformers' eval() do. Dropout
        (config.dropout_rate, the task's classifier_dropout) runs only with `deterministic=False` and a key:
        `model.apply(variables, ..., deterministic=False, rngs={"dropout": key})`, a new key each step.
      global_attention_mask: [batch, seq] Longformer's global tokens (1 = global); other models refuse it.
"""


def with_call_arguments(cls):
    """Appends CALL_ARGUMENTS to a model class's docstring (what `help(model_class)` shows)."""
    cls.__doc__ = f"{(cls.__doc__ or '').rstrip()}\n{CALL_ARGUMENTS}"
    return cls


@with_call_arguments
class _Backbone(nn.Module):
    """Embeddings and layer stack; subclasses add heads. Parameters: embeddings/, encoder/, then head names."""

    config: EncoderConfig
    remat_policy: str = "none"

    def setup(self):
        self.embeddings = Embeddings(self.config)
        self.encoder = STACKS.get(self.config.attention_kind, EncoderStack)(self.config, self.remat_policy)

    def example_input_ids(self, seq_len: int = 1) -> jax.Array:
        """Zero token ids of the shape `__call__` takes (multiple choice adds a choices axis), for `init`."""
        return jnp.zeros((1, seq_len), jnp.int32)

    def encode(self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None, segment_ids=None,
               deterministic: bool = True, global_attention_mask=None) -> jax.Array:
        return self.encode_with_inputs(input_ids, attention_mask, token_type_ids, position_ids, segment_ids,
                                       deterministic, global_attention_mask=global_attention_mask)[0]

    def encode_with_inputs(self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None,
                           segment_ids=None, deterministic: bool = True, perm_mask=None,
                           target_mapping=None, global_attention_mask=None) -> tuple[jax.Array, EncoderInputs]:
        """The last hidden state and the prepared inputs (segment ids with padding folded in: heads pool on them).
        With XLNet's `target_mapping`, the query stream's output [batch, num_predict, hidden] instead.
        Longformer's `global_attention_mask` [batch, seq] (1 = global, as transformers names it) picks the tokens
        that attend, and are attended, globally; any other model refuses it."""
        if isinstance(deterministic, jax.core.Tracer):  # jax.jit(model.apply)(..., deterministic=True) traces it
            raise TypeError("deterministic is a traced value: it decides what the program computes, so make it "
                            "static: jax.jit(model.apply, static_argnames='deterministic'), or close over it")
        if not deterministic and _drops_out(self.config) and not self.has_rng("dropout"):
            # Flax's own error ("Dropout needs PRNG for dropout") names neither the argument nor the idiom.
            raise ValueError("deterministic=False runs dropout, which needs a random key: "
                             "model.apply(variables, ..., deterministic=False, rngs={'dropout': key})")
        inputs = prepare_inputs(self.config, input_ids, attention_mask, token_type_ids, position_ids, segment_ids,
                                global_attention_mask)
        given = {name: value for name, value in zip(PERMUTATION_INPUTS, (perm_mask, target_mapping))
                 if value is not None}
        if given and self.config.attention_kind not in STACKS:
            raise ValueError(f"{sorted(given)[0]} is an XLNet input (permutation language modelling); this model has "
                             f"attention_kind={self.config.attention_kind!r}, which has no query stream (XLNet's is "
                             "'two_stream')")
        return self.encoder(self.embeddings(inputs, deterministic), inputs, deterministic, **given), inputs


def _drops_out(config: EncoderConfig) -> bool:
    """Whether any dropout of the model (the encoder's, or a task head's classifier dropout) has a rate above 0."""
    task = config.task_or_default.classifier_dropout
    return config.dropout_rate > 0 or bool(task)


def gather_positions(hidden: jax.Array, positions: jax.Array | None) -> jax.Array:
    """hidden [batch, seq, dim] at positions [batch, num] -> [batch, num, dim]; all positions when None.

    Pretraining projects only the masked positions onto the vocabulary (static count per row, as original BERT's
    max_predictions_per_seq), which removes most of the largest matmul and its logits from the step.
    """
    if positions is None:
        return hidden
    shape = jnp.shape(positions)
    if len(shape) != 2 or shape[0] != hidden.shape[0]:
        raise ValueError(f"masked_positions must be [batch={hidden.shape[0]}, num] (indices into each row), got "
                         f"shape {shape}")
    dtype = positions.dtype if hasattr(positions, "dtype") else np.asarray(positions).dtype
    if not jnp.issubdtype(dtype, jnp.integer):
        raise ValueError(f"masked_positions must be integers, got {dtype}")
    # An index >= seq would gather a row of NaN and -1 the last token, silently: checked as the token ids are
    # (eagerly, or on the device inside bertjax.checked). Padding slots hold 0 (bertjax.data), a valid index.
    check_ids(positions, hidden.shape[1], "masked_positions", " (indices into the sequence)")
    return jnp.take_along_axis(hidden, jnp.asarray(positions, jnp.int32)[..., None], axis=1)


@with_call_arguments
class EncoderModel(_Backbone):
    """Bare encoder: `last_hidden_state` [batch, seq, hidden], and `pooler_output` [batch, hidden] (each row's first
    present token through the pooler) when the config has a pooler (transformers' BertModel, ...).

    XLNet: `perm_mask` [batch, seq, seq] and `target_mapping` [batch, num_predict, seq] as transformers takes them;
    with target_mapping, last_hidden_state is the query stream's [batch, num_predict, hidden].
    """

    def setup(self):
        super().setup()
        if self.config.pooler:
            self.pooler = Pooler(self.config)

    def __call__(self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None, segment_ids=None,
                 deterministic: bool = True, perm_mask=None, target_mapping=None,
                 global_attention_mask=None) -> EncoderOutput:
        hidden, inputs = self.encode_with_inputs(input_ids, attention_mask, token_type_ids, position_ids,
                                                 segment_ids, deterministic, perm_mask, target_mapping,
                                                 global_attention_mask)
        pooled = self.pooler(hidden, inputs.segment_ids) if self.config.pooler else None
        return EncoderOutput(last_hidden_state=hidden, pooler_output=pooled)


@with_call_arguments
class EncoderForMaskedLM(_Backbone):
    """Masked-LM head (transformers' BertForMaskedLM, ...): `logits` [batch, seq, vocab] float32, and the
    backbone's `last_hidden_state`.

    masked_positions: int [batch, num] indices into the sequence ([0, seq); padding slots 0): only those positions
    are projected onto the vocabulary, `logits` [batch, num, vocab]. XLNet also takes `perm_mask` and
    `target_mapping` (then `logits` [batch, num_predict, vocab], transformers' XLNetLMHeadModel).
    """

    def setup(self):
        super().setup()
        self.mlm_head = MaskedLMHead(self.config)

    def __call__(self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None, segment_ids=None,
                 masked_positions=None, deterministic: bool = True, perm_mask=None,
                 target_mapping=None, global_attention_mask=None) -> MaskedLMOutput:
        """XLNet: with `target_mapping` the head reads the query stream, so `logits` is [batch, num_predict, vocab]
        (transformers' XLNetLMHeadModel)."""
        if target_mapping is not None and masked_positions is not None:
            raise ValueError("give masked_positions or target_mapping, not both: target_mapping already picks the "
                             "predicted positions")
        hidden, _ = self.encode_with_inputs(input_ids, attention_mask, token_type_ids, position_ids, segment_ids,
                                            deterministic, perm_mask, target_mapping, global_attention_mask)
        logits = self.mlm_head(gather_positions(hidden, masked_positions), self.embeddings.attend)
        return MaskedLMOutput(logits=logits, last_hidden_state=hidden)


@with_call_arguments
class EncoderForPreTraining(_Backbone):
    """MLM plus next-sentence (or sentence-order) prediction from the pooled [CLS] state: `logits` as
    EncoderForMaskedLM's (`masked_positions` too), `nsp_logits` [batch, 2].
    """

    def setup(self):
        super().setup()
        self.mlm_head = MaskedLMHead(self.config)
        self.pooler = Pooler(self.config)
        self.nsp_head = Classifier(self.config, 2)

    def __call__(self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None, segment_ids=None,
                 masked_positions=None, deterministic: bool = True, global_attention_mask=None) -> PreTrainingOutput:
        hidden, inputs = self.encode_with_inputs(input_ids, attention_mask, token_type_ids, position_ids,
                                                 segment_ids, deterministic,
                                                 global_attention_mask=global_attention_mask)
        logits = self.mlm_head(gather_positions(hidden, masked_positions), self.embeddings.attend)
        return PreTrainingOutput(logits=logits, nsp_logits=self.nsp_head(self.pooler(hidden, inputs.segment_ids)),
                                 last_hidden_state=hidden)


@with_call_arguments
class EncoderForNextSentencePrediction(_Backbone):
    """The next-sentence classifier alone (transformers' BertForNextSentencePrediction): the pretraining model's
    pooler and NSP head, under the same parameter names, without the MLM head."""

    def setup(self):
        super().setup()
        self.pooler = Pooler(self.config)
        self.nsp_head = Classifier(self.config, 2)

    def __call__(self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None, segment_ids=None,
                 deterministic: bool = True, global_attention_mask=None) -> NextSentenceOutput:
        hidden, inputs = self.encode_with_inputs(input_ids, attention_mask, token_type_ids, position_ids,
                                                 segment_ids, deterministic,
                                                 global_attention_mask=global_attention_mask)
        return NextSentenceOutput(logits=self.nsp_head(self.pooler(hidden, inputs.segment_ids)),
                                  last_hidden_state=hidden)


@with_call_arguments
class EncoderForReplacedTokenDetection(_Backbone):
    """ELECTRA's discriminator (transformers' ElectraForPreTraining): one replaced-token logit for every token.

    The ELECTRA objective scores all real tokens, so there is no `masked_positions`; padding positions get a
    logit too and the loss masks them.
    """

    def setup(self):
        super().setup()
        self.rtd_head = ReplacedTokenHead(self.config)

    def __call__(self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None, segment_ids=None,
                 deterministic: bool = True, global_attention_mask=None) -> ReplacedTokenOutput:
        hidden = self.encode(input_ids, attention_mask, token_type_ids, position_ids, segment_ids, deterministic,
                             global_attention_mask)
        return ReplacedTokenOutput(logits=self.rtd_head(hidden), last_hidden_state=hidden)


# Model classes by head name: the CLI, checkpoint import and training pick one here. The fine-tuning heads
# (bertjax/models/task_models.py) add themselves when bertjax.models is imported.
MODEL_CLASSES: dict[str, type[_Backbone]] = {
    "encoder": EncoderModel,
    "masked_lm": EncoderForMaskedLM,
    "pretraining": EncoderForPreTraining,
    "next_sentence": EncoderForNextSentencePrediction,
    "replaced_token_detection": EncoderForReplacedTokenDetection,
}
