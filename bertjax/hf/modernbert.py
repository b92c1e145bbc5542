"""ModernBERT (`model_type: modernbert`): config translation, key mapping and refusals.

Pre-norm, RoPE with a global and a local theta, GeGLU, alternating global/sliding-window layers, fused `Wqkv` and
`Wi` tensors. config.json comes in two layouts: transformers 5's `layer_types`/`rope_parameters`, and the
transformers 4 keys (`global_attn_every_n_layers`, `global_rope_theta`, `local_rope_theta`) still on the Hub.
"""

from __future__ import annotations

from bertjax.config import EncoderConfig
from bertjax.hf.config_common import ACTIVATION_TO_HF, ConfigReader, Refusals
from bertjax.hf.family import HfFamily
from bertjax.hf.task_heads import HeadKeys, TaskHeads, architectures
from bertjax.models.task_models import TASK_HEADS
from bertjax.hf.mapping import (COPY, TRANSPOSE, KeyMapping, ParamPath, TensorRule, attention_output, embedding,
                                fused, heads_bias, heads_in, layer_norm, linear, mlm_decoder)

DEFAULTS = {
    "hidden_activation": "gelu", "max_position_embeddings": 8192, "initializer_range": 0.02, "norm_eps": 1e-5,
    "norm_bias": False, "pad_token_id": 50283, "attention_bias": False, "local_attention": 128, "mlp_bias": False,
    "decoder_bias": True, "classifier_bias": False, "classifier_activation": "gelu", "tie_word_embeddings": True,
    "embedding_dropout": 0.0, "attention_dropout": 0.0, "mlp_dropout": 0.0,
    # The legacy (transformers 4) keys and their defaults.
    "global_attn_every_n_layers": 3, "global_rope_theta": 160_000.0, "local_rope_theta": 10_000.0,
}
_LAYER_TYPES = ("full_attention", "sliding_attention")


def global_every_from_layer_types(layer_types: list, num_layers: int) -> int:
    """The n of "layer i is global iff i % n == 0" that reproduces `layer_types`, or a ValueError."""
    if not isinstance(layer_types, list) or len(layer_types) != num_layers:
        raise ValueError(f"config.json: layer_types must be a list of num_hidden_layers={num_layers} entries, "
                         f"got {layer_types!r}")
    unknown = sorted({t for t in layer_types if t not in _LAYER_TYPES})
    if unknown:
        raise ValueError(f"config.json: layer_types has unknown entries {unknown}; known: {list(_LAYER_TYPES)}")
    later_globals = [i for i, t in enumerate(layer_types) if i > 0 and t == "full_attention"]
    every = later_globals[0] if later_globals else num_layers
    pattern = ["full_attention" if i % every == 0 else "sliding_attention" for i in range(num_layers)]
    if pattern != layer_types:
        raise ValueError(f"config.json: layer_types {layer_types} is not 'full attention every n layers "
                         "starting at layer 0', the only pattern bertjax expresses")
    return every


def _rope_thetas(read: ConfigReader, values: dict) -> tuple[float, float]:
    """(global, local) theta from `rope_parameters`, falling back to the legacy keys as transformers does."""
    if values.get("rope_scaling") is not None:
        raise ValueError(f"config.json: rope_scaling={values['rope_scaling']!r} is not supported")
    parameters = values.get("rope_parameters") or {}
    if not isinstance(parameters, dict):
        raise ValueError(f"config.json: rope_parameters must be a dict, got {parameters!r}")
    thetas = []
    for layer_type, legacy_key in (("full_attention", "global_rope_theta"), ("sliding_attention", "local_rope_theta")):
        entry = parameters.get(layer_type) or {}
        rope_type = entry.get("rope_type", "default")
        if rope_type != "default":
            raise ValueError(f"config.json: rope_parameters.{layer_type}.rope_type={rope_type!r} is not supported "
                             "(only 'default' RoPE)")
        thetas.append(float(entry["rope_theta"]) if entry.get("rope_theta") is not None else read.number(legacy_key))
    return thetas[0], thetas[1]


