"""launch/gpu_session.sh, checked on CPU before a GPU lease spends device time on it: every command of its plans
parses with its bench's own argument parser, the pytest files it names exist, the main plan fits one 10-minute call
of the device tool with room to spare and a whole run ends by its deadline, bad stages are refused; and the
attention targets it prints are computed from the measured rows as the issue states them."""

import importlib
import os
import pathlib
import shlex
import subprocess
import time

import chex
import jax
import pytest

from bench.attention_bench import gpu_targets

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "launch" / "gpu_session.sh"
CALL_LIMIT_S = 600  # the device tool's limit on one command


CALL_1_TIMEOUT_S = 590  # the runbook's timeout_s for call 1


def dry_run(*stages: str, deadline: int | str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, **({"GPU_SESSION_DEADLINE": str(deadline)} if deadline is not None else {})}
    return subprocess.run(["bash", str(SCRIPT), "--dry-run", *stages], capture_output=True, text=True, cwd=ROOT,
                          timeout=60, env=env)


def planned_commands(output: str) -> list[tuple[str, int, list[str]]]:
    """(stage, cap in seconds, argv) of each line `  [stage, cap Ns] command...` of a dry run."""
    commands = []
    for line in output.splitlines():
        if line.startswith("  ["):
            head, command = line[3:].split("]", 1)
            stage, cap = head.split(", cap ")
            commands.append((stage, int(cap.rstrip("s")), shlex.split(command)))
    return commands


@pytest.mark.parametrize("stages", [(), ("inference", "atomic", "tune"), ("mosaic", "tune_train", "tune_wide",
                                                                        "tune_mosaic", "train_atomic"),
                                    ("train", "attention", "profile", "tune")],
                         ids=["main plan", "second call", "other sweeps", "second call after a change"])
def test_every_planned_command_parses(stages):
    result = dry_run(*stages)
    assert result.returncode == 0, result.stderr
    commands = planned_commands(result.stdout)
    assert {stage for stage, _, _ in commands} == set(stages or ("env", "check", "norm", "train_kernels", "memory"))
    for _, _, argv in commands:
        while argv[0] == "env" or "=" in argv[0]:  # `env NAME=VALUE ... command`: the command is what must parse
            argv = argv[1:]
        if argv[:3] == ["python3", "-m", "pytest"]:
            files = [arg for arg in argv if arg.endswith(".py")]
            assert files and all((ROOT / name).is_file() for name in files), argv
        elif argv[:2] == ["python3", "-m"]:
            module = importlib.import_module(argv[2])
            module.parse_args(argv[3:])  # argparse exits (SystemExit) on a flag the bench does not have
        else:
            assert argv[0] in {"nvidia-smi", "python3"}, argv


def test_main_plan_fits_one_call_with_room_for_the_start():
    result = dry_run()
    total = int(result.stdout.strip().splitlines()[-1].split()[-1].rstrip("s"))
    assert total <= CALL_LIMIT_S - 30  # the call's own timeout_s sits between the caps and the limit
    commands = planned_commands(result.stdout)
    caps = {stage: cap for stage, cap, _ in commands}
    assert caps["memory"] == max(caps.values())  # the one target no lease has measured yet gets the most time
    # Every stage run to its cap and killed 5 s later still ends before call 1's timeout_s.
    assert sum(caps.values()) + 5 * len(caps) <= 580 < CALL_1_TIMEOUT_S


def test_call_1_measures_what_the_issue_asks_side_by_side():
    """The kernels' A/B times transformers on the same card in the same run (no `--no-transformers`: the issue asks
    side by side, and call 2 has no train stage); the kernel check names each test it passes (-v: a capped run
    still says which did); the memory search starts from the card's own memory (--start-batch auto)."""
    commands = planned_commands(dry_run().stdout)
    argv = {stage: command for stage, _, command in commands}
    assert "--no-transformers" not in argv["train_kernels"]
    assert "-v" in argv["check"] and "-q" not in argv["check"]
    memory = [command for stage, _, command in commands if stage == "memory"]
    assert [command[command.index("--start-batch") + 1] for command in memory] == ["auto", "auto"]


def test_each_kernel_case_gets_time_for_pytest_and_its_compile():
    """The atomic and mosaic stages' one pytest case needs pytest's start and a ~25 s compile: 50 s at least."""
    for stage in ("atomic", "mosaic"):
        first_cap, first = planned_commands(dry_run(stage).stdout)[0][1:]
        assert first[:3] == ["python3", "-m", "pytest"] and first_cap >= 50 and "-v" in first


