"""ELECTRA (Clark et al., 2020): replaced-token detection with a jointly trained generator.

A small masked-LM generator fills the masked positions with tokens sampled from its own distribution (temperature
1, under stop-gradient: the discriminator's loss does not train the generator through the samples); the
discriminator then labels every real token as original or replaced. The loss is

    generator MLM mean  +  rtd_weight * mean binary cross-entropy of the discriminator over all real tokens

A sampled token equal to the original counts as original, as in the paper. Generator and discriminator share the
token, position and token-type embeddings and the embedding norm: the generator's parameter tree leaves them out
and reads the discriminator's, so both losses train one copy. Their widths differ, so each keeps its own
embedding projection (E -> its hidden size).

DeBERTa-v3 (He et al. 2021) trains the same two models with gradient-disentangled embedding sharing
(`embedding_sharing: gdes`): the generator owns the embedding tables and only its MLM loss trains them; the
discriminator embeds with stop_gradient(generator table) + its own zero-initialised residual, so the RTD loss
trains the residual alone and cannot pull the shared table towards its own, conflicting, objective. The norms stay
each model's own. The released code shares the word and position tables; token-type tables are shared alike.

The trainable parameters are `{"discriminator": ..., "generator": ...}`; `exports` gives both as ordinary models
(the generator with the shared tensors filled in). The discriminator is the model users fine-tune.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import jax
import jax.numpy as jnp
import optax

from bertjax.config import EncoderConfig
from bertjax.models import MODEL_CLASSES
from bertjax.models.params import init_boxed
from bertjax.train import flops as flops_lib
from bertjax.train.objectives import losses
from bertjax.train.objectives.base import Objective, ObjectiveOptions, model_inputs

# Parameters under `embeddings/` that the generator takes from the discriminator.
SHARED_EMBEDDINGS = ("word_embeddings", "position_embeddings", "token_type_embeddings", "norm")
DISCRIMINATOR_HEAD = "replaced_token_detection"
# Tables shared by GDES: the discriminator's copies of these hold only its residual.
GDES_EMBEDDINGS = ("word_embeddings", "position_embeddings", "token_type_embeddings")


@dataclasses.dataclass(frozen=True)
class ElectraOptions(ObjectiveOptions):
    name: str = "electra"
    # The generator's width as a fraction of the discriminator's (hidden size, heads, feed-forward), same depth
    # and embedding size. None: the paper's Table 6, 1/3 for base-sized discriminators (256 < hidden <= 768), else 1/4.
    generator_size: float | None = None
    rtd_weight: float = 50.0  # lambda of the paper
    temperature: float = 1.0  # of the generator's sampling distribution
    # "shared": the generator reads the discriminator's embeddings (ELECTRA); "gdes": the discriminator reads the
    # generator's under stop-gradient plus its own zero-initialised residual (DeBERTa-v3).
    embedding_sharing: Literal["shared", "gdes"] = "shared"
    generator_depth: float = 1.0  # the generator's layers as a fraction of the discriminator's (DeBERTa-v3: 0.5)

    def __post_init__(self) -> None:
        if self.generator_size is not None and not 0.0 < self.generator_size <= 1.0:
            raise ValueError(f"objective.generator_size must be in (0, 1], got {self.generator_size}")
        if self.rtd_weight < 0:
            raise ValueError(f"objective.rtd_weight must be >= 0, got {self.rtd_weight}")
        if self.temperature <= 0:
            raise ValueError(f"objective.temperature must be positive, got {self.temperature}")
        if self.embedding_sharing not in ("shared", "gdes"):
            raise ValueError(f"objective.embedding_sharing must be 'shared' or 'gdes', got {self.embedding_sharing!r}")
        if not 0.0 < self.generator_depth <= 1.0:
            raise ValueError(f"objective.generator_depth must be in (0, 1], got {self.generator_depth}")


def generator_config(discriminator: EncoderConfig, size: float | None, depth: float = 1.0) -> EncoderConfig:
    """The generator of `discriminator`: `size` of its heads (each of the same head size) and, by the same rounded
    ratio, of its feed-forward width; `depth` of its layers; the same embedding size and vocabulary. `size` None:
    Table 6 of the ELECTRA paper, 1/4 for small (hidden 256) and large discriminators, 1/3 for base (768)."""
    if size is None:
        size = 1 / 3 if 256 < discriminator.hidden_size <= 768 else 1 / 4
    heads = max(1, round(discriminator.num_heads * size))
    head_dim = discriminator.head_dim
    return discriminator.replace(
        hidden_size=heads * head_dim, num_heads=heads, num_kv_heads=None,
        intermediate_size=max(1, round(discriminator.intermediate_size * heads / discriminator.num_heads)),
        embedding_size=discriminator.embed_dim, pooler=False, tie_word_embeddings=True,
        num_layers=max(1, round(discriminator.num_layers * depth)))


def _split_shared(generator: dict) -> dict:
    embeddings = {k: v for k, v in generator["embeddings"].items() if k not in SHARED_EMBEDDINGS}
    return {**generator, "embeddings": embeddings}


def with_shared_embeddings(generator: dict, discriminator: dict) -> dict:
    """The generator's full parameter tree: its own leaves plus the discriminator's shared embeddings."""
    shared = {k: v for k, v in discriminator["embeddings"].items() if k in SHARED_EMBEDDINGS}
    return {**generator, "embeddings": {**generator["embeddings"], **shared}}


def with_gdes_embeddings(discriminator: dict, generator: dict) -> dict:
    """The discriminator's effective tree under GDES: stop_gradient(generator table) + its residual, per table."""
    embeddings = dict(discriminator["embeddings"])
    for name in GDES_EMBEDDINGS:
        if name in embeddings:
            shared = jax.lax.stop_gradient(generator["embeddings"][name]["embedding"])
            embeddings[name] = {"embedding": shared + embeddings[name]["embedding"]}
    return {**discriminator, "embeddings": embeddings}


