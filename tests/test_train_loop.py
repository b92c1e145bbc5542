"""The loop end to end in-process: BERT-style MLM + NSP over two phases (32- then 64-token rows), held-out
evaluation, the workdir's files, and fill-mask on the result."""

import json

import numpy as np
import pytest

from bertjax.inference.fill_mask import load_predictor
from bertjax.train.loop import pretrain
from bertjax.train.metrics import read_metrics
from bertjax.train.run_config import run_config_from_dict
from train_helpers import small_tokenizer


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("loop")
    tokenizer = small_tokenizer()
    config = run_config_from_dict({
        "model": {"preset": "bert-tiny"},
        "objective": {"name": "mlm_nsp"},
        "tokenizer": {"path": str(tokenizer)},
        "data": {"seq_len": 32, "global_batch_size": 8, "packing": "pad", "sentence_objective": "nsp",
                 "window_documents": 64},
        "optimizer": {"name": "lamb", "learning_rate": 1.0e-2, "b2": 0.999, "clip_global_norm": 1.0},
        "schedule": {"name": "linear", "warmup": 1},
        "train": {"steps": 6, "log_every": 2, "progress_bar": False,
                  "phases": [{"fraction": 0.5, "data": {"seq_len": 32}},
                             {"fraction": 0.5, "data": {"seq_len": 64, "max_predictions": 10}}]},
        "eval": {"every": 3, "batches": 2},
        "checkpoint": {"every": 3},
    })
    return pretrain(config, root / "run")


def test_metrics_cover_mlm_nsp_and_held_out_loss(finished_run):
    records = read_metrics(finished_run.workdir)
    by_step = {}
    for record in records:  # a step can have several records: a phase boundary, then that step's log line
        by_step.setdefault(record["step"], {}).update(record)
    assert sorted(by_step) == [0, 2, 3, 4, 6]  # eval at start and every 3 steps, logs every 2, the last step
    for name in ("loss", "mlm_loss", "nsp_loss", "nsp_accuracy", "mlm_accuracy", "learning_rate", "grad_norm",
                 "eval_loss", "eval_nsp_loss"):
        assert name in by_step[6], name
    assert "tokens_per_sec" in by_step[4] and 0.0 < by_step[4]["mfu"] < 1.0
    np.testing.assert_allclose(by_step[6]["loss"], by_step[6]["mlm_loss"] + by_step[6]["nsp_loss"], rtol=1e-6)
    assert finished_run.eval_loss_start == by_step[0]["eval_loss"]
    assert finished_run.eval_loss_end == by_step[6]["eval_loss"]
    assert not finished_run.preempted and finished_run.final_step == 6


def test_workdir_holds_everything_and_fill_mask_reads_it(finished_run, monkeypatch):
    workdir = finished_run.workdir
    for name in ("config.yaml", "model_config.json", "metrics.jsonl", "loss.png", "tokenizer"):
        assert (workdir / name).exists(), name
    assert any((workdir / "tensorboard").iterdir())
    assert sorted(p.name for p in (workdir / "checkpoints").iterdir() if p.name.isdigit()) == ["3", "6"]
    described = json.loads((workdir / "model_config.json").read_text())
    assert described["head"] == "pretraining" and described["config"]["vocab_size"] == 512
    monkeypatch.chdir(workdir.parent)  # `bertjax fill-mask --model run`: a relative path
    predictions = load_predictor(workdir.name)("The [MASK] statement ends the [MASK] loop.", 4)
    assert [len(p) for p in predictions] == [4, 4]
    assert all(p[0].probability >= p[-1].probability for p in predictions)


def test_metrics_read_while_a_run_appends_skip_only_the_unfinished_last_line(tmp_path):
    # A reader polling metrics.jsonl can catch a write halfway (across a page boundary): that half line is not a
    # record yet. A finished line that is not a JSON object is damage, named with its line number.
    lines = [json.dumps({"step": step, "loss": 5.0 - step}) for step in (1, 2)]
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n" + lines[1][:20])
    assert read_metrics(tmp_path) == [{"step": 1, "loss": 4.0}, {"step": 2, "loss": 3.0}]
    (tmp_path / "metrics.jsonl").write_text(lines[0] + "\n" + lines[1][:20] + "\n" + lines[1] + "\n")
    with pytest.raises(ValueError, match=r"metrics.jsonl, line 2: not valid JSON"):
        read_metrics(tmp_path)
    (tmp_path / "metrics.jsonl").write_text(lines[0] + "\n[1, 2]\n")
    with pytest.raises(ValueError, match=r"metrics.jsonl, line 2: each line must be a JSON object, got list"):
        read_metrics(tmp_path)