def test_the_deadline_cuts_the_last_stages_and_skips_what_it_cannot_fit():
    """The dry run counts each stage as running to its cap plus its kill's 5 s: under a 160 s deadline env (20 s)
    and check (100 s) fit, norm gets 160 - 130 - 8 = 22 s of its 40 (its minimum is 20), and train_kernels and
    memory are skipped, each said in one line (nothing is left after norm's 22 + 5 s)."""
    result = dry_run(deadline=160)
    assert result.returncode == 0, result.stderr
    caps = [(stage, cap) for stage, cap, _ in planned_commands(result.stdout)]
    assert caps == [("env", 20), ("env", 20), ("check", 100), ("norm", 22)]
    assert "=== train_kernels: skipped: 0s left before the 160s deadline, it needs 60s" in result.stdout
    assert "=== memory: skipped: 0s left before the 160s deadline, it needs 90s" in result.stdout
    assert result.stdout.strip().splitlines()[-1] == "# caps sum to 142s"
    bad = dry_run(deadline="soon")
    assert bad.returncode == 2 and "GPU_SESSION_DEADLINE must be whole seconds" in bad.stderr


def test_a_run_stops_its_stages_by_the_deadline_and_says_so(tmp_path):
    """A real (not dry) run with stand-ins for python3 and nvidia-smi whose benches never finish: the stage that
    starts is stopped at its cap, the ones the deadline leaves too little are skipped, the run ends before its
    deadline, and the summary names each."""
    stubs = tmp_path / "bin"
    stubs.mkdir()
    (stubs / "python3").write_text('#!/usr/bin/env bash\nfor a in "$@"; do [ "$a" = -c ] && exit 0; done\n'
                                   "exec sleep 100\n")
    (stubs / "nvidia-smi").write_text("#!/usr/bin/env bash\necho 'NVIDIA H200, 143771 MiB'\n")
    for stub in stubs.iterdir():
        stub.chmod(0o755)
    env = {**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}", "OUT": str(tmp_path / "out"),
           "GPU_SESSION_DEADLINE": "20"}
    began = time.monotonic()
    result = subprocess.run(["bash", str(SCRIPT), "env:6", "check", "memory:9"], capture_output=True, text=True,
                            cwd=ROOT, timeout=60, env=env)
    assert result.returncode == 0, result.stderr
    assert time.monotonic() - began < 20
    summary = result.stdout.split("=== summary")[1].splitlines()[1:]
    assert summary[0].startswith("  env: 6s of a 6s cap; bench.gpu_env stopped after ")
    assert [line.split(": ")[:2] for line in summary[1:]] == [["  check", "skipped"], ["  memory", "skipped"]]
    assert summary[1].endswith("left before the 20s deadline, it needs 45s")
    assert summary[2].endswith("left before the 20s deadline, it needs 9s")  # its own cap: the caller's choice
    assert (tmp_path / "out" / "env.log").read_text().startswith("NVIDIA H200")

@pytest.mark.parametrize("stages, message", [(("bogus",), "unknown stage 'bogus'"),
                                             (("tune:soon",), "must be whole seconds")])
def test_bad_stages_are_refused(stages, message):
    result = dry_run(*stages)
    assert result.returncode == 2 and message in result.stderr


def test_stage_caps_override_the_defaults():
    commands = planned_commands(dry_run("tune:45", "memory:100").stdout)
    assert [(stage, cap) for stage, cap, _ in commands] == [("tune", 45), ("memory", 20), ("memory", 100)]


def ok(seconds: float) -> dict:
    return {"status": "ok", "seconds": seconds}


def test_attention_targets_follow_the_issue():
    window, docs = 128, 16
    results = {
        (8192, None, 1, "forward+backward", "pallas_gpu"): ok(10.0),
        (8192, None, 1, "forward+backward", "cudnn"): ok(6.0),  # pallas at 0.6x cuDNN's speed: not met
        (8192, window, 1, "forward+backward", "pallas_gpu"): ok(1.0),  # 10x faster than global: met
        (8192, None, docs, "forward+backward", "pallas_gpu"): ok(10.0),  # not faster than one document: not met
        (512, None, 1, "forward", "pallas_gpu"): ok(1.0),
        (512, None, 1, "forward", "cudnn"): ok(0.8),  # 0.8x: met
        (512, window, 1, "forward", "pallas_gpu"): ok(2.0),  # slower, but no target below 8192
        (2048, None, 1, "forward", "pallas_gpu"): {"status": "failed: boom"},
        (2048, None, 1, "forward", "cudnn"): ok(1.0),
    }
    lines = gpu_targets(results, window, docs)
    assert lines == [
        "# seq 512 forward: pallas_gpu global vs cuDNN's speed: 0.80x (target >= 0.7x): met",
        "# seq 512 forward: pallas_gpu local 128 faster than its global: 0.50x (no target at this length)",
        "# seq 8192 forward+backward: pallas_gpu global vs cuDNN's speed: 0.60x (target >= 0.7x): NOT met",
        "# seq 8192 forward+backward: pallas_gpu local 128 faster than its global: 10.00x (target >= 5x): met",
        "# seq 8192 forward+backward: 16 packed documents faster than one: 1.00x (target > 1x): NOT met",
    ]


