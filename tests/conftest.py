import os

# Tests run on CPU whatever the machine has; XLA's own thread pools are enough on 2 cores.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from bertjax.cpu_allocator import reuse_freed_memory  # noqa: E402

if os.environ["JAX_PLATFORMS"] == "cpu":  # as the command line does on CPU (the GPU kernel tests run on cuda)
    reuse_freed_memory()  # XLA's per-step temporaries reused instead of page-faulted


import pytest  # noqa: E402


@pytest.fixture(scope="module")
def compilation_cache(tmp_path_factory):
    """A persistent XLA cache for one test module (use with `pytest.mark.usefixtures`): runs that compile the same
    programs again (a resumed run, a second run of one config) look them up instead."""
    import jax

    names = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
             "jax_persistent_cache_min_entry_size_bytes")
    before = {name: getattr(jax.config, name) for name in names}
    jax.config.update("jax_compilation_cache_dir", str(tmp_path_factory.mktemp("xla-cache")))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    yield
    for name, value in before.items():
        jax.config.update(name, value)
