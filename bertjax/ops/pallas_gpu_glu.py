"""bertjax's Pallas GPU (Triton) gated linear unit: act(a) * b of the stacked up-projection, one pass each way.

`bertjax.ops.glu` says why: XLA's fusions of modernbert-base's GeGLU moved 302 MB forward and 453 MB backward per
layer on an H100, where these kernels move what the arithmetic needs:

  forward:  read the stack [rows, 2, features] (a and b), write h = act(a) * b: 226 MB there
  backward: read the stack and h's cotangent g, write the stack's cotangent [g * b * act'(a), g * act(a)]: 377 MB

The backward recomputes act(a) from the stack it reads anyway, so nothing but the stack (which the up-projection's
backward keeps regardless) is saved for it; XLA saved an activation-sized intermediate per layer besides. Each
program takes a [block_rows x block_cols] tile of a and the same of b (elementwise: no whole rows needed), in
float32, and rounds once to the stack's dtype.

Exact GELU needs erf, which Pallas's Triton lowering does not have: it is computed here with Abramowitz and
Stegun's formula 7.1.26 (absolute error at most 1.5e-7, against bfloat16's 3.9e-3 relative rounding), whose
exp(-x^2) is also the Gaussian density GELU's derivative needs.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
# Masked loads and stores of index-array tiles (interpret mode runs them too); this module loads only when a model
# asks for the kernel (bertjax.ops.glu.IMPLEMENTATIONS).
from jax.experimental.pallas import triton as pl_triton

from bertjax.ops.pallas_gpu_attention import check_offsets_fit
from bertjax.ops.per_device import per_device

# A program's tile of a (and of b): 16 x 128, 16 values of each per thread at 4 warps. Compiled for sm_90 (GELU,
# bfloat16; `python -m bench.pallas_gpu_static --kernel glu`) that is 37 registers forward and 72 backward, 48 and
# 28 resident warps per SM, where 32 x 128 took 60 / 112 registers and 32 / 16 warps: memory-bound kernels want
# many loads in flight. modernbert-base's 1,152 features are 9 tiles across.
DEFAULT_BLOCK_ROWS = 16
DEFAULT_BLOCK_COLS = 128

# Abramowitz and Stegun 7.1.26: erf(x) = 1 - t (A1 + t (A2 + t (A3 + t (A4 + t A5)))) exp(-x^2), t = 1 / (1 + P x),
# for x >= 0 (odd function).
_P = 0.3275911
_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)
_SQRT_HALF = 1 / math.sqrt(2)
_INV_SQRT_2PI = 1 / math.sqrt(2 * math.pi)
_SQRT_2_OVER_PI = math.sqrt(2 / math.pi)
_TANH_CUBIC = 0.044715


def _gelu(a, derivative: bool):
    x = a * _SQRT_HALF
    t = 1.0 / (1.0 + _P * jnp.abs(x))
    poly = t * (_A[0] + t * (_A[1] + t * (_A[2] + t * (_A[3] + t * _A[4]))))
    gauss = jnp.exp(-x * x)
    erf = jnp.where(x >= 0, 1.0, -1.0) * (1.0 - poly * gauss)
    cdf = 0.5 * (1.0 + erf)
    return a * cdf, (cdf + a * gauss * _INV_SQRT_2PI) if derivative else None


def _gelu_tanh(a, derivative: bool):
    t = jnp.tanh(_SQRT_2_OVER_PI * (a + _TANH_CUBIC * a * a * a))
    value = 0.5 * a * (1.0 + t)
    if not derivative:
        return value, None
    return value, 0.5 * (1.0 + t) + 0.5 * a * (1.0 - t * t) * _SQRT_2_OVER_PI * (1.0 + 3 * _TANH_CUBIC * a * a)


def _silu(a, derivative: bool):
    sigmoid = 1.0 / (1.0 + jnp.exp(-a))
    return a * sigmoid, (sigmoid * (1.0 + a * (1.0 - sigmoid))) if derivative else None


def _relu(a, derivative: bool):
    return jnp.maximum(a, 0.0), jnp.where(a > 0, 1.0, 0.0) if derivative else None


def _tanh(a, derivative: bool):
    t = jnp.tanh(a)
    return t, (1.0 - t * t) if derivative else None


# (act(a), act'(a) or None) in float32, by bertjax.ops.activations name.
RULES = {"gelu": _gelu, "gelu_tanh": _gelu_tanh, "silu": _silu, "relu": _relu, "tanh": _tanh}


@dataclasses.dataclass(frozen=True)
class _Static:
    activation: str
    block_rows: int
    block_cols: int
    num_warps: int
    interpret: bool


def _compiler_params(st: _Static):
    if st.interpret:
        return None
    return pl_triton.CompilerParams(num_warps=st.num_warps, num_stages=1)


def _tile(n_rows: int, features: int, st: _Static):
    """This program's rows, columns of a (b's are features further on) and the in-bounds mask."""
    rows = pl.program_id(0) * st.block_rows + jnp.arange(st.block_rows)
    cols = pl.program_id(1) * st.block_cols + jnp.arange(st.block_cols)
    return rows, cols, (rows < n_rows)[:, None] & (cols < features)[None, :]


def _load(ref, rows, cols, mask):
    return pl_triton.load(ref.at[rows[:, None], cols[None, :]], mask=mask, other=0).astype(jnp.float32)


def _store(ref, rows, cols, mask, value):
    pl_triton.store(ref.at[rows[:, None], cols[None, :]], value.astype(ref.dtype), mask=mask)


def _forward_kernel(y_ref, h_ref, *, st: _Static):
    n_rows, features = h_ref.shape
    rows, cols, mask = _tile(n_rows, features, st)
    value, _ = RULES[st.activation](_load(y_ref, rows, cols, mask), derivative=False)
    _store(h_ref, rows, cols, mask, value * _load(y_ref, rows, features + cols, mask))


def _backward_kernel(y_ref, g_ref, dy_ref, *, st: _Static):
    n_rows, features = g_ref.shape
    rows, cols, mask = _tile(n_rows, features, st)
    value, slope = RULES[st.activation](_load(y_ref, rows, cols, mask), derivative=True)
    g = _load(g_ref, rows, cols, mask)
    _store(dy_ref, rows, cols, mask, g * _load(y_ref, rows, features + cols, mask) * slope)
    _store(dy_ref, rows, features + cols, mask, g * value)


def _grid(n_rows: int, features: int, st: _Static):
    return pl.cdiv(n_rows, st.block_rows), pl.cdiv(features, st.block_cols)


def _forward(y2, st: _Static):
    """Per device: y2 [rows, 2 * features] (a, then b) -> h [rows, features]."""
    n_rows, features = y2.shape[0], y2.shape[1] // 2
    return pl.pallas_call(
        functools.partial(_forward_kernel, st=st),
        grid=_grid(n_rows, features, st),
        out_shape=jax.ShapeDtypeStruct((n_rows, features), y2.dtype),
        compiler_params=_compiler_params(st),
        interpret=st.interpret,
        name="bertjax_glu_forward",
    )(y2)


def _backward(y2, g, st: _Static):
    """Per device: the cotangent of y2 from y2 and h's cotangent g [rows, features]."""
    n_rows, features = g.shape
    return pl.pallas_call(
        functools.partial(_backward_kernel, st=st),
        grid=_grid(n_rows, features, st),
        out_shape=jax.ShapeDtypeStruct(y2.shape, y2.dtype),
        compiler_params=_compiler_params(st),
        interpret=st.interpret,
        name="bertjax_glu_backward",
    )(y2, g.astype(y2.dtype))