def test_gpu_paths_run_on_cpu_in_a_dry_run(monkeypatch, capsys):
    """The --gpu comparison and the largest-batch search with a tiny model on CPU (what `--dry-run` does): the order
    of the rows, the ratio against transformers, and the summary lines the GPU run prints."""
    import bench.train_bench as train_bench

    monkeypatch.setattr(train_bench, "DRY_RUN", True)
    monkeypatch.setattr(train_bench, "TORCH_DEVICE", "cpu")
    rows = train_bench.run_gpu(steps=1, batches=[2], seq_len=64, attentions=["xla"])
    assert [row["case"] for row in rows] == ["modernbert-base bf16 (transformers, sdpa)", "modernbert-base bf16, xla",
                                             "modernbert-base bf16, xla, 1 doc/row"]
    assert all(row["tokens_per_sec"] > 0 and "speedup_vs_transformers" in row for row in rows[1:])
    # 4 documents of 16 tokens a row: per document, attention spans 16 keys where the dense count has 64.
    packed, single = rows[1:]
    assert packed["mfu_per_document"] < packed["mfu"] and single["mfu_per_document"] == single["mfu"]
    # auto: no memory statistics on a CPU, so the H100's 24 rows of 8192 (3072 of 64), clamped to the limit
    [found] = train_bench.run_gpu_max_batch("bertjax", 64, "none", start="auto", limit=2, near=True)
    assert found["batch"] == 2
    out = capsys.readouterr().out
    assert "best bertjax: modernbert-base bf16, xla" in out and "% per document (" in out
    assert "like for like, modernbert-base bf16, xla, 1 doc/row: " in out and "(target >= 1.5x on the same rows" in out
    assert "the search starts at 3072 rows: the H100's 24 at 8192 tokens x 8192 / 64: this card's memory" in out
    assert "bertjax batch 2: fits" in out and "largest batch of 64-token rows that trains, bertjax" in out
    assert "bertjax batch 2: compiled step: arguments " in out and "device in use before it" in out


def test_the_summary_judges_mfu_per_document_and_speed_up_like_for_like():
    """MFU >= 45% is judged on the per-document count (packed as dense beside it); the speed-up is given for the
    fastest (packed) row and like for like, one document per row against transformers' one-document rows, which
    >= 1.5x is judged on; the paper's H100 figure is said not to be the target's card on another one."""
    from bench.train_bench import summary_lines

    rows = [{"case": "transformers", "tokens_per_sec": 100.0},
            {"case": "packed", "batch": 32, "documents_per_row": 4, "tokens_per_sec": 400_000.0, "mfu": 0.47,
             "mfu_per_document": 0.44, "speedup_vs_transformers": 2.0},
            {"case": "packed, 1 doc/row", "batch": 32, "documents_per_row": 1, "tokens_per_sec": 280_000.0,
             "mfu": 0.46, "mfu_per_document": 0.46, "speedup_vs_transformers": 1.4}]
    head, against, paper = summary_lines(rows, "NVIDIA H200")
    assert head == ("best bertjax: packed batch 32: 400,000 tokens/s, MFU 44.0% per document (47.0% packed as "
                    "dense) (target >= 45% per document: NOT met)")
    assert against == ("  against transformers' one-document rows: 2.00x (this row, packed); like for like, packed, "
                       "1 doc/row: 1.40x (target >= 1.5x on the same rows: NOT met)")
    assert paper == ("  1.28x the paper's 312,000 tokens/s on one H100, measured on a NVIDIA H200, not an H100: not "
                     "that target's card")
    assert summary_lines(rows, "NVIDIA H100 80GB HBM3")[2] == "  1.28x the paper's 312,000 tokens/s on one H100"
    assert summary_lines(rows[1:2], "NVIDIA H100 80GB HBM3")[1].endswith(
        "; like for like (one document per row): not measured")


