"""What turns token states into a sentence embedding: pooling, optional Dense layers, truncation, normalisation.

Frozen and typed like EncoderConfig (they are jit static arguments, so they hash). The order of operations is
sentence-transformers': pool -> Dense layers -> Matryoshka truncation -> L2 normalisation.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from bertjax.models.pooling import POOLING_MODES
from bertjax.typecheck import check_field_types

PoolingMode = Literal["cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken"]


def _replace(instance, changes: dict):
    unknown = set(changes) - {f.name for f in dataclasses.fields(instance)}
    if unknown:
        raise ValueError(f"{type(instance).__name__} has no field(s) {sorted(unknown)}")
    return dataclasses.replace(instance, **changes)


@dataclasses.dataclass(frozen=True)
class PoolingConfig:
    """How token states become one vector per text.

    modes: sentence-transformers pooling modes, concatenated in this order (usually one).
    normalize: L2-normalise the final vector (sentence-transformers' Normalize module; cosine = dot product).
    truncate_dim: Matryoshka truncation: keep the first truncate_dim dimensions, before normalising, so a
        truncated normalised embedding is unit length again (sentence-transformers' `truncate_dim` with
        `normalize_embeddings=True`).
    include_prompt: False leaves the prompt's tokens ("query: ") out of pooling (INSTRUCTOR-style models).
    """

    modes: tuple[PoolingMode, ...] = ("mean",)
    normalize: bool = False
    truncate_dim: int | None = None
    include_prompt: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.modes, str):  # PoolingConfig(modes="cls") reads naturally; store the tuple
            object.__setattr__(self, "modes", (self.modes,))
        if isinstance(self.modes, list):
            object.__setattr__(self, "modes", tuple(self.modes))
        if isinstance(self.modes, tuple):  # name unknown modes before the generic type message
            unknown = [m for m in self.modes if m not in POOLING_MODES]
            if unknown:
                raise ValueError(f"PoolingConfig.modes: unknown {unknown}; known: {', '.join(POOLING_MODES)}")
        check_field_types(self)
        if not self.modes:
            raise ValueError("PoolingConfig.modes must name at least one pooling mode")
        if self.truncate_dim is not None and self.truncate_dim <= 0:
            raise ValueError(f"PoolingConfig.truncate_dim must be positive, got {self.truncate_dim}")

    def replace(self, **changes) -> "PoolingConfig":
        return _replace(self, changes)


# Activation after a Dense layer, by the torch class sentence-transformers stores in 2_Dense/config.json.
Activation = Literal["identity", "tanh", "relu", "gelu", "sigmoid", "silu"]


@dataclasses.dataclass(frozen=True)
class DenseConfig:
    """sentence-transformers' Dense module: y = activation(x W + b) [+ x, or + x R when use_residual]."""

    in_features: int
    out_features: int
    bias: bool = True
    activation: Activation = "tanh"  # sentence-transformers' default
    use_residual: bool = False

    def __post_init__(self) -> None:
        check_field_types(self)
        if self.in_features <= 0 or self.out_features <= 0:
            raise ValueError(f"DenseConfig features must be positive, got in_features={self.in_features}, "
                             f"out_features={self.out_features}")

    def replace(self, **changes) -> "DenseConfig":
        return _replace(self, changes)
