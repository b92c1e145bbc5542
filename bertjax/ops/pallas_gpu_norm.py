"""bertjax's Pallas GPU (Triton) residual add + normalisation: each row is read once and written once each way.

The profile of modernbert-base's train step on an H100 (docs/benchmarks.md, the second lease) put each norm at 303
MB forward and 303 MB backward per [32,768 x 768] bfloat16 input: XLA's GPU fusion computes a row reduction and the
elementwise pass that needs its result in separate kernels, so the residual sum is written, then read again for the
variance and again to normalise, and the backward reads x and g once for its row sums and again for dx. Here one
program holds `block_rows` whole rows in registers, so

  forward:  read x and delta, write s = x + delta, y = norm(s) and each row's (mean, 1/std): ~200 MB there
  backward: read s, g_y and g_s, write ds = g_s + d norm / d s and per-program partial sums of the scale's and the
            bias's gradients (XLA adds those few rows up): ~200 MB there

which is what a pre-norm residual stream needs (s goes on down the stream, y into the next sublayer) and what a
post-norm one needs too (y alone goes on; s is the backward's residual). Rows are padded to a power of two in
registers only (Triton's tensors are powers of two): masked loads and stores move exactly the row's bytes.

The arithmetic is `bertjax.ops.normalize`'s: statistics in float32 from the sum rounded to the inputs' dtype,
two-pass variance, `(s - mean) * (rstd * scale) + bias`; the backward is the same closed form. Reductions run in a
different order than XLA's, so results agree to rounding, not bit for bit (tests/test_norm_kernels.py states the
tolerances).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
# Masked loads and stores of index-array tiles (interpret mode runs them too); this module loads only when a model
# asks for the kernel (bertjax.ops.normalize.IMPLEMENTATIONS).
from jax.experimental.pallas import triton as pl_triton

from bertjax.ops.pallas_gpu_attention import check_offsets_fit
from bertjax.ops.per_device import per_device

# Rows a program keeps in registers: four rows of 1,024 padded float32 features is 32 values per thread per
# array at 4 warps, which leaves the backward's three live arrays clear of the register limit (64K per block).
ROW_ELEMENTS = 4096
# The backward's programs, at most: each loops over its share of row blocks and writes one row of partial sums of
# the scale's (and bias's) gradient, which XLA then adds up: 1,024 rows of 1,024 float32 is 4 MB, against 50 MB
# for one [32,768 x 768] bfloat16 array.
MAX_BACKWARD_PROGRAMS = 1024


@dataclasses.dataclass(frozen=True)
class _Static:
    epsilon: float
    centered: bool
    out_dtype: jnp.dtype
    block_rows: int
    num_warps: int
    interpret: bool
    has_delta: bool


def _compiler_params(st: _Static):
    if st.interpret:
        return None
    return pl_triton.CompilerParams(num_warps=st.num_warps, num_stages=1)


def _load(ref, rows, cols, mask):
    return pl_triton.load(ref.at[rows[:, None], cols[None, :]], mask=mask, other=0).astype(jnp.float32)


def _store(ref, rows, cols, mask, value):
    pl_triton.store(ref.at[rows[:, None], cols[None, :]], value.astype(ref.dtype), mask=mask)


def _tile(block: int, n_rows: int, features: int, st: _Static):
    rows = block * st.block_rows + jnp.arange(st.block_rows)
    cols = jnp.arange(pl.next_power_of_2(features))
    row_ok = rows < n_rows
    return rows, cols, row_ok, row_ok[:, None] & (cols < features)[None, :]


def _row_vector(ref, cols, features):
    return pl_triton.load(ref.at[cols], mask=cols < features, other=0).astype(jnp.float32)[None, :]


def _forward_kernel(x_ref, delta_ref, scale_ref, bias_ref, s_ref, y_ref, mean_ref, rstd_ref, *, st: _Static):
    n_rows, features = x_ref.shape
    rows, cols, row_ok, mask = _tile(pl.program_id(0), n_rows, features, st)
    s = _load(x_ref, rows, cols, mask)
    if delta_ref is not None:
        # Rounded to the stream's dtype before the statistics, as `x + delta` followed by a norm computes it.
        s = (s + _load(delta_ref, rows, cols, mask)).astype(s_ref.dtype)
        _store(s_ref, rows, cols, mask, s)
        s = s.astype(jnp.float32)
    mean = jnp.sum(s, axis=1, keepdims=True) / features if st.centered else jnp.zeros((st.block_rows, 1))
    centred = jnp.where(mask, s - mean, 0.0)
    rstd = jax.lax.rsqrt(jnp.sum(centred * centred, axis=1, keepdims=True) / features + st.epsilon)
    y = centred * (rstd * _row_vector(scale_ref, cols, features))
    if bias_ref is not None:
        y = y + _row_vector(bias_ref, cols, features)
    _store(y_ref, rows, cols, mask, y)
    pl_triton.store(mean_ref.at[rows], mean[:, 0], mask=row_ok)
    pl_triton.store(rstd_ref.at[rows], rstd[:, 0], mask=row_ok)


def _backward_kernel(s_ref, g_ref, gs_ref, mean_ref, rstd_ref, scale_ref, ds_ref, dscale_ref, dbias_ref, *,
                     st: _Static, blocks_per_program: int):
    n_rows, features = s_ref.shape
    program = pl.program_id(0)
    width = pl.next_power_of_2(features)
    scale = _row_vector(scale_ref, jnp.arange(width), features)

    def block(b, sums):
        rows, cols, row_ok, mask = _tile(program * blocks_per_program + b, n_rows, features, st)
        mean = pl_triton.load(mean_ref.at[rows], mask=row_ok, other=0)[:, None]
        rstd = pl_triton.load(rstd_ref.at[rows], mask=row_ok, other=0)[:, None]
        x_hat = jnp.where(mask, (_load(s_ref, rows, cols, mask) - mean) * rstd, 0.0)  # 0 on padded rows/columns
        g = _load(g_ref, rows, cols, mask)
        g_scaled = g * scale
        correction = x_hat * (jnp.sum(g_scaled * x_hat, axis=1, keepdims=True) / features)
        if st.centered:
            correction = correction + jnp.sum(g_scaled, axis=1, keepdims=True) / features
        ds = rstd * (g_scaled - correction) + _load(gs_ref, rows, cols, mask)
        _store(ds_ref, rows, cols, mask, ds)
        dscale, dbias = sums
        return dscale + jnp.sum(g * x_hat, axis=0), dbias + jnp.sum(g, axis=0)

    zeros = jnp.zeros((width,), jnp.float32)
    dscale, dbias = jax.lax.fori_loop(0, blocks_per_program, block, (zeros, zeros))
    pl_triton.store(dscale_ref.at[program, jnp.arange(width)], dscale)
    if dbias_ref is not None:
        pl_triton.store(dbias_ref.at[program, jnp.arange(width)], dbias)


def _forward(x, delta, scale, bias, st: _Static):
    """Per device, x and delta [rows, features]: (s or None, y, mean [rows], rstd [rows])."""
    n_rows, features = x.shape
    blocks = pl.cdiv(n_rows, st.block_rows)
    shape = lambda dtype: jax.ShapeDtypeStruct((n_rows, features), dtype)
    row_stat = jax.ShapeDtypeStruct((n_rows,), jnp.float32)
    # Without a delta the stream is x itself and the kernel writes no sum.
    s_shape = shape(x.dtype) if delta is not None else None
    s, y, mean, rstd = pl.pallas_call(
        functools.partial(_forward_kernel, st=st),
        grid=(blocks,),
        out_shape=[s_shape, shape(st.out_dtype), row_stat, row_stat],
        compiler_params=_compiler_params(st),
        interpret=st.interpret,
        name="bertjax_add_norm_forward",
    )(x, delta, scale, bias)
    return s, y, mean, rstd


def _backward(s, g, gs, mean, rstd, scale, has_bias: bool, st: _Static):
    """Per device: (ds [rows, features], dscale partial sums [programs, width], dbias's or None)."""
    n_rows, features = s.shape
    blocks = pl.cdiv(n_rows, st.block_rows)
    per_program = pl.cdiv(blocks, MAX_BACKWARD_PROGRAMS)
    programs = pl.cdiv(blocks, per_program)
    partial = jax.ShapeDtypeStruct((programs, pl.next_power_of_2(features)), jnp.float32)
    outputs = [jax.ShapeDtypeStruct(s.shape, s.dtype), partial, partial if has_bias else None]
    return pl.pallas_call(
        functools.partial(_backward_kernel, st=st, blocks_per_program=per_program),
        grid=(programs,),
        out_shape=outputs,
        compiler_params=_compiler_params(st),
        interpret=st.interpret,
        name="bertjax_add_norm_backward",
    )(s, g, gs, mean, rstd, scale)


def _rows(a):
    return a.reshape(-1, a.shape[-1])


def _per_device(fn, operands, batch):
    """`fn` on each device's rows under the active mesh (XLA would replicate a Triton call), directly without one.
    Every operand and output is split along its first axis, or whole when it has none (the scale, the bias)."""
    roles = tuple(None if a is None else ("batch",) if a.ndim > 1 else () for a in operands)
    return per_device(fn, operands, roles, ("batch",), batch=batch, heads=1)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _add_norm(x, delta, scale, bias, st: _Static):
    return _add_norm_forward(x, delta, scale, bias, st)[0]


def _add_norm_forward(x, delta, scale, bias, st: _Static):
    lead = x.shape[:-1]

    def kernel(x, delta, scale, bias):
        s, y, mean, rstd = _forward(_rows(x), None if delta is None else _rows(delta), scale, bias, st)
        shaped = lambda a, last: None if a is None else a.reshape(x.shape[:-1] + last)
        return shaped(s, x.shape[-1:]), shaped(y, x.shape[-1:]), shaped(mean, ()), shaped(rstd, ())

    s, y, mean, rstd = _per_device(kernel, (x, delta, scale, bias), lead[0] if lead else 1)
    s = x if s is None else s
    return (s, y), (s, mean, rstd, scale, bias)


def _add_norm_backward(st: _Static, residuals, cotangents):
    s, mean, rstd, scale, bias = residuals
    gs, gy = cotangents
    has_bias = bias is not None

    def kernel(s, gy, gs, mean, rstd, scale):
        ds, dscale, dbias = _backward(_rows(s), _rows(gy), _rows(gs), mean.reshape(-1), rstd.reshape(-1), scale,
                                      has_bias, st)
        return ds.reshape(s.shape), dscale, dbias

    # custom_vjp hands a zero cotangent on s (post-norm: only y goes on) as an array of zeros; the kernel adds it
    # like any other (one [rows, features] read that post-norm models pay for nothing).
    ds, dscale, dbias = _per_device(kernel, (s, gy, gs, mean, rstd, scale), s.shape[0] if s.ndim > 1 else 1)
    features = s.shape[-1]
    dscale = jnp.sum(dscale, axis=0)[:features].astype(scale.dtype)
    dbias = jnp.sum(dbias, axis=0)[:features].astype(bias.dtype) if has_bias else None
    # s has the dtype of x and of delta (add_normalize checks they agree), so ds is the cotangent of both.
    return ds, (ds if st.has_delta else None), dscale, dbias


_add_norm.defvjp(_add_norm_forward, _add_norm_backward)


def add_normalize(x: jax.Array, delta: jax.Array | None, scale: jax.Array, bias: jax.Array | None, *,
                  epsilon: float, centered: bool, dtype, interpret: bool = False, block_rows: int | None = None,
                  num_warps: int | None = None) -> tuple[jax.Array, jax.Array]:
    """(s, y): s = x + delta (x when delta is None), y = norm(s) over the last axis, in one kernel each way.

    Shapes and meaning as `bertjax.ops.normalize.add_normalize`. block_rows (a power of two; default: as many rows
    as fit ROW_ELEMENTS padded features) and num_warps (default 4, 8 from 2,048 padded features) tune the kernels.
    Under a mesh (`jax.set_mesh`) the kernels run per device on the rows' first-axis shards.
    """
    width = pl.next_power_of_2(x.shape[-1])
    block_rows = block_rows or max(1, ROW_ELEMENTS // width)
    if block_rows & (block_rows - 1):
        raise ValueError(f"pallas_gpu norm: block_rows must be a power of two, got {block_rows}")
    if delta is not None and (delta.shape != x.shape or delta.dtype != x.dtype):
        raise ValueError(f"pallas_gpu norm: delta {delta.shape} {delta.dtype} must have the shape and dtype of x "
                         f"{x.shape} {x.dtype}")
    if scale.shape != x.shape[-1:] or (bias is not None and bias.shape != scale.shape):
        raise ValueError(f"pallas_gpu norm: scale and bias must be [{x.shape[-1]}], got {scale.shape} and "
                         f"{None if bias is None else bias.shape}")
    check_offsets_fit("pallas_gpu norm", interpret, x=x)
    st = _Static(epsilon=float(epsilon), centered=bool(centered), out_dtype=jnp.dtype(dtype), block_rows=block_rows,
                 num_warps=num_warps or (4 if width <= 1024 else 8), interpret=bool(interpret),
                 has_delta=delta is not None)
    return _add_norm(x, delta, scale, bias, st)