def to_encoder_config(values: dict, head: str) -> EncoderConfig:
    read = ConfigReader(values, DEFAULTS)
    num_layers = read("num_hidden_layers")
    if values.get("layer_types") is not None:  # transformers 5 format
        every = global_every_from_layer_types(values["layer_types"], num_layers)
    else:  # transformers 4 format
        every = read("global_attn_every_n_layers")
    rope_global, rope_local = _rope_thetas(read, values)
    dropouts = [read.number(k) for k in ("embedding_dropout", "attention_dropout", "mlp_dropout")]
    return EncoderConfig(
        family="modernbert",
        vocab_size=read("vocab_size"), hidden_size=read("hidden_size"), num_layers=num_layers,
        num_heads=read("num_attention_heads"), intermediate_size=read("intermediate_size"),
        max_position_embeddings=read("max_position_embeddings"), type_vocab_size=0,
        position_embedding="rope", rope_theta_global=rope_global, rope_theta_local=rope_local,
        norm="layernorm", norm_eps=read.number("norm_eps"), norm_bias=read("norm_bias"),
        norm_placement="pre", embedding_norm=True, final_norm=True, first_layer_attention_norm=False,
        attention_bias=read("attention_bias"), mlp_bias=read("mlp_bias"),
        activation=read.activation("hidden_activation"), mlp="glu", global_attention_every=every,
        local_window=read("local_attention") if every > 1 else None, tie_word_embeddings=read("tie_word_embeddings"),
        decoder_bias=read("decoder_bias"), head_dense_bias=read("classifier_bias"),
        head_activation=read.activation("classifier_activation"), pooler=False,
        pad_token_id=read("pad_token_id"),
        # bertjax has one dropout rate where ModernBERT has three; dropout never changes inference.
        dropout_rate=max(dropouts), initializer_range=read.number("initializer_range"))


def to_hf_config(config: EncoderConfig, head: str) -> dict:
    refuse = Refusals(config, "modernbert")
    refuse.common()
    refuse.need(position_embedding="rope", norm_placement="pre", embedding_norm=True, final_norm=True,
                  first_layer_attention_norm=False, mlp="glu", type_vocab_size=0, position_offset=0)
    refuse.exportable_activation("head_activation")
    if head == "encoder":
        refuse.check(not config.pooler, "pooler=True (ModernBertModel has no pooler)")
    refuse.raise_if_any()
    layer_types = ["full_attention" if config.is_global_layer(i) else "sliding_attention"
                   for i in range(config.num_layers)]
    return {
        "model_type": "modernbert", "vocab_size": config.vocab_size, "hidden_size": config.hidden_size,
        "num_hidden_layers": config.num_layers, "num_attention_heads": config.num_heads,
        "intermediate_size": config.intermediate_size,
        "hidden_activation": ACTIVATION_TO_HF[config.activation],
        "max_position_embeddings": config.max_position_embeddings,
        "initializer_range": config.initializer_range, "norm_eps": config.norm_eps,
        "norm_bias": config.norm_bias, "attention_bias": config.attention_bias, "mlp_bias": config.mlp_bias,
        "layer_types": layer_types,
        # A model with only global layers never reads the window; transformers still wants an integer.
        "local_attention": config.local_window or DEFAULTS["local_attention"],
        "rope_parameters": {
            "full_attention": {"rope_type": "default", "rope_theta": config.rope_theta_global},
            "sliding_attention": {"rope_type": "default", "rope_theta": config.rope_theta_local},
        },
        # transformers 4.48-5.0 read the layer pattern and the thetas from these keys alone, and would take their
        # defaults (every 3rd layer global, theta 160000) without a word; newer ones read the two above.
        "global_attn_every_n_layers": config.global_attention_every,
        "global_rope_theta": config.rope_theta_global, "local_rope_theta": config.rope_theta_local,
        "embedding_dropout": config.dropout_rate, "attention_dropout": 0.0, "mlp_dropout": config.dropout_rate,
        "decoder_bias": config.decoder_bias, "classifier_bias": config.head_dense_bias,
        "classifier_activation": ACTIVATION_TO_HF[config.head_activation],
        "tie_word_embeddings": config.tie_word_embeddings, "pad_token_id": config.pad_token_id,
        # The tokenizer owns the other special tokens; transformers' defaults would point outside small vocabs.
        "bos_token_id": None, "eos_token_id": None, "cls_token_id": None, "sep_token_id": None,
    }


