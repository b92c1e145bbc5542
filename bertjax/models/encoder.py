"""The layer stack: per-layer attention pattern, optional ALBERT-style parameter sharing, optional remat."""

from __future__ import annotations

import flax.linen as nn
import jax

from bertjax.config import EncoderConfig
from bertjax.models.common import norm
from bertjax.models.inputs import EncoderInputs
from bertjax.models.disentangled import EmbeddingConvolution, RelativeEmbeddings
from bertjax.models.layer import EncoderLayer

# Rematerialisation policies by name (the run config picks one). "none" keeps every activation.
REMAT_POLICIES = {
    "none": None,
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.checkpoint_dots,
    "dots_no_batch": jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims,
}


class EncoderStack(nn.Module):
    config: EncoderConfig
    remat_policy: str = "none"

    @nn.compact
    def __call__(self, x: jax.Array, inputs: EncoderInputs, deterministic: bool = True) -> jax.Array:
        cfg = self.config
        if self.remat_policy not in REMAT_POLICIES:
            raise ValueError(f"unknown remat_policy {self.remat_policy!r}; known: {sorted(REMAT_POLICIES)}")
        layer_cls = EncoderLayer
        if self.remat_policy != "none":
            layer_cls = nn.remat(EncoderLayer, policy=REMAT_POLICIES[self.remat_policy], prevent_cse=True)
        # With sharing (ALBERT) the config guarantees every layer has the same window and theta. Group g owns
        # layers_per_group distinct layers, named layers_{g * layers_per_group + j}; step i runs all of its group's.
        per_group = cfg.layers_per_group
        layers = []
        for k in range(cfg.layer_groups * per_group):
            skip_norm = k == 0 and cfg.norm_placement == "pre" and not cfg.first_layer_attention_norm
            group_start = next(i for i in range(cfg.num_layers) if cfg.layer_group(i) == k // per_group)
            layers.append(layer_cls(cfg, cfg.layer_window(group_start), cfg.layer_rope_theta(group_start),
                                    has_attention_norm=not skip_norm, deterministic=deterministic,
                                    name=f"layers_{k}"))
        # sow is free unless "intermediates" is mutable (bertjax.intermediates.hidden_states asks for it). The last
        # entry is the stack's output after the final norm, as transformers' hidden_states[-1] is.
        self.sow("intermediates", "hidden_states", x)
        embeddings = x
        if cfg.disentangled is not None:  # one relative table per forward, read by every layer
            inputs = inputs.replace(relative_embeddings=RelativeEmbeddings(cfg, name="relative")())
        # A pre-norm layer hands on its MLP output unadded (`pending`): the next norm adds it (layer.py).
        stream = lambda x, pending: x if pending is None else x + pending
        pending = None
        for i in range(cfg.num_layers):
            group = cfg.layer_group(i)
            for j in range(per_group):
                x, pending = layers[group * per_group + j](x, inputs, pending)
            if i == 0 and cfg.disentangled is not None and cfg.disentangled.conv_kernel_size:
                x, pending = EmbeddingConvolution(cfg, name="conv")(embeddings, stream(x, pending),
                                                                      inputs.segment_ids), None
            if i < cfg.num_layers - 1:
                self.sow("intermediates", "hidden_states", stream(x, pending))
        if cfg.final_norm:
            x = norm(cfg, "final_norm")(x, pending)
        else:
            x = stream(x, pending)
        self.sow("intermediates", "hidden_states", x)
        return x
