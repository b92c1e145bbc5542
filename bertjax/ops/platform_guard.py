"""A kernel named on a platform it cannot compile for is an error naming the choice, when the program compiles.

Each kernel registry (attention, disentangled attention, norm, GLU) declares the platforms its Pallas kernels compile
for. Which platform a program is for is known only when JAX lowers it: this machine's backend for a plain `jax.jit`
or an eager call, a TPU slice or an H100 for an ahead-of-time compile from a CPU host (bertjax.tpu_aot,
bertjax.gpu_aot), CUDA for `jax.export(..., platforms=["cuda"])`. Tracing (`jax.eval_shape`, `jax.make_jaxpr`)
names none. So the check is `require_platform(x, choice)`: an identity whose lowering compares the platforms being
lowered for with the kernel's and raises a ValueError naming the config field, the platform and what runs there;
it lowers to nothing. Without it Pallas fails inside JAX ("Only interpret mode is supported on CPU backend"), naming
neither the field nor the way out.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable, Mapping

import jax
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

# JAX's lowering platform names -> the names the registries use (jax.default_backend()'s).
_PLATFORM_NAMES = {"cuda": "gpu", "rocm": "gpu"}


@dataclasses.dataclass(frozen=True)
class KernelChoice:
    """A platform-bound kernel a program asked for, and what to say when it cannot run where the program compiles.

    what: the choice as the error names it ("attention implementation 'pallas_tpu'"); fields: where it is chosen;
    platforms: where it compiles; alternatives: every name of the registry and its platforms (None: every one), to
    list what runs instead; interpret: how to run the kernel in interpret mode instead."""

    what: str
    fields: str
    platforms: frozenset[str]
    alternatives: tuple[tuple[str, frozenset[str] | None], ...]
    interpret: str

    @classmethod
    def in_registry(cls, kind: str, name: str, platforms: Mapping[str, frozenset[str]], names: Iterable[str], *,
                    fields: str, interpret: str, auto: bool = False) -> KernelChoice:
        """`name` of a kernel registry: `platforms` maps its platform-bound names (any other runs anywhere), `names`
        are all of them; `auto`: the registry also takes "auto", which runs anywhere."""
        alternatives = tuple((n, platforms.get(n)) for n in sorted(names))
        return cls(what=f"{kind} implementation {name!r}", fields=fields, platforms=frozenset(platforms[name]),
                   alternatives=((("auto", None),) if auto else ()) + alternatives, interpret=interpret)

    def message(self, platform: str) -> str:
        able = [name for name, runs_on in self.alternatives if runs_on is None or platform in runs_on]
        return (f"{self.what} ({self.fields}) runs only on {'/'.join(sorted(self.platforms))}, but this program is "
                f"compiled for {platform}; what runs on {platform}: {able} (or {self.interpret} to run the Pallas "
                "kernel in interpret mode: slow, for tests)")


def require_platform(x: jax.Array, choice: KernelChoice, interpret) -> jax.Array:
    """`x`, unchanged; compiling it for a platform outside `choice.platforms` is a ValueError, unless the kernel
    runs in interpret mode (`interpret` truthy: True or Pallas' interpret parameters), which runs anywhere."""
    if interpret:
        return x
    return _guard_p.bind(x, choice=choice)


_guard_p = Primitive("bertjax_require_platform")
_guard_p.def_abstract_eval(lambda x, *, choice: x)


@functools.lru_cache(maxsize=None)
def _compiled_guard(choice: KernelChoice):
    return jax.jit(lambda x: _guard_p.bind(x, choice=choice))


# Eagerly, as every primitive does: compiled (for this machine's backend, so lowered and checked) and run.
_guard_p.def_impl(lambda x, *, choice: _compiled_guard(choice)(x))


def _lower(ctx, x, *, choice: KernelChoice):
    for platform in ctx.module_context.platforms:
        platform = _PLATFORM_NAMES.get(platform, platform)
        if platform not in choice.platforms:
            raise ValueError(choice.message(platform))
    return [x]


mlir.register_lowering(_guard_p, _lower)
# The identity under every transformation: tangents pass through untouched, batches keep their axis.
ad.primitive_jvps[_guard_p] = lambda primals, tangents, *, choice: (_guard_p.bind(*primals, choice=choice),
                                                                      tangents[0])
batching.primitive_batchers[_guard_p] = lambda args, dims, *, choice: (_guard_p.bind(*args, choice=choice), dims[0])