def modernbert_layer(key: str, path: ParamPath, cfg: EncoderConfig, layer: int) -> list[TensorRule]:
    h, i, d = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    attention = path + ("attention",)
    qkv_paths = (attention + ("query",), attention + ("key",), attention + ("value",))
    qkv = heads_in(cfg.num_heads, d)
    rules = [TensorRule((f"{key}attn.Wqkv.weight",), (3 * h, h), tuple(p + ("kernel",) for p in qkv_paths),
                        fused(qkv, qkv, qkv))]
    if cfg.attention_bias:
        qkv_bias = heads_bias(cfg.num_heads, d)
        rules.append(TensorRule((f"{key}attn.Wqkv.bias",), (3 * h,), tuple(p + ("bias",) for p in qkv_paths),
                                fused(qkv_bias, qkv_bias, qkv_bias)))
    rules += attention_output(f"{key}attn.Wo", attention + ("out",), cfg)
    if layer > 0:  # layer 0's attention input is the embedding norm's output: no attn_norm of its own
        rules += layer_norm(f"{key}attn_norm", path + ("attention_norm",), h, cfg.norm_bias)
    rules += layer_norm(f"{key}mlp_norm", path + ("mlp_norm",), h, cfg.norm_bias)
    gate_paths = (path + ("mlp", "wi_0"), path + ("mlp", "wi_1"))  # activated input, then linear gate
    rules.append(TensorRule((f"{key}mlp.Wi.weight",), (2 * i, h), tuple(p + ("kernel",) for p in gate_paths),
                            fused(TRANSPOSE, TRANSPOSE)))
    if cfg.mlp_bias:
        rules.append(TensorRule((f"{key}mlp.Wi.bias",), (2 * i,), tuple(p + ("bias",) for p in gate_paths),
                                fused(COPY, COPY)))
    rules += linear(f"{key}mlp.Wo", path + ("mlp", "wo"), i, h, cfg.mlp_bias)
    return rules


def modernbert_mapping(cfg: EncoderConfig, head: str) -> KeyMapping:
    h = cfg.hidden_size
    base = "model." if head != "encoder" else ""
    rules = [
        *embedding(f"{base}embeddings.tok_embeddings", ("embeddings", "word_embeddings"), cfg.vocab_size, h),
        *layer_norm(f"{base}embeddings.norm", ("embeddings", "norm"), h, cfg.norm_bias),
    ]
    for i in range(cfg.num_layers):
        rules += modernbert_layer(f"{base}layers.{i}.", ("encoder", f"layers_{i}"), cfg, i)
    rules += layer_norm(f"{base}final_norm", ("encoder", "final_norm"), h, cfg.norm_bias)
    ignored: set[str] = set()
    if head == "masked_lm":
        rules += linear("head.dense", ("mlm_head", "dense"), h, h, cfg.head_dense_bias)
        rules += layer_norm("head.norm", ("mlm_head", "norm"), h, cfg.norm_bias)
        decoder_rules, ignored = mlm_decoder("decoder", ("decoder.bias",), cfg)
        rules += decoder_rules
    return KeyMapping(rules, frozenset(ignored))


# Every ModernBERT task head runs ModernBertPredictionHead (head.dense -> classifier_activation -> head.norm), the
# token ones on every token; its dense bias and activation are the MLM head's (classifier_bias, _activation).
_TASK_HEADS = TaskHeads(
    base_prefix="model.", architectures=architectures("ModernBert"), activation=None, norm=True,
    token_transform=True, dense_bias=None,
    keys={head: HeadKeys(out="classifier", dense="head.dense", norm="head.norm") for head in TASK_HEADS},
    poolings={"cls": "cls", "mean": "mean"}, dropout_default=0.0)

FAMILY = HfFamily(
    model_type="modernbert",
    architectures={"ModernBertModel": "encoder", "ModernBertForMaskedLM": "masked_lm"},
    to_encoder_config=to_encoder_config,
    to_hf_config=to_hf_config,
    key_mapping=modernbert_mapping,
    task_heads=_TASK_HEADS,
)