def test_per_document_flops_count_each_document_at_its_own_length():
    """Rows of documents of unequal length (synthetic_batch's last document takes the remainder): the objective's
    count is asked once per length, with that length's tokens and its share of the predictions and rows."""
    import numpy as np

    import bench.train_bench as train_bench

    class Objective:
        def __init__(self):
            self.calls = []

        def train_flops(self, *, seq_len, tokens, predictions, rows):
            self.calls.append((seq_len, tokens, predictions, rows))
            return float(seq_len * tokens)

    case = train_bench.Case("x", train_bench.gpu_config(64), batch=2, seq_len=10, documents_per_row=4)
    segments = train_bench.synthetic_batch(case)["segment_ids"]
    assert segments[0].tolist() == [1, 1, 1, 2, 2, 2, 3, 3, 3, 4]
    objective = Objective()
    total = train_bench.per_document_flops(objective, case, segments, predictions=6.0)
    np.testing.assert_allclose(objective.calls, [(1, 2, 6.0 * 2 / 20, 2 * 2 / 20), (3, 18, 6.0 * 18 / 20, 2 * 18 / 20)])
    assert total == 1 * 2 + 3 * 18
    one = train_bench.per_document_flops(objective, case, np.ones((2, 10), np.int32), predictions=6.0)
    assert one == 10 * 20  # one document a row: the row's own count


def test_the_gpu_comparison_without_transformers_times_packed_rows_first(monkeypatch, capsys):
    """`--no-transformers` (the new kernels' A/B on a lease): every combination's packed rows come before any
    one-document row, the first and last combination first, so a capped stage still compares them; the summary
    names the best without a ratio. The cases are recorded, not run (test_gpu_paths_run_on_cpu_in_a_dry_run runs
    them: eight more compiles would add nothing here)."""
    import bench.train_bench as train_bench

    monkeypatch.setattr(train_bench, "DRY_RUN", True)
    monkeypatch.setattr(train_bench, "measure_bertjax", lambda case, steps, peak: {
        "case": case.name, "batch": case.batch, "tokens_per_sec": 1000.0 + len(case.name), "mfu": 0.1})
    rows = train_bench.run_gpu(steps=1, batches=[2], seq_len=64, attentions=["xla", "xla_blockwise"],
                               with_transformers=False, fused_qkv=(True, False))
    # The first and the last combination, then the others; then the same on one document per row.
    packed = ["modernbert-base bf16, xla, stacked qkv", "modernbert-base bf16, xla_blockwise",
              "modernbert-base bf16, xla", "modernbert-base bf16, xla_blockwise, stacked qkv"]
    assert [row["case"] for row in rows] == packed + [f"{name}, 1 doc/row" for name in packed]
    assert not any("speedup_vs_transformers" in row for row in rows)
    out = capsys.readouterr().out
    assert "best bertjax: " in out and "transformers" not in out.split("best bertjax: ")[1]


def test_with_three_kernel_choices_each_new_kernel_alone_comes_third(monkeypatch):
    """--fused-qkv on off --norm pallas_gpu xla --glu pallas_gpu xla: everything new, everything as it was, then
    each new kernel alone, then the pairs (cases recorded, not run)."""
    import bench.train_bench as train_bench

    names = []
    monkeypatch.setattr(train_bench, "DRY_RUN", True)
    monkeypatch.setattr(train_bench, "measure_bertjax", lambda case, steps, peak: names.append(case.name))
    train_bench.run_gpu(steps=1, batches=[2], seq_len=64, attentions=["auto"], with_transformers=False,
                        fused_qkv=(True, False), norms=("pallas_gpu", "xla"), glus=("pallas_gpu", "xla"))
    base = "modernbert-base bf16, auto"
    assert names[:5] == [f"{base}, stacked qkv, pallas_gpu norm, pallas_gpu GLU", base, f"{base}, stacked qkv",
                         f"{base}, pallas_gpu norm", f"{base}, pallas_gpu GLU"]
    assert len(names) == 16 and names[8:] == [f"{name}, 1 doc/row" for name in names[:8]]


def test_a_case_that_fails_costs_its_row_not_the_stage(monkeypatch, capsys):
    """A kernel that fails to compile or run on the card (the norm kernel's first lease) is reported in one line and
    the comparison goes on with the next case."""
    import bench.train_bench as train_bench

    measure = train_bench.bench_bertjax

    def failing_first(case, steps, peak):
        if case.name == "modernbert-base bf16, xla":
            raise RuntimeError("Triton compilation failed\nmore lines")
        return measure(case, steps, peak)

    monkeypatch.setattr(train_bench, "DRY_RUN", True)
    monkeypatch.setattr(train_bench, "bench_bertjax", failing_first)
    rows = train_bench.run_gpu(steps=1, batches=[2], seq_len=64, attentions=["xla", "xla_blockwise"],
                               with_transformers=False)
    assert [row["case"] for row in rows][0] == "modernbert-base bf16, xla_blockwise" and len(rows) == 3
    assert "modernbert-base bf16, xla, batch 2 x 64: failed: RuntimeError: Triton compilation failed" in (
        capsys.readouterr().out)


