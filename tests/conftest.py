import atexit
import os
import shutil
import tempfile

from train_helpers import FAST_COMPILE_FLAGS

# Tests run on CPU whatever the machine has; XLA's own thread pools are enough on 2 cores.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

if os.environ["JAX_PLATFORMS"] == "cpu":  # the GPU kernel tests run on cuda, with XLA's defaults
    # Set before JAX starts, and inherited by the commands, scripts and notebook kernels tests start: compiling tiny
    # programs is most of the suite's time, and these flags halve it. Each comparison a test makes is between runs
    # under the same flags (or against another library, within the stated tolerances).
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {FAST_COMPILE_FLAGS}".strip()
    # One persistent compilation cache per test process and the processes it starts: resumed runs, second runs of a
    # config, and each command-line run of the same tiny config look up the programs the first one compiled.
    if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
        cache_dir = tempfile.mkdtemp(prefix="bertjax-test-xla-cache-")
        atexit.register(shutil.rmtree, cache_dir, ignore_errors=True)
        os.environ["JAX_COMPILATION_CACHE_DIR"] = cache_dir
        os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0.1"
        os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"

    from bertjax.cpu_allocator import reuse_freed_memory

    reuse_freed_memory()  # as the command line does on CPU: XLA's per-step temporaries reused, not page-faulted


# The slowest files (seconds per worker in a 2-worker run on 2 cores, 2026-11-28: 112 down to 28), handed out
# first. xdist's loadfile otherwise starts the files with the most tests first, so a slow file with few tests could
# start last and leave the other worker idle for its whole length; longest first, the two workers finish within
# seconds of each other. A file missing here only runs later; the list needs no upkeep for correctness.
SLOW_FILES_FIRST = ("test_notebooks.py", "test_robust_checkpoints.py", "test_train_sharding.py",
                    "test_finetune_run.py", "test_hf_task_heads.py", "test_attention_kernels.py",
                    "test_gpu_session.py", "test_pallas_gpu_export.py", "test_train_objective_runs.py",
                    "test_inference.py", "test_hf_io.py", "test_hf_parity.py", "test_train_recipe.py",
                    "test_usability_reshard.py", "test_tpu_aot.py", "test_train_multihost.py", "test_xlnet_model.py",
                    "test_python_api.py", "test_norm_kernels.py", "test_embedder_loss.py", "test_model_inputs.py",
                    "test_deberta.py", "test_train_resume.py", "test_train_loop.py", "test_xlnet_objective.py",
                    "test_deberta_pallas_gpu.py", "test_intermediates.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(SLOW_FILES_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order