def replace_at(ids: jax.Array, positions: jax.Array, used: jax.Array, values: jax.Array) -> jax.Array:
    """ids [batch, seq] with `values` [batch, slots] written at `positions` where `used`; unused slots (which may
    point anywhere, padding included) are dropped, so padding is never touched."""
    ids, rows = jnp.asarray(ids), jnp.arange(ids.shape[0])[:, None]
    target = jnp.where(used, positions, ids.shape[1])  # out of range: dropped
    return ids.at[rows, target].set(values.astype(ids.dtype), mode="drop")


def sample_replacements(key: jax.Array, logits: jax.Array, temperature: float) -> jax.Array:
    """Token ids drawn from softmax(logits / temperature) at each slot, with no gradient to the generator.

    Inverse-CDF sampling: one uniform number per slot against the cumulative distribution. `jax.random.categorical`
    (Gumbel-max) draws one random number per vocabulary entry, [batch, slots, vocab] of them, which cost 3x more
    than this whole function on CPU for ELECTRA-Small's 30k vocabulary (bench/train_bench.py --electra).
    """
    logits = jax.lax.stop_gradient(logits.astype(jnp.float32)) / temperature
    cdf = jnp.cumsum(jax.nn.softmax(logits, axis=-1), axis=-1)
    u = jax.random.uniform(key, logits.shape[:-1]) * cdf[..., -1]
    return jnp.minimum(jnp.sum(cdf < u[..., None], axis=-1), logits.shape[-1] - 1)