def test_every_timed_attention_row_is_checked_against_a_reference(monkeypatch):
    """measure: the first reference implementation timed on a row keeps its outputs (no extra compile), the others
    report their max abs error against them; a row with no reference timed computes one (here: XLA's); a wrong
    kernel shows as a large error, not only as a time."""
    import bench.attention_bench as attention_bench
    import jax.numpy as jnp

    shapes, common = (1, 64, 2, 16), dict(repeats=1, min_seconds=0.0, max_bytes=2**30)
    references = {}
    reference = attention_bench.measure("xla", None, "forward+backward", shapes, jnp.float32, **common,
                                        references=references)
    assert reference["checked_against"] == "is the reference" and "max_abs_error" not in reference
    blockwise = attention_bench.measure("xla_blockwise", None, "forward+backward", shapes, jnp.float32, **common,
                                        references=references)
    assert blockwise["checked_against"] == "xla" and blockwise["max_abs_error"] < 1e-5
    wrong = attention_bench.measure("broken", 16, "forward", shapes, jnp.float32, **common, references={},
                                    fn=lambda q, k, v, segment_ids: v)  # no attention at all
    assert wrong["checked_against"] == "xla" and wrong["max_abs_error"] > 0.1
    assert "max_abs_error" not in attention_bench.measure("xla", None, "forward", shapes, jnp.float32, **common)


def test_a_rows_device_peak_is_its_own_only_where_it_raised_the_running_max():
    from bench.attention_bench import row

    ok_row = {"status": "ok", "seconds": 1e-3, "temp": 2**30, "max_abs_error": 3e-3, "checked_against": "cudnn"}
    raised = row(512, None, "forward", "pallas_gpu", {**ok_row, "device_peak": 2**31, "peak_raised": True}, None)
    held = row(512, None, "forward", "pallas_gpu", {**ok_row, "device_peak": 2**31, "peak_raised": False}, None)
    assert "(device peak 2.000)" in raised and "3.00e-03 (cudnn)" in raised
    assert "(device peak <= 2.000, running max)" in held


def test_gpu_env_reads_the_cuda_libraries_it_can():
    """On a machine without CUDA the versions lines say so rather than fail (the device's are read the same way)."""
    from bench import gpu_env

    lines = gpu_env.cuda_package_lines()
    assert [line.split(" package: ")[0] for line in lines] == list(gpu_env.CUDA_PACKAGES)
    assert gpu_env.jax_cuda_lines()  # versions on a CUDA jaxlib, else why there are none


def test_the_mosaic_gpu_mark_is_reported_beside_the_targets():
    results = {(16384, None, 1, "forward+backward", "pallas_gpu"): ok(10.0),
               (16384, None, 1, "forward+backward", "cudnn"): ok(7.0),
               (16384, None, 1, "forward+backward", "mosaic_gpu_f16"): ok(5.0)}
    assert gpu_targets(results, window=128, packed_docs=16) == [
        "# seq 16384 forward+backward: pallas_gpu global vs cuDNN's speed: 0.70x (target >= 0.7x): met",
        "# seq 16384 forward+backward: mosaic_gpu_f16 (JAX's Hopper kernel, no masks) runs 2.00x pallas_gpu's "
        "speed, 1.40x cuDNN's"]


def test_the_mosaic_gpu_mark_declines_layers_it_cannot_express():
    """JAX's Hopper kernel has no window and no segments: such rows are n/a, not timed without their masks."""
    from bench.attention_bench import MOSAIC_GPU, attention_fn

    assert attention_fn(MOSAIC_GPU, 128, 0.125) is None
    assert attention_fn(MOSAIC_GPU, None, 0.125, packed=True) is None
    assert callable(attention_fn(MOSAIC_GPU, None, 0.125))


def test_only_the_bertjax_memory_search_preallocates(monkeypatch):
    """JAX alone on the card preallocates one region (a search grown on demand failed for want of one contiguous
    block on the second lease); wherever torch shares the card, JAX allocates as it goes."""
    import bench.train_bench as train_bench

    for argv, framework in ((["--gpu-max-batch", "bertjax", "--near"], "bertjax"),
                            (["--gpu-max-batch=transformers"], "transformers"), (["--gpu"], None)):
        monkeypatch.setattr("sys.argv", ["train_bench", *argv])
        assert train_bench._max_batch_framework() == framework



