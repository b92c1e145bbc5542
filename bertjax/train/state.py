"""The train state (step, float32 master parameters, optimizer state), created already sharded over the mesh.

`create_train_state` never materialises the model on one device: `jax.eval_shape` gives the shapes and logical
axis names, the mesh rules turn those into shardings, and the initialiser runs under `jax.jit` with those
`out_shardings`, so each device computes only its own shards.

The parameters come from an initialiser `init_params(key) -> parameters boxed with their logical axis names`
(a training objective's `init_params`: one model, or ELECTRA's generator and discriminator together).
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct, traverse_util
from jax.sharding import Mesh, NamedSharding

from bertjax.models.params import draw_leaves
from bertjax.train import mesh as mesh_lib
from bertjax.train.optimizers import param_path


@struct.dataclass
class TrainState:
    step: jax.Array  # optimizer updates done (int32, replicated)
    params: Any  # float32 master weights; the model casts them to its compute dtype
    opt_state: Any


Initialiser = Callable[[jax.Array], Any]  # key -> parameters boxed with logical axis names


def _init_fn(init_params: Initialiser, optimizer: optax.GradientTransformation):
    def init(key: jax.Array) -> TrainState:
        params = nn.meta.unbox(init_params(key))
        return TrainState(step=jnp.zeros([], jnp.int32), params=params, opt_state=optimizer.init(params))
    return init


# Objective -> {initialiser function: its boxed shapes}: dropped with the objective (a distillation objective holds
# its teacher's weights, which a process-wide cache would keep alive).
_TRACED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def abstract_boxed_params(init_params: Initialiser) -> Any:
    """The parameters' shapes and dtypes, boxed with their logical axis names: the initialiser traced at key 0, once
    per objective when it is an objective's method (setting up a run asks for them several times, and tracing a base
    model's initialiser takes most of a second each time); any other initialiser is traced at each call."""
    owner = getattr(init_params, "__self__", None)
    if owner is None:
        return jax.eval_shape(init_params, jax.random.key(0))
    traced = _TRACED.setdefault(owner, {})
    if init_params.__func__ not in traced:
        traced[init_params.__func__] = jax.eval_shape(init_params, jax.random.key(0))
    return traced[init_params.__func__]


def unsplit_parameters_note(init_params: Initialiser, mesh: Mesh, min_bytes: int = 1 << 20) -> str | None:
    """A warning naming the parameters (of `min_bytes` or more) that the mesh would split but keeps whole on every
    chip, with their optimizer state, because a mesh axis does not divide one of their axes (BERT's vocabulary of
    30522 over tensor=4): memory a user expects to save and does not. None when there are none."""
    abstract = abstract_boxed_params(init_params)
    specs = nn.get_partition_spec(abstract)
    lines = []
    for (path, leaf), spec in zip(jax.tree_util.tree_flatten_with_path(nn.meta.unbox(abstract))[0],
                                  jax.tree.leaves(specs, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))):
        size = leaf.size * jnp.dtype(leaf.dtype).itemsize
        kept = mesh_lib.unsplit_axes(spec, leaf.shape, mesh) if size >= min_bytes else []
        if kept:
            axes = ", ".join(f"{name} {length} over {over}" for name, length, over in kept)
            lines.append(f"{param_path(path)} ({size / 2**20:.1f} MiB; {axes})")
    if not lines:
        return None
    return (f"mesh {dict(mesh.shape)}: {len(lines)} parameter(s) stay whole on every chip, with their optimizer "
            f"state, because the mesh axes do not divide them: {'; '.join(lines[:6])}"
            f"{'; ...' if len(lines) > 6 else ''}. A vocabulary padded to a multiple of the axis "
            "(model.overrides.vocab_size), or another mesh shape, splits them")


def mirrored_shardings(tree: Any, param_shardings: dict[str, NamedSharding], param_shapes: dict[str, tuple],
                       mesh: Mesh) -> Any:
    """Shard each leaf like the parameter whose path its own path ends with (optimizer moments mirror the
    parameter tree inside whatever wrapper states an optax chain adds); counters and scalars are replicated."""
    def sharding_of(path, leaf):
        keys = param_path(path).split("/")
        for start in range(len(keys)):
            name = "/".join(keys[start:])
            if name in param_shardings and tuple(leaf.shape) == param_shapes[name]:
                return param_shardings[name]
        return mesh_lib.replicated(mesh)
    return jax.tree_util.tree_map_with_path(sharding_of, tree)


def state_shardings(init_params: Initialiser, optimizer: optax.GradientTransformation,
                    mesh: Mesh) -> tuple[TrainState, TrainState]:
    """(abstract state, its shardings): the shapes/dtypes of the state and where each leaf lives."""
    boxed = abstract_boxed_params(init_params)
    abstract_params = nn.meta.unbox(boxed)
    abstract = TrainState(step=jax.ShapeDtypeStruct((), jnp.int32), params=abstract_params,
                          opt_state=jax.eval_shape(optimizer.init, abstract_params))
    params = mesh_lib.logical_shardings(nn.get_partition_spec(boxed), abstract.params, mesh)
    by_path = {param_path(p): s for p, s in jax.tree_util.tree_flatten_with_path(params)[0]}
    shapes = {param_path(p): tuple(x.shape) for p, x in jax.tree_util.tree_flatten_with_path(abstract.params)[0]}
    shardings = TrainState(step=mesh_lib.replicated(mesh), params=params,
                           opt_state=mirrored_shardings(abstract.opt_state, by_path, shapes, mesh))
    return abstract, shardings