class Electra(Objective):
    name = "electra"
    options_class = ElectraOptions
    params_key = "discriminator"

    def __init__(self, options, model_config, remat_policy="none"):
        super().__init__(options, model_config, remat_policy)
        self.generator_config = generator_config(model_config, options.generator_size, options.generator_depth)
        self.gdes = options.embedding_sharing == "gdes"
        self.discriminator = MODEL_CLASSES[DISCRIMINATOR_HEAD](model_config, remat_policy=remat_policy)
        self.generator = MODEL_CLASSES["masked_lm"](self.generator_config, remat_policy=remat_policy)

    def init_params(self, key):
        disc_key, gen_key = jax.random.split(key)
        if self.gdes:  # the generator keeps its tables; the discriminator's start as a zero residual
            discriminator = init_boxed(self.discriminator, disc_key)
            embeddings = {name: jax.tree.map(jnp.zeros_like, value) if name in GDES_EMBEDDINGS else value
                          for name, value in discriminator["embeddings"].items()}
            return {"discriminator": {**discriminator, "embeddings": embeddings},
                    "generator": init_boxed(self.generator, gen_key)}
        return {"discriminator": init_boxed(self.discriminator, disc_key),
                "generator": _split_shared(init_boxed(self.generator, gen_key))}

    def loss_sums(self, params, frozen, batch, key, deterministic):
        gen_key, sample_key, disc_key = jax.random.split(key, 3)
        rngs = (lambda k: None) if deterministic else (lambda k: {"dropout": k})
        generator, discriminator = self._models(params)
        gen = self.generator.apply({"params": generator}, **model_inputs(self.generator_config, batch),
                                   masked_positions=batch["masked_positions"], deterministic=deterministic,
                                   rngs=rngs(gen_key))
        mlm_loss, mlm_weight, mlm_correct = losses.mlm_sums(gen.logits, batch["masked_ids"], batch["masked_weights"])

        used = batch["masked_weights"] > 0
        sampled = sample_replacements(sample_key, gen.logits, self.options.temperature)
        corrupted = replace_at(batch["input_ids"], batch["masked_positions"], used, sampled)
        original = replace_at(batch["input_ids"], batch["masked_positions"], used, batch["masked_ids"])
        real = batch["segment_ids"] > 0
        replaced = (corrupted != original) & real

        disc = self.discriminator.apply({"params": discriminator},
                                        **model_inputs(self.model_config, batch, input_ids=corrupted),
                                        deterministic=deterministic, rngs=rngs(disc_key))
        rtd_logits = disc.logits.astype(jnp.float32)
        realf = real.astype(jnp.float32)
        bce = optax.sigmoid_binary_cross_entropy(rtd_logits, replaced.astype(jnp.float32))
        predicted = (rtd_logits > 0) & real
        count = lambda x: jnp.sum(x.astype(jnp.float32))
        return {"mlm_loss": mlm_loss, "mlm_weight": mlm_weight, "mlm_correct": mlm_correct,
                "rtd_loss": jnp.sum(bce * realf), "token_count": count(real),
                "rtd_correct": count((predicted == replaced) & real), "replaced": count(replaced),
                "predicted_replaced": count(predicted), "true_replaced": count(predicted & replaced)}

    def normalisers(self, batch):
        return {"mlm_weight": losses.prediction_count(batch), "token_count": losses.real_token_count(batch)}

    def loss(self, sums, norm):
        return sums["mlm_loss"] / norm["mlm_weight"] + self.options.rtd_weight * sums["rtd_loss"] / norm["token_count"]

    def metrics(self, sums):
        out = {"generator_mlm_loss": losses.mean(sums["mlm_loss"], sums["mlm_weight"]),
               "generator_mlm_accuracy": losses.mean(sums["mlm_correct"], sums["mlm_weight"]),
               "rtd_loss": losses.mean(sums["rtd_loss"], sums["token_count"]),
               "rtd_accuracy": losses.mean(sums["rtd_correct"], sums["token_count"]),
               "rtd_precision": losses.mean(sums["true_replaced"], sums["predicted_replaced"]),
               "rtd_recall": losses.mean(sums["true_replaced"], sums["replaced"]),
               "replacement_rate": losses.mean(sums["replaced"], sums["token_count"])}
        out["loss"] = out["generator_mlm_loss"] + self.options.rtd_weight * out["rtd_loss"]
        return out

    def train_flops(self, *, seq_len, tokens, predictions, rows):
        h = self.model_config.hidden_size
        discriminator = (flops_lib.encoder_forward_flops(self.model_config, seq_len=seq_len, tokens=tokens)
                         + tokens * (2 * h * h + 2 * h))  # the replaced-token head at every token
        generator = flops_lib.mlm_forward_flops(self.generator_config, seq_len=seq_len, tokens=tokens,
                                                predictions=predictions)
        return 3.0 * (discriminator + generator)

    def _models(self, params) -> tuple[dict, dict]:
        """(generator, discriminator) full parameter trees with the shared embeddings filled in."""
        if self.gdes:
            return params["generator"], with_gdes_embeddings(params["discriminator"], params["generator"])
        return with_shared_embeddings(params["generator"], params["discriminator"]), params["discriminator"]

    def exports(self, params):
        generator, discriminator = self._models(params)
        return {"discriminator": (MODEL_CLASSES[DISCRIMINATOR_HEAD](self.model_config), discriminator),
                "generator": (MODEL_CLASSES["masked_lm"](self.generator_config), generator)}