def test_transformers_weights_come_from_an_xla_attention_model(monkeypatch):
    """On a GPU the default backend makes `auto` attention the Pallas GPU kernels, which do not run on the CPU
    device where `--gpu-max-batch transformers` initialises the weights (the first H100 lease failed so): the
    weights handed to transformers come from an XLA-attention model, with the same tree as the kernel's model (the
    transformers search around it is not run here: 10 s of the suite for code the --gpu comparison already runs)."""
    import bench.train_bench as train_bench

    monkeypatch.setattr(train_bench, "DRY_RUN", True)
    monkeypatch.setattr(train_bench, "TORCH_DEVICE", "cpu")
    model, params = train_bench.initial_weights(64)
    assert model.config.attention_implementation == "xla"
    kernel_model = train_bench.MODEL_CLASSES["masked_lm"](train_bench.gpu_config(64, "pallas_gpu").replace(
        dtype="float32"))
    expected = jax.eval_shape(lambda: train_bench.init_params(kernel_model, jax.random.key(0)))  # traced, not run
    chex.assert_trees_all_equal_shapes_and_dtypes(params, expected)


def test_tune_sweeps_each_kernel_then_the_fastest_backward(monkeypatch, capsys):
    """--tune off a GPU (interpret mode, tiny shapes): every combination is run for the forward, the dq kernel
    (`backward_*`, dk/dv pinned to the defaults) and the dk/dv kernel (`dkv_*`), layers in the order
    asked, rows packed as asked; the fastest of each group is printed as pallas_gpu_attention's keyword arguments,
    then the backward with the fastest of both."""
    import bench.attention_bench as attention_bench

    monkeypatch.setattr(attention_bench, "TUNING", {
        "forward": {"block_q": (16,), "block_k": (16, 32), "num_warps": (4,), "num_stages": (2,)},
        "dq": {"backward_block_q": (32,), "backward_block_k": (16,), "backward_num_warps": (4,),
               "backward_num_stages": (3,)},
        "dkv": {"dkv_block_k": (16,), "dkv_block_q": (64,), "dkv_num_warps": (4,), "dkv_num_stages": (3,)}})
    calls = []
    real = attention_bench.measure
    monkeypatch.setattr(attention_bench, "measure", lambda *a, fn, **kw: calls.append(fn) or real(*a, fn=fn, **kw))
    args = attention_bench.parse_args(["--tune", "--seqs", "64", "--window", "32", "--heads", "2", "--head-dim", "16",
                                       "--batch", "2", "--repeats", "1", "--min-seconds", "0", "--max-gib", "1",
                                       "--tune-layers", "local", "global", "--tune-docs", "2"])
    assert args.tune_passes == ["forward", "dq", "dkv"]
    attention_bench.tune(args, attention_bench.jnp.float32)
    out = capsys.readouterr().out
    assert "# batch 2, 2 document(s) per row, heads 2, head_dim 16" in out
    rows = [line for line in out.splitlines() if line.startswith("| 64 |")]
    assert len(rows) == 2 * 4  # layers x (2 forward, 1 dq, 1 dk/dv combinations)
    assert [row.split("|")[2].strip() for row in rows[::4]] == ["local 32", "global"]
    # Table columns are the kernel's own (block_q, block_k, warps, stages).
    cells = lambda row: [cell.strip() for cell in row.split("|")[3:8]]
    assert [cells(row) for row in rows[:4]] == [
        ["forward", "16", "16", "4", "2"], ["forward", "16", "32", "4", "2"], ["dq", "32", "16", "4", "3"],
        ["dkv", "64", "16", "4", "3"]]
    # all timed (a backward is fwd+bwd less the default forward: on a loaded CPU in interpret mode, maybe < 0)
    assert all(isinstance(float(line.split("|")[-2]), float) for line in rows), rows
    for layer in ("global", "local 32"):
        for kernel in ("forward", "dq", "dkv"):
            assert f"# fastest {kernel} at seq 64, {layer}: " in out
        assert f"# backward with the fastest dq and dk/dv at seq 64, {layer}: " in out
    assert "'backward_block_q': " in out and "'dkv_block_k': " in out and "{'block_q': 16" in out
    assert len(calls) == 2 * (1 + 4 + 1)  # per layer: default forward, the sweeps, the fastest backward