def create_train_state(init_params: Initialiser, optimizer: optax.GradientTransformation, mesh: Mesh,
                       seed: int) -> tuple[TrainState, TrainState]:
    """(state, shardings): freshly initialised parameters and optimizer state, each leaf born on its shards.

    Random values do not depend on the mesh (JAX's partitionable threefry), so every mesh shape starts from the
    same parameters as a single device. The initialiser is traced outside `mesh_lib.activate`: `out_shardings`
    alone places every leaf.
    """
    _, shardings = state_shardings(init_params, optimizer, mesh)
    state = jax.jit(_init_fn(init_params, optimizer), out_shardings=shardings)(jax.random.key(seed))
    return state, shardings


def abstract_state(init_params: Initialiser, optimizer: optax.GradientTransformation, mesh: Mesh) -> TrainState:
    """ShapeDtypeStructs carrying their shardings: the target a checkpoint is restored into."""
    abstract, shardings = state_shardings(init_params, optimizer, mesh)
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract, shardings)


def count_params(params: Any) -> int:
    return sum(int(x.size) for x in jax.tree.leaves(params))


# Starting a fine-tuning or embedder run from a pretrained model's parameters, or resuming one.

def boxed_initialiser(model) -> Callable[[jax.Array], Any]:
    """key -> parameters boxed with their logical axis names (what sharded state creation reads)."""
    return lambda key: model.init({"params": key, "dropout": key}, model.example_input_ids(8))["params"]


def transplant(fresh: Any, pretrained: Any, path: str = "") -> tuple[Any, list[str]]:
    """`fresh` with every subtree that `pretrained` has with the same structure and shapes replaced by it;
    returns the paths that stayed fresh (the new head, or a classifier of another size)."""
    if isinstance(fresh, dict):
        out, new = {}, []
        for key, value in fresh.items():
            if isinstance(pretrained, dict) and key in pretrained:
                out[key], more = transplant(value, pretrained[key], f"{path}/{key}" if path else key)
                new += more
            else:
                out[key] = value
                new.append(f"{path}/{key}" if path else key)
        return out, new
    if hasattr(pretrained, "shape") and tuple(pretrained.shape) == tuple(fresh.shape):
        return np.asarray(jax.device_get(pretrained)).astype(fresh.dtype), []
    return fresh, [path]


def place(tree: Any, shardings: Any) -> Any:
    """Host values (the same on every process) onto their global shardings; device arrays stay as they are."""
    def put(value, sharding):
        if isinstance(value, jax.Array):
            return value
        value = np.asarray(value)
        return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])
    return jax.tree.map(put, tree, shardings)


def start_or_resume(model, optimizer: optax.GradientTransformation, mesh: Mesh, checkpointer, start: int,
                    seed: int, pretrained: Any) -> tuple[TrainState, TrainState, dict, list[str] | None]:
    """A fine-tuning or embedder run's train state: restored from the workdir's checkpoint of step `start` (its
    later steps set aside to be trained again), or, with `start` 0, created afresh with `pretrained`'s parameters
    transplanted in. Returns (state, shardings, the loss accumulated since the last report, the parameter paths
    that stayed freshly initialised: None when restored)."""
    initialise = boxed_initialiser(model)
    if start:
        state, accumulated = checkpointer.restore(start, abstract_state(initialise, optimizer, mesh))
        _, shardings = state_shardings(initialise, optimizer, mesh)
        checkpointer.set_aside_after(start)  # checkpoint.restore_step: the later steps are trained again
        return state, shardings, accumulated, None
    state, shardings, fresh = _start_from(initialise, optimizer, mesh, seed, pretrained)
    return state, shardings, {"loss_sum": 0.0, "count": 0.0}, fresh


def _start_from(init_params: Initialiser, optimizer: optax.GradientTransformation, mesh: Mesh, seed: int,
                pretrained: Any) -> tuple[TrainState, TrainState, list[str]]:
    """`create_train_state` with `pretrained`'s parameters wherever their shapes fit: only the rest (a new head)
    is drawn, by an initialiser that returns just those leaves, so XLA drops the backbone's random draws (seconds
    of compile and a second copy of the model). The values are the ones the whole initialiser draws for them."""
    abstract, shardings = state_shardings(init_params, optimizer, mesh)
    merged, fresh = transplant(abstract.params, pretrained)
    flat = traverse_util.flatten_dict(merged)
    missing = [path for path, value in flat.items() if isinstance(value, jax.ShapeDtypeStruct)]
    if missing:
        param_shardings = traverse_util.flatten_dict(shardings.params)
        flat.update(zip(missing, draw_leaves(init_params, missing, jax.random.key(seed),
                                             [param_shardings[path] for path in missing])))
    params = place(traverse_util.unflatten_dict(flat), shardings.params)
    opt_state = jax.jit(optimizer.init, out_shardings=shardings.opt_state)(params)
    step = jax.device_put(jnp.zeros([], jnp.int32), shardings.step)
    return TrainState(step=step, params=params, opt_state=opt_state), shardings, fresh