def _per_device(fn, operands, roles, out_roles, y):
    """`fn` on each device's shard under the active mesh: leading axis as the batch, features as the MLP's
    activations ("activation_mlp"), so tensor parallelism keeps its split."""
    return per_device(fn, operands, roles, out_roles, batch=y.shape[0] if y.ndim > 2 else 1, heads=1,
                      mlp=y.shape[-1])


def _roles(ndim: int):
    return ("batch",) + (None,) * (ndim - 2) + ("mlp",) if ndim > 1 else ("mlp",)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _glu(y, st: _Static):
    return _glu_forward(y, st)[0]


def _glu_forward(y, st: _Static):
    def kernel(y):
        lead = y.shape[:-2]
        return _forward(y.reshape(-1, 2 * y.shape[-1]), st).reshape(*lead, y.shape[-1])

    return _per_device(kernel, (y,), (_roles(y.ndim),), _roles(y.ndim - 1), y), y


def _glu_backward(st: _Static, y, g):
    def kernel(y, g):
        return _backward(y.reshape(-1, 2 * y.shape[-1]), g.reshape(-1, g.shape[-1]), st).reshape(y.shape)

    return (_per_device(kernel, (y, g), (_roles(y.ndim), _roles(g.ndim)), _roles(y.ndim), y),)


_glu.defvjp(_glu_forward, _glu_backward)


def glu(y: jax.Array, activation: str, *, interpret: bool = False, block_rows: int = DEFAULT_BLOCK_ROWS,
        block_cols: int = DEFAULT_BLOCK_COLS, num_warps: int = 4) -> jax.Array:
    """act(y[..., 0, :]) * y[..., 1, :] for y [..., 2, features] in one kernel each way (`bertjax.ops.glu`).

    block_rows x block_cols (powers of two) is each program's tile of a and of b. Under a mesh (`jax.set_mesh`)
    the kernels run per device, split along y's first axis (batch) and its features (as "activation_mlp" maps).
    """
    if activation not in RULES:
        raise ValueError(f"pallas_gpu glu: no kernel rule for activation {activation!r}; known: {sorted(RULES)}")
    for name, size in (("block_rows", block_rows), ("block_cols", block_cols)):
        if size < 1 or size & (size - 1):
            raise ValueError(f"pallas_gpu glu: {name} must be a power of two, got {size}")
    check_offsets_fit("pallas_gpu glu", interpret, y=y)
    st = _Static(activation=activation, block_rows=block_rows, block_cols=block_cols, num_warps=num_warps,
                 interpret=bool(interpret))
    return _glu(y, st)
