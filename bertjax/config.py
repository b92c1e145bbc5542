"""One typed, frozen configuration for every encoder of the BERT family.

Each architectural difference between family members is one field here, read in one place in `bertjax.models`.
`docs/variants.md` maps every field to every family member. Presets are plain `EncoderConfig` values registered
by name; `get_config("modernbert-base", num_layers=2)` returns a preset with fields replaced.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from bertjax.typecheck import check_field_types

NormKind = Literal["layernorm", "rmsnorm"]
NormPlacement = Literal["post", "pre"]
# Keys of bertjax.ops.normalize.IMPLEMENTATIONS (tests/test_norm_kernels.py checks they agree).
NormImplementation = Literal["xla", "pallas_gpu"]
# Keys of bertjax.ops.glu.IMPLEMENTATIONS (tests/test_glu_kernels.py checks they agree).
GluImplementation = Literal["xla", "pallas_gpu"]
Activation = Literal["gelu", "gelu_tanh", "relu", "silu", "tanh"]
MlpKind = Literal["dense", "glu"]
PositionKind = Literal["learned", "sinusoidal", "rope", "alibi", "none"]  # "alibi": MosaicBERT (no table)
DType = Literal["float32", "bfloat16", "float16"]
ProblemType = Literal["single_label_classification", "multi_label_classification", "regression"]
# How a sequence head turns a segment's token states into one prediction: the first token ("cls"; EuroBERT calls it
# "bos"), the mean of the token states ("mean"), or the mean of per-token logits ("late", EuroBERT's default).
ClassifierPooling = Literal["cls", "mean", "late", "last"]  # "last": the last token (XLNet's <cls>)
RelativeTerm = Literal["c2p", "p2c"]
DisentangledImplementation = Literal["auto", "dense", "blockwise", "pallas_gpu"]
MAX_VOCAB_SIZE = 2**31 - 1  # the int32 ids' range


def _sub_config_from_dict(cls, values: dict, tuple_fields: tuple[str, ...] = ()):
    """A nested config from a JSON/YAML mapping: unknown keys are an error naming them; lists become the tuples the
    frozen dataclass holds (JSON and YAML have no tuples)."""
    unknown = set(values) - {f.name for f in dataclasses.fields(cls)}
    if unknown:
        raise ValueError(f"{cls.__name__} has no field(s) {sorted(unknown)}")
    values = dict(values)
    for name in tuple_fields:
        if isinstance(values.get(name), list):
            values[name] = tuple(values[name])
    return cls(**values)


# The pooling of a family's sequence heads when TaskConfig.classifier_pooling is None, as its transformers config
# class defaults (XLNet's sequence summary takes the last token, EuroBERT pools "late"); other families: the first.
FAMILY_POOLING = {"xlnet": "last", "eurobert": "late"}


@dataclasses.dataclass(frozen=True)
class TaskConfig:
    """What a fine-tuning head predicts: `EncoderConfig.task`. Only the task-head models read it.

    Label names are a tuple (the config is a jit static argument, so it must hash); `id2label` and `label2id` give
    transformers' dicts. A Hugging Face config.json round-trips through `num_labels`, `id2label`, `label2id`,
    `problem_type`, the family's classifier dropout key and (ModernBERT, EuroBERT) `classifier_pooling`.
    """

    num_labels: int = 2  # question answering always predicts 2 (start, end); multiple choice 1 per choice
    labels: tuple[str, ...] | None = None  # name of label i; None: transformers' "LABEL_0", "LABEL_1", ...
    problem_type: ProblemType | None = None  # None: inferred by the trainer (transformers does the same)
    classifier_dropout: float | None = None  # None: the encoder's dropout_rate
    classifier_pooling: ClassifierPooling | None = None  # None: the family's (EncoderConfig.classifier_pooling)

    def __post_init__(self) -> None:
        check_field_types(self)
        if self.num_labels <= 0:
            raise ValueError(f"TaskConfig.num_labels must be positive, got {self.num_labels}")
        if self.labels is not None:
            if len(self.labels) != self.num_labels:
                raise ValueError(f"TaskConfig.labels has {len(self.labels)} names for num_labels={self.num_labels}")
            if len(set(self.labels)) != len(self.labels):
                raise ValueError(f"TaskConfig.labels must be distinct, got {self.labels}")
        if self.classifier_dropout is not None and not 0.0 <= self.classifier_dropout < 1.0:
            raise ValueError(f"TaskConfig.classifier_dropout must be in [0, 1) or None, got {self.classifier_dropout}")

    @property
    def label_names(self) -> tuple[str, ...]:
        return self.labels if self.labels is not None else tuple(f"LABEL_{i}" for i in range(self.num_labels))

    @property
    def id2label(self) -> dict[int, str]:
        return dict(enumerate(self.label_names))

    @property
    def label2id(self) -> dict[str, int]:
        return {name: i for i, name in enumerate(self.label_names)}

    def replace(self, **changes) -> "TaskConfig":
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ValueError(f"TaskConfig has no field(s) {sorted(unknown)}")
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_dict(cls, values: dict) -> "TaskConfig":
        return _sub_config_from_dict(cls, values, tuple_fields=("labels",))


@dataclasses.dataclass(frozen=True)
class XLNetOptions:
    """XLNet's knobs (`EncoderConfig.xlnet`, set with attention_kind="two_stream"); nothing else reads them.

    XLNet has no absolute positions: attention scores add a term over sinusoidal encodings of the relative
    distance i - j, clamped to [-clamp_len, clamp_len] when clamp_len > 0 (transformers' `clamp_len`; -1 in the
    published configs: no clamp). Token types enter only as "same segment or not" inside attention.
    """

    clamp_len: int = -1

    def __post_init__(self) -> None:
        check_field_types(self)

    @classmethod
    def from_dict(cls, values: dict) -> "XLNetOptions":
        return _sub_config_from_dict(cls, values)


@dataclasses.dataclass(frozen=True)
class DisentangledAttentionConfig:
    """DeBERTa's knobs: `EncoderConfig.disentangled`, read by the "disentangled" attention kind, the relative
    embedding table the stack builds once per forward, v2's convolution after the first layer and DeBERTa's
    embedding layout (factorised projection before the norm, padding rows zeroed).

    The relative table has 2 * span rows, span = position_buckets when > 0, else max_relative_positions; distances
    beyond it clamp to the last row, so any sequence length can be represented.
    """

    pos_att_type: tuple[RelativeTerm, ...] = ("p2c", "c2p")  # which relative terms add to q.k (any subset)
    max_relative_positions: int = 512  # the longest distance the log buckets resolve (HF -1: max_position_embeddings)
    position_buckets: int = 0  # > 0: log-bucketed distances (DeBERTa-v2/v3); 0: distances clamped at the span
    share_att_key: bool = False  # project relative embeddings with the content query/key kernels (v2/v3)
    norm_rel_ebd: bool = False  # LayerNorm on the relative embeddings (HF norm_rel_ebd="layer_norm")
    conv_kernel_size: int = 0  # > 0: v2's convolution over the embeddings after the first layer
    conv_act: Activation = "tanh"
    conv_groups: int = 1
    fused_qkv: bool = False  # DeBERTa v1: one bias-free in_proj for q, k, v plus separate q_bias and v_bias
    # Hugging Face tensor names only: True writes the MLM head as `cls.predictions.*`, False as
    # `lm_predictions.lm_head.*` (the `legacy` key); the math is the same.
    legacy_mlm_head: bool = True
    # "auto": the Pallas kernel on GPU; elsewhere dense up to block_size * 4 tokens, else blockwise
    implementation: DisentangledImplementation = "auto"
    block_size: int = 128  # queries per step of the blockwise path; pallas_gpu tiles are min(block_size, 32) wide

    def __post_init__(self) -> None:
        check_field_types(self)
        if len(set(self.pos_att_type)) != len(self.pos_att_type):
            raise ValueError(f"DisentangledAttentionConfig.pos_att_type repeats a term: {self.pos_att_type}")
        for name in ("max_relative_positions", "block_size", "conv_groups"):
            if getattr(self, name) <= 0:
                raise ValueError(f"DisentangledAttentionConfig.{name} must be positive, got {getattr(self, name)}")
        if self.position_buckets < 0 or self.position_buckets == 1:
            raise ValueError(f"DisentangledAttentionConfig.position_buckets must be 0 (off) or >= 2, got "
                             f"{self.position_buckets}")
        if self.position_buckets and self.max_relative_positions <= self.position_buckets // 2 + 1:
            raise ValueError(f"DisentangledAttentionConfig.max_relative_positions ({self.max_relative_positions}) "
                             f"must exceed position_buckets // 2 + 1 ({self.position_buckets // 2 + 1})")
        if self.conv_kernel_size < 0 or (self.conv_kernel_size and self.conv_kernel_size % 2 == 0):
            raise ValueError(f"DisentangledAttentionConfig.conv_kernel_size must be 0 or odd (a same-length "
                             f"convolution), got {self.conv_kernel_size}")
        if self.fused_qkv and self.share_att_key:
            raise ValueError("DisentangledAttentionConfig.fused_qkv (DeBERTa v1) has no share_att_key")

    @property
    def span(self) -> int:
        """Half the number of rows of the relative embedding table."""
        return self.position_buckets if self.position_buckets > 0 else self.max_relative_positions

    def replace(self, **changes) -> "DisentangledAttentionConfig":
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ValueError(f"DisentangledAttentionConfig has no field(s) {sorted(unknown)}")
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_dict(cls, values: dict) -> "DisentangledAttentionConfig":
        return _sub_config_from_dict(cls, values, tuple_fields=("pos_att_type",))


@dataclasses.dataclass(frozen=True)
class LongformerOptions:
    """Longformer's knobs (`EncoderConfig.longformer`, set exactly when attention_kind="longformer").

    Every layer attends in a sliding window (|i - j| <= window // 2) and a few tokens, chosen per input with the
    model input `global_attention_mask`, attend and are attended globally, with their own query/key/value
    projections (transformers' query_global, key_global, value_global). `attention_window` is transformers' key:
    one even int for every layer, or one per layer.
    """

    attention_window: int | tuple[int, ...] = 512
    # At most this many global tokens per row (static, so under jit the global rows are a [max_global_tokens, seq]
    # computation, not [seq, seq]). None: as many as the concrete input has, and every position when the mask is
    # traced (correct for any mask, but quadratic in the sequence length).
    max_global_tokens: int | None = None
    # transformers' sep_token_id: question answering and multiple choice put global attention on the question
    # (tokens before the first separator) or on the choice (tokens after the second) when no mask is given.
    sep_token_id: int = 2

    def __post_init__(self) -> None:
        check_field_types(self)
        windows = self.attention_window if isinstance(self.attention_window, tuple) else (self.attention_window,)
        if not windows:
            raise ValueError("LongformerOptions.attention_window must name at least one window")
        for i, window in enumerate(windows):
            where = f"attention_window[{i}]" if isinstance(self.attention_window, tuple) else "attention_window"
            if window <= 0 or window % 2:
                raise ValueError(f"LongformerOptions.{where}={window} must be positive and even (transformers requires "
                                 "even windows: a token sees window // 2 tokens either side)")
        if self.max_global_tokens is not None and self.max_global_tokens <= 0:
            raise ValueError(f"LongformerOptions.max_global_tokens must be positive or None, got "
                             f"{self.max_global_tokens}")

    def window(self, layer: int) -> int:
        """The attention window of one layer."""
        return self.attention_window[layer] if isinstance(self.attention_window, tuple) else self.attention_window

    @classmethod
    def from_dict(cls, values: dict) -> "LongformerOptions":
        return _sub_config_from_dict(cls, values, tuple_fields=("attention_window",))


def alibi_slopes(num_heads: int) -> tuple[float, ...]:
    """ALiBi's per-head slopes (Press et al. 2022, as MosaicBERT computes them): 2^(-8 i / n) for i = 1..n when n
    is a power of two; otherwise the slopes of the closest smaller power of two p, then every other slope of 2p."""
    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    closest = 2 ** (num_heads.bit_length() - 1)
    slopes = power_of_two(closest)
    if closest < num_heads:
        slopes += power_of_two(2 * closest)[0::2][:num_heads - closest]
    return tuple(slopes)


# The model is traced layer by layer in Python (~50 ms each), so a config claiming a million layers would trace for
# hours. Weights files are compared with the layer count before tracing; this bounds what no file can contradict
# (ALBERT's steps over shared layers, a fresh run). Published encoders have tens of layers.
MAX_LAYERS = 1024


@dataclasses.dataclass(frozen=True)
class EncoderConfig:
    """Architecture of one encoder. Frozen and hashable, so it can be a static argument of `jax.jit`."""

    # Sizes.
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    num_kv_heads: int | None = None  # None: same as num_heads (MHA); fewer: grouped-query attention.
    embedding_size: int | None = None  # None: same as hidden_size; smaller: factorised embedding (ALBERT, ELECTRA).
    # Longest sequence the model accepts where positions index a table (or RoPE, XLNet); ALiBi and DeBERTa-v3's
    # clamped relative positions take any length (bertjax.models.inputs.position_limit).
    max_position_embeddings: int = 512
    # ELECTRA/EuroBERT knob: width of one attention head. None: hidden_size // num_heads. EuroBERT's
    # config allows any head_dim, so q/k/v project to num_heads * attention_head_dim, not to hidden_size.
    attention_head_dim: int | None = None
    type_vocab_size: int = 2  # 0: no token-type embedding (RoBERTa keeps 1, ModernBERT has none).

    # Which Hugging Face family (transformers `model_type`) this architecture is: export writes that family's
    # checkpoint and refuses knobs it cannot express; import sets it from config.json. Never changes the math.
    # Names: "bert", "roberta", "modernbert", "albert", "distilbert", ... (keys of bertjax.hf.registry.FAMILIES).
    family: str = "bert"

    # Positions. "sinusoidal": DistilBERT's fixed (not trained) sin/cos table, computed, not a parameter.
    position_embedding: PositionKind = "learned"
    position_offset: int = 0  # learned positions start here (RoBERTa: pad_token_id + 1).
    rope_theta_global: float = 10_000.0
    rope_theta_local: float = 10_000.0

    # Normalisation.
    norm: NormKind = "layernorm"
    norm_eps: float = 1e-12
    norm_bias: bool = True
    norm_placement: NormPlacement = "post"
    embedding_norm: bool = True
    final_norm: bool = False
    # How every norm runs (with the residual add before it where the layer has one); never changes the math.
    # "pallas_gpu": bertjax's Triton kernel that reads and writes each row once each way (GPU only; interpret
    # mode elsewhere with norm_interpret).
    norm_implementation: NormImplementation = "xla"
    norm_interpret: bool = False
    first_layer_attention_norm: bool = True  # ModernBERT's layer 0 has no attention pre-norm (the embedding norm).

    # Linear layers and feed-forward.
    attention_bias: bool = True
    mlp_bias: bool = True
    # The up-projection's bias (`wi`, or a GLU's `wi_0` and `wi_1`) when it differs from the output's; None: mlp_bias.
    # MosaicBERT's `gated_layers` has none while its `wo` has one.
    mlp_up_bias: bool | None = None
    activation: Activation = "gelu"  # "gelu" is the exact erf GELU, as Hugging Face's "gelu".
    mlp: MlpKind = "dense"  # "glu": act(x W0) * (x W1) -> GeGLU with gelu, SwiGLU with silu.
    # How a gated MLP's act(a) * b runs (bertjax.ops.glu); never changes the math. "pallas_gpu": bertjax's Triton
    # kernel that reads the stacked up-projection once each way (GPU only; interpret mode elsewhere with
    # glu_interpret).
    glu_implementation: GluImplementation = "xla"
    glu_interpret: bool = False

    # Attention pattern: layer i is global if i % global_attention_every == 0, else local.
    global_attention_every: int = 1
    local_window: int | None = None  # total window; a token sees |i - j| <= local_window // 2.
    # Which attention module every layer uses: a key of bertjax.models.attention.ATTENTION_MODULES ("standard":
    # softmax(q.k) within segments and windows; family-specific kinds such as DeBERTa's disentangled attention add
    # themselves there). The kernel under it is attention_implementation.
    attention_kind: str = "standard"
    attention_implementation: str = "auto"  # a name in bertjax.ops.attention.IMPLEMENTATIONS, or "auto".
    attention_interpret: bool = False  # run Pallas attention kernels in interpret mode (CPU tests, debugging).
    # RoPE models without GQA: q, k and v stay one stacked projection into attention (bertjax.ops.rope_attention),
    # so pallas_gpu's kernels read v from it and write its gradient whole; never changes the math.
    attention_fused_qkv: bool = False

    # Layer sharing (ALBERT): num_layers steps computed by this many distinct parameter groups (HF
    # num_hidden_groups); step i uses group int(i / (num_layers / groups)), as transformers does.
    num_layer_groups: int | None = None
    # Distinct layers inside each group, applied one after the other at every step (HF ALBERT inner_group_num):
    # the stack applies num_layers * layers_per_group layers.
    layers_per_group: int = 1

    # Heads.
    tie_word_embeddings: bool = True
    decoder_bias: bool = True
    head_dense_bias: bool = True
    head_activation: Activation = "gelu"
    # ELECTRA/EuroBERT knob: False drops the MLM head's dense -> activation -> norm transform, so the decoder
    # reads the last hidden state directly (EuroBERT's lm_head is one linear layer after the final norm).
    mlm_head_transform: bool = True
    pooler: bool = True  # BertModel/RobertaModel carry a [CLS] tanh pooler; ModernBERT does not.
    # Fine-tuning heads (bertjax.models.task_models): pooled state -> dense -> classifier_activation -> [norm] ->
    # classifier. The activation is the family's: tanh (BERT's pooler, RoBERTa, ALBERT), gelu (ELECTRA, EuroBERT),
    # relu (DistilBERT), ModernBERT's classifier_activation. ModernBERT alone adds a norm (`classifier_norm`) and
    # runs the same dense -> act -> norm before its token-classification and QA classifiers
    # (`classifier_token_transform`). The dense layer's bias follows head_dense_bias.
    classifier_activation: Activation = "tanh"
    classifier_norm: bool = False
    classifier_token_transform: bool = False
    # What the task head predicts (labels, pooling); None outside fine-tuning (task models then use TaskConfig()).
    task: TaskConfig | None = None
    # XLNet's knobs; set exactly when attention_kind == "two_stream" (bertjax/models/xlnet).
    xlnet: XLNetOptions | None = None
    # DeBERTa's disentangled attention and embedding layout; set exactly when attention_kind="disentangled".
    disentangled: DisentangledAttentionConfig | None = None
    # Longformer's windows and global-token bound; set exactly when attention_kind="longformer".
    longformer: LongformerOptions | None = None

    # Special tokens.
    pad_token_id: int = 0

    # Training-time behaviour.
    dropout_rate: float = 0.0
    initializer_range: float = 0.02
    dtype: DType = "float32"  # computation dtype
    param_dtype: DType = "float32"

    def __post_init__(self) -> None:
        check_field_types(self)
        positive = ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size",
                    "max_position_embeddings", "global_attention_every", "layers_per_group")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"EncoderConfig.{name} must be positive, got {getattr(self, name)}")
        if self.num_layers > MAX_LAYERS:
            raise ValueError(f"EncoderConfig.num_layers must be at most {MAX_LAYERS}, got {self.num_layers}")
        from bertjax.ops.attention import IMPLEMENTATIONS  # the registry; imports no kernel

        if self.attention_implementation not in ("auto", *IMPLEMENTATIONS):
            raise ValueError(f"EncoderConfig.attention_implementation must be 'auto' or one of "
                             f"{sorted(IMPLEMENTATIONS)}, got {self.attention_implementation!r}")
        if self.attention_head_dim is not None and self.attention_head_dim <= 0:
            raise ValueError(f"EncoderConfig.attention_head_dim must be positive or None, got "
                             f"{self.attention_head_dim}")
        if self.attention_head_dim is None and self.hidden_size % self.num_heads:
            raise ValueError(f"EncoderConfig.hidden_size ({self.hidden_size}) must be divisible by "
                             f"num_heads ({self.num_heads}) unless attention_head_dim is set")
        if self.num_kv_heads is not None:
            if self.num_kv_heads <= 0 or self.num_heads % self.num_kv_heads:
                raise ValueError(f"EncoderConfig.num_kv_heads ({self.num_kv_heads}) must be positive and divide "
                                 f"num_heads ({self.num_heads})")
        if self.embedding_size is not None and self.embedding_size <= 0:
            raise ValueError(f"EncoderConfig.embedding_size must be positive, got {self.embedding_size}")
        if self.type_vocab_size < 0:
            raise ValueError(f"EncoderConfig.type_vocab_size must be >= 0, got {self.type_vocab_size}")
        if self.local_window is not None and self.local_window <= 0:
            raise ValueError(f"EncoderConfig.local_window must be positive or None, got {self.local_window}")
        if self.global_attention_every > 1 and self.local_window is None:
            raise ValueError("EncoderConfig.local_window must be set when global_attention_every > 1 "
                             "(some layers are local)")
        if self.global_attention_every == 1 and self.local_window is not None:
            raise ValueError(f"EncoderConfig.local_window={self.local_window} has no effect with "
                             "global_attention_every=1 (every layer is global); set global_attention_every > 1 for "
                             "local layers (ModernBERT: 3), or leave local_window unset")
        if self.num_layer_groups is not None and not 0 < self.num_layer_groups <= self.num_layers:
            raise ValueError(f"EncoderConfig.num_layer_groups ({self.num_layer_groups}) must be in "
                             f"[1, num_layers={self.num_layers}]")
        if not self.attention_kind:
            raise ValueError("EncoderConfig.attention_kind must name an attention module, e.g. 'standard'")
        if (self.attention_kind == "two_stream") != (self.xlnet is not None):
            raise ValueError("EncoderConfig.xlnet must be set exactly when attention_kind='two_stream' (XLNet), got "
                             f"attention_kind={self.attention_kind!r} and xlnet={self.xlnet!r}")
        if self.xlnet is not None and (self.position_embedding != "none" or self.embedding_norm
                                       or self.norm_placement != "post" or self.embed_dim != self.hidden_size
                                       or self.shares_layers or self.global_attention_every != 1):
            raise ValueError("EncoderConfig.xlnet (two-stream attention) needs position_embedding='none', "
                             "embedding_norm=False, norm_placement='post', embedding_size=None, no shared layers "
                             "and global_attention_every=1: XLNet's positions are relative and its embedding is the "
                             "word embedding alone")
        if (self.attention_kind == "disentangled") != (self.disentangled is not None):
            raise ValueError("EncoderConfig.disentangled must be set exactly when attention_kind='disentangled' "
                             f"(got attention_kind={self.attention_kind!r}, disentangled={self.disentangled!r})")
        if self.disentangled is not None and self.global_attention_every != 1:
            raise ValueError("EncoderConfig.disentangled: DeBERTa attention is global in every layer "
                             "(global_attention_every must be 1)")
        # The projections these kinds build are their own: every head for keys and values, DeBERTa's with biases,
        # XLNet's without. A setting they would not read is an error, not a different model than the config says.
        for kind, bias, name in (("disentangled", True, "DeBERTa"), ("two_stream", False, "XLNet")):
            if self.attention_kind == kind and self.kv_heads != self.num_heads:
                raise ValueError(f"EncoderConfig.attention_kind={kind!r}: {name} attention has no grouped-query "
                                 f"attention (num_kv_heads={self.num_kv_heads})")
            if self.attention_kind == kind and self.attention_bias != bias:
                raise ValueError(f"EncoderConfig.attention_kind={kind!r}: {name}'s attention projections "
                                 f"{'have' if bias else 'have no'} biases (attention_bias must be {bias})")
        if (self.attention_kind == "longformer") != (self.longformer is not None):
            raise ValueError("EncoderConfig.longformer must be set exactly when attention_kind='longformer' "
                             f"(got attention_kind={self.attention_kind!r}, longformer={self.longformer!r})")
        if self.longformer is not None:
            windows = self.longformer.attention_window
            if isinstance(windows, tuple) and len(windows) != self.num_layers:
                raise ValueError(f"EncoderConfig.longformer.attention_window has {len(windows)} windows for "
                                 f"num_layers={self.num_layers} (one int, or one window per layer)")
            if self.global_attention_every != 1 or self.local_window is not None or self.shares_layers:
                raise ValueError("EncoderConfig.longformer: windows are per layer in longformer.attention_window; "
                                 "needs global_attention_every=1, local_window=None and no shared layers")
            if self.kv_heads != self.num_heads:
                raise ValueError("EncoderConfig.longformer: Longformer attention has no grouped-query attention "
                                 f"(num_kv_heads={self.num_kv_heads})")
        if self.position_embedding == "alibi" and self.attention_kind != "standard":
            raise ValueError("EncoderConfig.position_embedding='alibi' needs attention_kind='standard' (the "
                             f"ALiBi bias is added by bertjax.ops.attention), got {self.attention_kind!r}")
        if self.position_embedding != "rope" and (self.rope_theta_global, self.rope_theta_local) != (10_000.0,
                                                                                                      10_000.0):
            raise ValueError(f"EncoderConfig.rope_theta_global/rope_theta_local ({self.rope_theta_global}, "
                             f"{self.rope_theta_local}) are read only with position_embedding='rope', not "
                             f"{self.position_embedding!r}: leave them at 10000")
        if self.attention_fused_qkv and (self.position_embedding != "rope" or self.kv_heads != self.num_heads
                                         or self.attention_kind != "standard"):
            raise ValueError("EncoderConfig.attention_fused_qkv needs position_embedding='rope', "
                             "attention_kind='standard' and no grouped-query attention (num_kv_heads == num_heads): "
                             "it keeps q, k and v one stacked projection through RoPE into attention")
        if self.glu_implementation != "xla" and self.mlp != "glu":
            raise ValueError(f"EncoderConfig.glu_implementation={self.glu_implementation!r} needs mlp='glu' (it runs "
                             f"a gated MLP's act(a) * b), got mlp={self.mlp!r}")
        if not self.family:
            raise ValueError("EncoderConfig.family must name a Hugging Face model_type, e.g. 'bert'")
        if self.position_embedding == "sinusoidal" and self.hidden_size != self.embed_dim:
            raise ValueError("EncoderConfig.position_embedding='sinusoidal' needs embedding_size=None (DistilBERT's "
                             "table has the hidden width)")
        if self.shares_layers and self.global_attention_every != 1:
            raise ValueError("EncoderConfig.num_layer_groups (shared layers) needs global_attention_every=1: "
                             "layers sharing parameters must share one attention pattern")
        if not self.mlm_head_transform and self.tie_word_embeddings and self.embed_dim != self.hidden_size:
            raise ValueError("EncoderConfig.mlm_head_transform=False with a tied decoder needs embedding_size == "
                             f"hidden_size (the decoder reads hidden states of width {self.hidden_size}, the "
                             f"embedding matrix has width {self.embed_dim})")
        if self.norm_eps <= 0:
            raise ValueError(f"EncoderConfig.norm_eps must be positive, got {self.norm_eps}")
        if self.norm == "rmsnorm" and self.norm_bias:
            raise ValueError("EncoderConfig.norm_bias must be False with norm='rmsnorm' (RMSNorm has no bias)")
        if self.position_embedding == "rope" and self.head_dim % 2:
            raise ValueError(f"EncoderConfig.position_embedding='rope' needs an even head_dim, got {self.head_dim}")
        if self.position_offset < 0:
            raise ValueError(f"EncoderConfig.position_offset must be >= 0, got {self.position_offset}")
        if not 0.0 <= self.dropout_rate < 1.0:
            raise ValueError(f"EncoderConfig.dropout_rate must be in [0, 1), got {self.dropout_rate}")
        # Token ids are int32 everywhere (tokenizers' output, batches, JAX's default integer): ids past 2**31 could
        # never be looked up, and a size like 1e12 overflows JAX's shape arithmetic in a traceback.
        if self.vocab_size > MAX_VOCAB_SIZE:
            raise ValueError(f"EncoderConfig.vocab_size must be at most {MAX_VOCAB_SIZE} (token ids are int32), "
                             f"got {self.vocab_size}")
        if not 0 <= self.pad_token_id < self.vocab_size:
            raise ValueError(f"EncoderConfig.pad_token_id ({self.pad_token_id}) must be in [0, vocab_size)")

    # Derived quantities: computed, never stored, so they cannot disagree with the fields.
    @property
    def task_or_default(self) -> TaskConfig:
        return self.task if self.task is not None else TaskConfig()

    @property
    def classifier_pooling(self) -> ClassifierPooling:
        """How the sequence heads pool: task.classifier_pooling, else the family's (FAMILY_POOLING, else "cls")."""
        chosen = self.task_or_default.classifier_pooling
        return chosen if chosen is not None else FAMILY_POOLING.get(self.family, "cls")

    @property
    def token_type_embedding(self) -> bool:
        """Whether token types add an embedding row; XLNet's token types only say "same segment or not" inside
        attention, so its type_vocab_size bounds the ids without a table."""
        return self.type_vocab_size > 0 and self.xlnet is None

    @property
    def head_dim(self) -> int:
        return self.attention_head_dim or self.hidden_size // self.num_heads

    @property
    def up_bias(self) -> bool:
        return self.mlp_bias if self.mlp_up_bias is None else self.mlp_up_bias

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads

    @property
    def embed_dim(self) -> int:
        return self.embedding_size or self.hidden_size

    @property
    def layer_groups(self) -> int:
        return self.num_layer_groups or self.num_layers

    @property
    def shares_layers(self) -> bool:
        return self.layer_groups < self.num_layers or self.layers_per_group > 1

    def layer_group(self, step: int) -> int:
        """The parameter group computing step `step` of num_layers; transformers' ALBERT formula, float division
        included, so a checkpoint with groups not dividing the depth runs the same groups here."""
        return int(step / (self.num_layers / self.layer_groups))

    def is_global_layer(self, layer: int) -> bool:
        return layer % self.global_attention_every == 0

    def layer_window(self, layer: int) -> int | None:
        """The attention window of one layer: None for global attention."""
        if self.longformer is not None:
            return self.longformer.window(layer)
        return None if self.is_global_layer(layer) else self.local_window

    def layer_rope_theta(self, layer: int) -> float:
        return self.rope_theta_global if self.is_global_layer(layer) else self.rope_theta_local

    def replace(self, **changes) -> "EncoderConfig":
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ValueError(f"EncoderConfig has no field(s) {sorted(unknown)}")
        for name, options in _OPTION_FIELDS.items():  # YAML overrides such as `xlnet: {clamp_len: 256}` update fields
            if isinstance(changes.get(name), dict):
                held = getattr(self, name)
                base = dataclasses.asdict(held) if held is not None else {}
                changes = {**changes, name: options.from_dict({**base, **changes[name]})}
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def resolved_dict(self) -> dict:
        """`to_dict` with every "None: as another field" written out (num_kv_heads, embedding_size,
        attention_head_dim, mlp_up_bias, num_layer_groups, the task's classifier_pooling): two configs describe one
        model exactly when these are equal, whichever way each was spelled (a workdir of an older bertjax lacks fields
        added since)."""
        resolved = {**self.to_dict(), "num_kv_heads": self.kv_heads, "embedding_size": self.embed_dim,
                    "attention_head_dim": self.head_dim, "mlp_up_bias": self.up_bias,
                    "num_layer_groups": self.layer_groups}
        if self.task is not None:
            resolved["task"] = {**resolved["task"], "classifier_pooling": self.classifier_pooling}
        return resolved

    @classmethod
    def from_dict(cls, values: dict) -> "EncoderConfig":
        unknown = set(values) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"EncoderConfig has no field(s) {sorted(unknown)}")
        if isinstance(values.get("task"), dict):
            values = {**values, "task": TaskConfig.from_dict(values["task"])}
        for name, options in _OPTION_FIELDS.items():
            if isinstance(values.get(name), dict):
                values = {**values, name: options.from_dict(values[name])}
        return cls(**values)


# EncoderConfig fields holding a family's options: a dict given for one (a YAML override, config.json's reader) is
# read by its class, and `replace` updates the options already there.
_OPTION_FIELDS = {"xlnet": XLNetOptions, "longformer": LongformerOptions, "disentangled": DisentangledAttentionConfig}


# ---------------------------------------------------------------------------------------------------------------
# Presets. Values follow the published checkpoints' config.json files.

PRESETS: dict[str, EncoderConfig] = {}


def register_preset(name: str, config: EncoderConfig) -> None:
    if name in PRESETS:
        raise ValueError(f"preset {name!r} is already registered")
    PRESETS[name] = config


def get_config(name: str, **overrides) -> EncoderConfig:
    """A registered preset, with any fields replaced by `overrides`."""
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; known: {sorted(PRESETS)}")
    return PRESETS[name].replace(**overrides) if overrides else PRESETS[name]


_BERT = EncoderConfig(family="bert", vocab_size=30522, hidden_size=768, num_layers=12, num_heads=12,
                      intermediate_size=3072, dropout_rate=0.1)
_ROBERTA = _BERT.replace(family="roberta", vocab_size=50265, max_position_embeddings=512, type_vocab_size=1,
                         position_offset=2, norm_eps=1e-5, pad_token_id=1)
_MODERNBERT = EncoderConfig(
    family="modernbert", vocab_size=50368, hidden_size=768, num_layers=22, num_heads=12, intermediate_size=1152,
    max_position_embeddings=8192, type_vocab_size=0, position_embedding="rope",
    rope_theta_global=160_000.0, rope_theta_local=10_000.0,
    norm_eps=1e-5, norm_bias=False, norm_placement="pre", embedding_norm=True, final_norm=True,
    first_layer_attention_norm=False, attention_bias=False, mlp_bias=False, activation="gelu", mlp="glu",
    global_attention_every=3, local_window=128, head_dense_bias=False, head_activation="gelu", pooler=False,
    classifier_activation="gelu", classifier_norm=True, classifier_token_transform=True,
    pad_token_id=50283, dropout_rate=0.0)

# ALBERT (published albert-*-v2 config.json values): E=128 factorised embedding, one layer shared by all steps
# (num_hidden_groups=1, inner_group_num=1), gelu_new, no dropout in v2, SOP through EncoderForPreTraining.
_ALBERT = _BERT.replace(family="albert", vocab_size=30000, embedding_size=128, num_layer_groups=1,
                        activation="gelu_tanh", head_activation="gelu_tanh", dropout_rate=0.0)
# DistilBERT (distilbert-base-uncased config.json): BERT-base halved in depth, no token types, no pooler.
_DISTILBERT = _BERT.replace(family="distilbert", num_layers=6, type_vocab_size=0, pooler=False,
                            classifier_activation="relu")

register_preset("bert-base", _BERT)
register_preset("bert-large", _BERT.replace(hidden_size=1024, num_layers=24, num_heads=16, intermediate_size=4096))
register_preset("roberta-base", _ROBERTA.replace(max_position_embeddings=514))
register_preset("roberta-large", _ROBERTA.replace(max_position_embeddings=514, hidden_size=1024, num_layers=24,
                                                  num_heads=16, intermediate_size=4096))
register_preset("modernbert-base", _MODERNBERT)
register_preset("modernbert-large", _MODERNBERT.replace(hidden_size=1024, num_layers=28, num_heads=16,
                                                        intermediate_size=2624))
register_preset("albert-base-v2", _ALBERT)
register_preset("albert-large-v2", _ALBERT.replace(hidden_size=1024, num_layers=24, num_heads=16,
                                                  intermediate_size=4096))
register_preset("albert-xlarge-v2", _ALBERT.replace(hidden_size=2048, num_layers=24, num_heads=16,
                                                   intermediate_size=8192))
register_preset("albert-xxlarge-v2", _ALBERT.replace(hidden_size=4096, num_layers=12, num_heads=64,
                                                    intermediate_size=16384))
register_preset("distilbert-base", _DISTILBERT)
# Tiny presets for tests and CPU experiments: same knobs, small sizes.
register_preset("bert-tiny", _BERT.replace(vocab_size=128, hidden_size=32, num_layers=2, num_heads=4,
                                           intermediate_size=64, max_position_embeddings=64, dropout_rate=0.0))
register_preset("roberta-tiny", _ROBERTA.replace(vocab_size=128, hidden_size=32, num_layers=2, num_heads=4,
                                                 intermediate_size=64, max_position_embeddings=66,
                                                 dropout_rate=0.0))
register_preset("modernbert-tiny", _MODERNBERT.replace(vocab_size=128, hidden_size=32, num_layers=3, num_heads=4,
                                                       intermediate_size=48, max_position_embeddings=256,
                                                       local_window=8, pad_token_id=0))
register_preset("albert-tiny", _ALBERT.replace(vocab_size=128, embedding_size=16, hidden_size=32, num_layers=3,
                                               num_heads=4, intermediate_size=64, max_position_embeddings=64))
register_preset("distilbert-tiny", _DISTILBERT.replace(vocab_size=128, hidden_size=32, num_layers=2, num_heads=4,
                                                       intermediate_size=64, max_position_embeddings=64,
                                                       dropout_rate=0.0))

# ELECTRA (Clark et al. 2020): BERT's layers without a pooler, a factorised embedding in the generators (and in
# electra-small), and the generator's MLM transform always the exact GELU. Generators share their discriminator's
# embedding_size so the two can share word/position/type embeddings during pretraining.
_ELECTRA = _BERT.replace(family="electra", pooler=False, head_activation="gelu", classifier_activation="gelu")


def _electra(hidden: int, layers: int, heads: int, embedding: int) -> EncoderConfig:
    return _ELECTRA.replace(hidden_size=hidden, num_layers=layers, num_heads=heads, intermediate_size=4 * hidden,
                            embedding_size=embedding)


register_preset("electra-small-discriminator", _electra(256, 12, 4, 128))
# The published small generator is as wide as its discriminator (its model card warns of this); the paper's recipe
# trains small with a generator 1/4 as wide, which the ELECTRA objective derives from the discriminator.
register_preset("electra-small-generator", _electra(256, 12, 4, 128))
register_preset("electra-base-discriminator", _electra(768, 12, 12, 768))
register_preset("electra-base-generator", _electra(256, 12, 4, 768))
register_preset("electra-large-discriminator", _electra(1024, 24, 16, 1024))
register_preset("electra-large-generator", _electra(256, 24, 4, 1024))
register_preset("electra-tiny-discriminator", _ELECTRA.replace(
    vocab_size=128, hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128, embedding_size=32,
    max_position_embeddings=64, dropout_rate=0.0))
register_preset("electra-tiny-generator", get_config("electra-tiny-discriminator", hidden_size=16, num_heads=1,
                                                      intermediate_size=32))

# EuroBERT (Boizard et al. 2025): a Llama-style encoder. RMSNorm pre-norm with a final norm and no embedding norm,
# no biases, SwiGLU, RoPE (theta 250k), grouped-query attention, an untied one-matrix LM head.
_EUROBERT = EncoderConfig(
    family="eurobert", vocab_size=128256, hidden_size=768, num_layers=12, num_heads=12, intermediate_size=3072,
    max_position_embeddings=8192, type_vocab_size=0, position_embedding="rope",
    rope_theta_global=250_000.0, rope_theta_local=250_000.0, norm="rmsnorm", norm_eps=1e-5, norm_bias=False,
    norm_placement="pre", embedding_norm=False, final_norm=True, attention_bias=False, mlp_bias=False,
    activation="silu", mlp="glu", tie_word_embeddings=False, decoder_bias=False, mlm_head_transform=False,
    pooler=False, classifier_activation="gelu", pad_token_id=128001, dropout_rate=0.0)

# Non-embedding parameters: 113M, 460M, 1.81B; the untied LM head adds vocab_size * hidden_size again.
register_preset("eurobert-210m", _EUROBERT)
register_preset("eurobert-610m", _EUROBERT.replace(hidden_size=1152, num_layers=26, num_heads=18, num_kv_heads=6,
                                                   intermediate_size=4096))
register_preset("eurobert-2.1b", _EUROBERT.replace(hidden_size=2304, num_layers=32, num_heads=18, num_kv_heads=6,
                                                   intermediate_size=6144))
register_preset("eurobert-tiny", _EUROBERT.replace(vocab_size=128, hidden_size=32, num_layers=2, num_heads=4,
                                                   num_kv_heads=2, intermediate_size=64, max_position_embeddings=256,
                                                   pad_token_id=0))

# XLNet (Yang et al. 2019): two-stream attention over relative positions (attention_kind "two_stream", knobs in
# XLNetOptions), post-norm layers without attention biases, the word embedding alone, a tied LM head without a
# transform. Token types 0, 1, 2 (<cls>) and 3 (padding) only matter as "same or not". max_position_embeddings
# bounds the input length at the pretraining length (relative encodings themselves have no table). Task heads pool
# the last token (XLNet's <cls>; XLNetTokenizer pads on the left), so the presets carry that pooling for fine-tuning.
XLNET_TASK = TaskConfig(classifier_pooling=FAMILY_POOLING["xlnet"])
_XLNET = EncoderConfig(
    family="xlnet", vocab_size=32000, hidden_size=768, num_layers=12, num_heads=12, intermediate_size=3072,
    max_position_embeddings=512, type_vocab_size=4, position_embedding="none", norm_eps=1e-12,
    embedding_norm=False, attention_bias=False, activation="gelu", attention_kind="two_stream",
    xlnet=XLNetOptions(), mlm_head_transform=False, pooler=False, classifier_activation="tanh", pad_token_id=5,
    dropout_rate=0.1, task=XLNET_TASK)
register_preset("xlnet-base", _XLNET)
register_preset("xlnet-large", _XLNET.replace(hidden_size=1024, num_layers=24, num_heads=16, intermediate_size=4096))
register_preset("xlnet-tiny", _XLNET.replace(vocab_size=128, hidden_size=32, num_layers=2, num_heads=4,
                                             intermediate_size=64, max_position_embeddings=64, dropout_rate=0.0))
# DeBERTa (He et al. 2021): post-norm BERT layers with disentangled attention. v1 (deberta-base/large): v1's fused
# in_proj, distances clamped at 512. v3 (DeBERTa-v2 code): no absolute positions, 256 log
# buckets, shared attention keys, LayerNorm'd relative table, 128k SentencePiece vocabulary, no token types.
_DEBERTA = _BERT.replace(family="deberta", vocab_size=50265, type_vocab_size=0, norm_eps=1e-7, pooler=False,
                         classifier_activation="gelu", position_embedding="none", attention_kind="disentangled",
                         disentangled=DisentangledAttentionConfig(pos_att_type=("c2p", "p2c"), fused_qkv=True,
                                                                  max_relative_positions=512))
_DEBERTA_V3 = _BERT.replace(
    family="deberta-v2", vocab_size=128100, type_vocab_size=0, norm_eps=1e-7, pooler=False,
    classifier_activation="gelu", position_embedding="none", attention_kind="disentangled",
    disentangled=DisentangledAttentionConfig(max_relative_positions=512, position_buckets=256, share_att_key=True,
                                             norm_rel_ebd=True))
register_preset("deberta-base", _DEBERTA)
register_preset("deberta-large", _DEBERTA.replace(hidden_size=1024, num_layers=24, num_heads=16,
                                                  intermediate_size=4096))
register_preset("deberta-v3-xsmall", _DEBERTA_V3.replace(hidden_size=384, num_layers=12, num_heads=6,
                                                         intermediate_size=1536))
register_preset("deberta-v3-small", _DEBERTA_V3.replace(hidden_size=768, num_layers=6, num_heads=12,
                                                        intermediate_size=3072))
register_preset("deberta-v3-base", _DEBERTA_V3)
register_preset("deberta-v3-large", _DEBERTA_V3.replace(hidden_size=1024, num_layers=24, num_heads=16,
                                                        intermediate_size=4096))
register_preset("deberta-v3-tiny", _DEBERTA_V3.replace(
    vocab_size=128, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64, max_position_embeddings=64,
    dropout_rate=0.0, disentangled=DisentangledAttentionConfig(max_relative_positions=16, position_buckets=8,
                                                               share_att_key=True, norm_rel_ebd=True)))

# MosaicBERT (Portes et al. 2023; mosaicml/examples bert_layers.py): BERT's post-norm layers without position
# embeddings, ALiBi in every attention layer (so a model trained at 128 runs at longer lengths), GeGLU
# feed-forward, the bert-base-uncased vocabulary padded to a multiple of 64. No Hugging Face family: MosaicML's
# checkpoints run through remote code (bertjax/hf/mosaicbert.py reads and writes that layout). Its GLU up-projection
# (`gated_layers`) has no bias, its output projection has one.
_MOSAICBERT = _BERT.replace(family="mosaicbert", vocab_size=30528, position_embedding="alibi", mlp="glu",
                            mlp_up_bias=False, activation="gelu", max_position_embeddings=8192)
register_preset("mosaicbert-base", _MOSAICBERT)
register_preset("mosaicbert-large", _MOSAICBERT.replace(hidden_size=1024, num_layers=24, num_heads=16,
                                                        intermediate_size=4096))
register_preset("mosaicbert-tiny", _MOSAICBERT.replace(vocab_size=128, hidden_size=32, num_layers=2, num_heads=4,
                                                       intermediate_size=64, max_position_embeddings=1024,
                                                       dropout_rate=0.0))

# Longformer (Beltagy et al. 2020; allenai/longformer-*-4096): RoBERTa's weights and layout with every layer
# attending in a 512-token sliding window plus global tokens chosen per input (`global_attention_mask`), which have
# their own query/key/value projections. Positions were extended from RoBERTa's 512 to 4096 by copying.
_LONGFORMER = _ROBERTA.replace(family="longformer", max_position_embeddings=4098, attention_kind="longformer",
                               longformer=LongformerOptions(attention_window=512))
register_preset("longformer-base-4096", _LONGFORMER)
register_preset("longformer-large-4096", _LONGFORMER.replace(hidden_size=1024, num_layers=24, num_heads=16,
                                                             intermediate_size=4096))
register_preset("longformer-tiny", _LONGFORMER.replace(vocab_size=128, hidden_size=32, num_layers=2, num_heads=4,
                                                       intermediate_size=64, max_position_embeddings=258,
                                                       dropout_rate=0.0,
                                                       longformer=LongformerOptions(attention_window=(8, 16))))