def fake_gpu_tune(monkeypatch, seconds) -> list:
    """A fake GPU for `--tune`: pallas_gpu_attention returns its tile and kernel arguments, cuDNN takes 7 s and every
    other timing seconds(passes, options, tiles); returns the list each timing's (passes, options) is appended to."""
    import bench.attention_bench as attention_bench
    import bertjax.ops.pallas_gpu_attention as kernels

    monkeypatch.setattr(attention_bench.jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(kernels, "pallas_gpu_attention", lambda *a, **kw: {  # its tiles and kernel choices
        name: value for name, value in kw.items() if name in kernels.TILE_ARGUMENTS or name.endswith("_kernel")})
    seen = []

    def fake_measure(name, window, passes, *rest, fn=None, **kw):
        if name == "cudnn":
            return {"status": "ok", "seconds": 7.0}
        options = fn(None, None, None, None)
        seen.append((passes, options))
        tiles = kernels._resolve_tiles("fake", {k: v for k, v in options.items() if k in kernels.TILE_ARGUMENTS})
        return {"status": "ok", "seconds": seconds(passes, options, tiles)}

    monkeypatch.setattr(attention_bench, "measure", fake_measure)
    return seen


def test_tune_summary_against_cudnn_on_a_gpu(monkeypatch, capsys):
    """The sweep's arithmetic, with a fake GPU whose kernel times are functions of the tiles: a backward kernel's
    row is forward + backward less the default forward, dq is swept with dk/dv pinned to the defaults (and without
    more warpgroups than its held rows fill), and the
    summary times the fastest of each against the defaults and cuDNN; the defaults are swept first whatever
    TUNING's order (fake times, so exact)."""
    import bench.attention_bench as attention_bench

    monkeypatch.setattr(attention_bench, "TUNING", {
        "forward": {"block_q": (64, 128), "block_k": (64,), "num_warps": (4,), "num_stages": (3,)},
        "dq": {"backward_block_q": (64, 128), "backward_block_k": (64,), "backward_num_warps": (4, 8),
               "backward_num_stages": (3,)},
        "dkv": {"dkv_block_k": (128, 64), "dkv_block_q": (64,), "dkv_num_warps": (4,), "dkv_num_stages": (3,)}})

    def seconds(passes, options, tiles):
        forward = 2.0 if tiles["block_q"] == 128 else 3.0
        dq = 2.0 if tiles["backward_block_q"] == 128 else 3.0
        dkv = 3.0 if tiles["dkv_block_k"] == 128 else 4.0
        return forward + (dq + dkv if passes == "forward+backward" else 0.0)

    seen = fake_gpu_tune(monkeypatch, seconds)
    args = attention_bench.parse_args(["--tune", "--seqs", "16384", "--tune-layers", "global",
                                       "--tune-passes", "dq", "dkv", "forward"])
    attention_bench.tune(args, attention_bench.jnp.bfloat16)
    out = capsys.readouterr().out
    # dq's rows pin dk/dv to the defaults (64 x 64, 4 warps, 3 stages at head_dim 64): 3 + 3 + 4 - 3 = 7 ms.
    assert seen[1] == ("forward+backward", dict(backward_block_q=64, backward_block_k=64, backward_num_warps=4,
                                                backward_num_stages=3, dkv_block_q=64, dkv_block_k=64,
                                                dkv_num_warps=4, dkv_num_stages=3))
    assert "| 16384 | global | dq | 64 | 64 | 4 | 3 | 7000.000 |" in out
    assert "| 16384 | global | dq | 128 | 64 | 4 | 3 | 6000.000 |" in out
    # 8 warps on 64 held rows (two warpgroups, rows for one) are left out; on 128 they are swept.
    assert "| dq | 64 | 64 | 8 |" not in out and "| 16384 | global | dq | 128 | 64 | 8 | 3 | 6000.000 |" in out
    # The defaults first whatever TUNING's order: dk/dv's 64 x 64 row before its 128-key one.
    assert out.index("| 16384 | global | dkv | 64 | 64 | 4 | 3 | 7000.000 |") < out.index(
        "| 16384 | global | dkv | 64 | 128 | 4 | 3 | 6000.000 |")
    assert ("# backward with the fastest dq and dk/dv at seq 16384, global: 5000.000 ms (the defaults' 7000.000 ms)"
            in out)
    # Before the forward sweep: default forward 3 + 5 = 8 ms against cuDNN's 7; after it, 2 + 5.
    assert "8000.000 ms, cuDNN's 7000.000 ms: 0.88x cuDNN's speed (target >= 0.7x)" in out
    assert "7000.000 ms, cuDNN's 7000.000 ms: 1.00x cuDNN's speed (target >= 0.7x)" in out
    assert out.count("# backward with the fastest") == 1


def test_tune_sweeps_the_mosaic_kernels_own_parameters(monkeypatch, capsys):
    """--tune-kernels mosaic: every call selects the Mosaic GPU kernels, each kernel's rows sweep its own parameters
    (MOSAIC_TUNING: the forward's held rows too), defaults first, and no num_warps reaches the kernels (one
    warpgroup per 64 rows whatever the head_dim; a pinned dk/dv at head_dim 128 would otherwise ask for 8 warps)."""
    import bench.attention_bench as attention_bench

    calls = fake_gpu_tune(monkeypatch, lambda passes, options, tiles: (
        1.0 + tiles["block_k"] / 64 + (tiles["dkv_num_stages"] or 3) / 10
        + (tiles["backward_block_k"] / 64 if passes == "forward+backward" else 0.0)))
    args = attention_bench.parse_args(["--tune", "--tune-kernels", "mosaic", "--seqs", "4096", "--head-dim", "128",
                                       "--tune-layers", "global", "--tune-passes", "forward", "dq", "dkv"])
    attention_bench.tune(args, attention_bench.jnp.bfloat16)
    out = capsys.readouterr().out
    seen = [options for _, options in calls]
    assert seen and "mosaic kernels" in out
    assert all(o["forward_kernel"] == o["backward_kernel"] == "mosaic" for o in seen)
    assert not any(value for o in seen for name, value in o.items() if name.endswith("num_warps"))
    rows = [line for line in out.splitlines() if line.startswith("| 4096 |")]
    assert [row.split("|")[3].strip() for row in rows] == ["forward"] * 12 + ["dq"] * 6 + ["dkv"] * 6
    assert "| 4096 | global | forward | 64 | 64 |  | 2 |" in rows[0]  # the defaults first (head_dim 128: 2 stages)
    # The backward kernels keep 64 held rows when the forward's block_q is 128 (two warpgroups).
    assert all(o["backward_block_q"] == o["dkv_block_k"] == 64 for o in seen)
    assert "# fastest forward at seq 4096, global: " in out and "'block_k': 64" in out


def test_tune_sweeps_the_one_pass_backward_and_compares_it_with_cudnn(monkeypatch, capsys):
    """--tune-passes atomic: every row selects the one-pass backward (backward_kernel="triton_atomic") on dk/dv's
    tiles, nothing pinned; its row is forward + backward less the default forward; its fastest, with the fastest
    forward when that sweep came first, is timed against cuDNN (fake GPU, fake times)."""
    import bench.attention_bench as attention_bench

    monkeypatch.setattr(attention_bench, "TUNING", {
        **attention_bench.TUNING,
        "forward": {"block_q": (64, 128), "block_k": (64,), "num_warps": (4,), "num_stages": (3,)},
        "atomic": {"dkv_block_k": (64, 128), "dkv_block_q": (64,), "dkv_num_warps": (4,), "dkv_num_stages": (3,)}})

    def seconds(passes, options, tiles):
        forward = 2.0 if tiles["block_q"] == 128 else 3.0
        backward = (3.0 if tiles["dkv_block_k"] == 128 else 4.0) if options.get("backward_kernel") else 7.0
        return forward + (backward if passes == "forward+backward" else 0.0)

    seen = fake_gpu_tune(monkeypatch, seconds)
    args = attention_bench.parse_args(["--tune", "--seqs", "16384", "--tune-layers", "global",
                                       "--tune-passes", "forward", "atomic"])
    attention_bench.tune(args, attention_bench.jnp.bfloat16)
    out = capsys.readouterr().out
    atomic = [options for passes, options in seen if options.get("backward_kernel")]
    assert atomic and all(o["backward_kernel"] == "triton_atomic" and not any(
        k.startswith("backward_") and k != "backward_kernel" for k in o) for o in atomic)
    assert "| 16384 | global | atomic | 64 | 64 | 4 | 3 | 4000.000 |" in out  # 3 + 4 - 3
    assert "| 16384 | global | atomic | 64 | 128 | 4 | 3 | 3000.000 |" in out
    assert "# fastest atomic at seq 16384, global: 3000.000 ms" in out
    # the fastest forward (2 ms) with the fastest one-pass backward (3 ms) against cuDNN's 7 ms
    assert "5000.000 ms, cuDNN's 7000.000 ms: 1.40x cuDNN's speed (target >= 0.7x)" in out
    with pytest.raises(SystemExit):
        attention_bench.parse_args(["--tune", "--tune-kernels", "mosaic", "--tune-passes", "atomic"])