def test_train_steps_at_or_below_the_checkpoint_says_nothing_trains_and_keeps_config_yaml(finished_run, tmp_path,
                                                                                          caplog):
    import shutil

    from bertjax.train.run_config import load_run_config

    workdir = tmp_path / "run"
    shutil.copytree(finished_run.workdir, workdir)
    recorded = (workdir / "config.yaml").read_bytes()
    for steps in (4, 6):  # below the checkpoint, and the finished run's own length
        result = pretrain(load_run_config(workdir / "config.yaml", [f"train.steps={steps}"]), workdir)
        assert result.start_step == result.final_step == 6
        assert f"is already at step 6 >= train.steps ({steps}): nothing to train" in caplog.text
        # the record of the run that saved step 6, so a later rerun still compares against its settings
        assert (workdir / "config.yaml").read_bytes() == recorded
        caplog.clear()


def test_summary_names_the_step_of_an_evaluation_that_was_not_at_the_end(finished_run):
    import dataclasses

    from bertjax.commands.pretrain import summary

    assert finished_run.eval_loss_end_step == 6
    assert f"held-out MLM loss at the end:   {finished_run.eval_loss_end:.4f}" in summary(finished_run)
    # stopped by SIGTERM at step 4, its latest evaluation the one at step 3
    stopped = dataclasses.replace(finished_run, final_step=4, preempted=True, eval_loss_end_step=3)
    lines = summary(stopped)
    assert "(stopped by SIGTERM or Ctrl-C; rerun to resume)" in lines[0]
    assert f"latest held-out MLM loss (step 3): {finished_run.eval_loss_end:.4f}" in lines
    assert not any("at the end" in line for line in lines)
    # Another objective's held-out loss is its total, named so (ELECTRA's 42 read as an MLM loss).
    assert f"held-out electra loss (its total; parts in metrics.jsonl) at the end:   " \
        f"{finished_run.eval_loss_end:.4f}" in summary(finished_run, "electra")


class _Messages:
    def __init__(self):
        self.lines = []

    def message(self, text):
        self.lines.append(text)


@pytest.mark.parametrize("platform, kind, peak", [
    ("gpu", "NVIDIA H100 PCIe", 756e12),
    # No datasheet peak here: a short timed matmul on such a card would measure its launch overhead, so no MFU.
    ("gpu", "NVIDIA RTX PRO 6000 Blackwell", None),
])
def test_mfu_is_against_the_datasheet_peak_or_not_reported(monkeypatch, platform, kind, peak):
    from bertjax.config import get_config
    from bertjax.train import loop
    from bertjax.train.objectives import build_objective, objective_class

    device = type("Device", (), {"platform": platform, "device_kind": kind})()
    monkeypatch.setattr(loop.jax, "devices", lambda *a: [device])
    config = run_config_from_dict({"model": {"preset": "bert-tiny"}, "data": {"seq_len": 16, "global_batch_size": 2},
                                   "train": {"steps": 1}})
    messages = _Messages()
    assert loop._peak_flops(config, "float32", messages) == peak
    assert kind in messages.lines[0] and ("not reported" in messages.lines[0]) == (peak is None)
    monkeypatch.undo()
    objective = build_objective(objective_class("mlm").options_class(name="mlm"), get_config("bert-tiny"))
    throughput = loop._Throughput(objective, peak)
    throughput.restart()
    throughput.add(16, {"tokens": 32.0, "predictions": 4.0, "rows": 2.0})
    report = throughput.report()
    assert report["tokens_per_sec"] > 0 and ("mfu" in report) == (peak is not None)


def test_the_command_shows_fill_mask_examples_after_mlm_and_permutation_lm(finished_run, monkeypatch, tmp_path):
    """After XLNet's permutation LM too: its fill-mask predicts through the query stream it trained."""
    import argparse

    import bertjax.train.loop
    from bertjax.commands import pretrain as command

    shown = []
    monkeypatch.setattr(bertjax.train.loop, "pretrain", lambda config, workdir, config_path=None: finished_run)
    monkeypatch.setattr(command, "show_fill_mask", lambda config, result: shown.append(config.objective.name))
    for name, preset in (("mlm", "bert-tiny"), ("permutation_lm", "xlnet-tiny")):
        config = tmp_path / f"{name}.yaml"
        config.write_text(f"model: {{preset: {preset}}}\nobjective: {{name: {name}}}\ntrain: {{steps: 2}}\n")
        args = argparse.Namespace(config=str(config), overrides=[], workdir=str(tmp_path / name), coordinator=None,
                                  num_processes=None, process_id=None)
        assert command.run(args) == 0
    assert shown == ["mlm", "permutation_lm"]
