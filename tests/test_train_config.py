"""The YAML run config: every shipped config loads; bad keys and values are errors that name the dotted key."""

import pathlib

import pytest
import yaml

from bertjax.cli import main
from bertjax.train.run_config import ConfigError, load_run_config, run_config_from_dict

CONFIGS = sorted((pathlib.Path(__file__).resolve().parents[1] / "configs" / "pretrain").glob("*.yaml"))
VALID = {"model": {"preset": "modernbert-tiny"}, "train": {"steps": 10}, "data": {"seq_len": 32}}


def _with(section: str, **values) -> dict:
    raw = yaml.safe_load(yaml.safe_dump(VALID))
    raw.setdefault(section, {}).update(values)
    return raw


# Configs that need a path the user gives: the distillation teacher.
NEEDS = {"distilbert": "objective.teacher=path/to/bert-base-uncased"}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_shipped_configs_load(path):
    overrides = [NEEDS[path.stem]] if path.stem in NEEDS else []
    config = load_run_config(path, overrides)
    assert config.data.seq_len > 0
    if config.train.steps is None:  # a token-budget recipe: the steps follow from each phase's tokens and batch
        assert config.train.phases and all(phase.tokens > 0 for phase in config.train.phases)
    else:
        assert config.train.steps > 0


def test_distillation_config_without_its_teacher_names_the_key():
    with pytest.raises(ConfigError, match="missing required key objective.teacher"):
        load_run_config(CONFIGS[0].parent / "distilbert.yaml")


def test_shipped_presets_are_there():
    assert {p.stem for p in CONFIGS} >= {"tiny", "bert-base", "roberta-base", "modernbert-base", "albert-base",
                                         "electra-small", "electra-base", "distilbert", "eurobert-210m",
                                         "tiny-albert", "tiny-electra", "tiny-distilbert", "tiny-eurobert"}


@pytest.mark.parametrize("raw, message", [
    (_with("optimizer", betas=0.9), "unknown key optimizer.betas"),
    (_with("train", stepz=3), "unknown key train.stepz"),
    ({**VALID, "trainer": {}}, "unknown key trainer"),
    (_with("data", seq_lenn=64), "unknown key data.seq_lenn"),
    (_with("train", phases=[{"fraction": 1.0, "data": {"seq": 64}}]), r"unknown key train.phases\[0\].data.seq"),
    (_with("optimizer", b1="high"), "optimizer.b1 must be a number"),
    (_with("train", steps=1.5), "train.steps must be an integer"),
    (_with("eval", at_start="yes"), "eval.at_start must be true or false"),
    (_with("data", seq_len="long"), "data.seq_len must be an integer"),
    (_with("data", packing="zip"), "data.packing must be one of"),
    (_with("schedule", decay_shape="cubic"), "schedule.decay_shape must be one of"),
    (_with("model", overrides={"hiden_size": 8}), r"unknown key model.overrides.hiden_size \(did you mean hidden_size"),
    (_with("data", mask_token_fraction=0.95), r"data.mask_token_fraction \(0.95\) and data.random_token_fraction"),
    (_with("model", remat_policy="most"), "model.remat_policy must be one of"),
    (_with("mesh", data=0), "mesh.data must be positive or -1"),
    (_with("train", phases=[{"fraction": 0.5}]), "train.phases: fractions must sum to 1"),
    ({"train": {"steps": 3}}, "missing required key model"),
])
def test_errors_name_the_key(raw, message):
    with pytest.raises(ConfigError, match=message):
        run_config_from_dict(raw)


def test_overrides_and_numbers_written_without_a_dot(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(VALID) + "optimizer: {learning_rate: 1e-3}\n")  # YAML reads 1e-3 as a string
    config = load_run_config(path, ["train.steps=7", "train.log_every=2", "eval.every=3", "checkpoint.every=4",
                                    "data.global_batch_size=16", "model.overrides.hidden_size=64"])
    assert config.optimizer.learning_rate == 1e-3
    assert (config.train.steps, config.train.log_every, config.eval.every, config.checkpoint.every) == (7, 2, 3, 4)
    assert config.data.global_batch_size == 16 and config.model.overrides == {"hidden_size": 64}
    with pytest.raises(ConfigError, match="unknown key train.step"):
        load_run_config(path, ["train.step=7"])
    with pytest.raises(ConfigError, match="key=value"):
        load_run_config(path, ["train.steps"])


def test_cli_reports_config_errors_in_one_line(tmp_path, capsys):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(_with("optimizer", nme="adamw")))
    assert main(["pretrain", "--config", str(path), "--workdir", str(tmp_path / "w")]) == 2
    assert "unknown key optimizer.nme" in capsys.readouterr().err
    assert main(["pretrain", "--config", str(tmp_path / "missing.yaml"), "--workdir", str(tmp_path)]) == 2
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.parametrize("override, message", [
    ("optimizer.clip_global_norm=-1", "optimizer.clip_global_norm must be positive"),  # optax: gradient ascent
    ("optimizer.clip_global_norm=0", "optimizer.clip_global_norm must be positive"),
    ("optimizer.weight_decay=-0.01", "optimizer.weight_decay must be >= 0"),
    ("optimizer.eps=0", "optimizer.eps must be positive"),
])
def test_optimizer_values_that_train_wrongly_are_refused(override, message, tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(VALID))
    with pytest.raises(ConfigError, match=message):
        load_run_config(path, [override])
    assert load_run_config(path, ["optimizer.clip_global_norm=null"]).optimizer.clip_global_norm is None


def test_grad_norm_clipping_of_finetune_and_embedder_must_be_positive():
    from bertjax.embeddings.train_config import load_embedder_config
    from bertjax.finetune.config import load_finetune_config

    for load in (load_embedder_config, load_finetune_config):
        for value in ("-1", "0"):
            with pytest.raises(ConfigError, match="train.max_grad_norm must be positive"):
                load(None, [f"train.max_grad_norm={value}"])
        assert load(None, ["train.max_grad_norm=null"]).train.max_grad_norm is None


def test_string_overrides_are_taken_as_written(tmp_path):
    from bertjax.embeddings.train_config import load_embedder_config

    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(VALID))
    for text in ("2024", "on", "#x", "a.txt #x", "null"):  # a required string field: even `null` is a name
        assert load_run_config(path, [f"data.input={text}"]).data.input == text
    config = load_run_config(path, ["tokenizer.path=~", "objective.name=mlm", "train.steps=3", "data.shuffle=off"])
    assert config.tokenizer.path is None and config.objective.name == "mlm"
    assert config.train.steps == 3 and config.data.shuffle is False  # other types: still read as YAML
    with pytest.raises(ConfigError, match="data.seq_len must be an integer"):
        load_run_config(path, ["data.seq_len=long"])
    # The README's `data.anchor_prompt="query: "` (the shell removes the quotes), and a YAML-quoted value.
    config = load_embedder_config(None, ["data.anchor_prompt=query: ", 'data.positive_prompt=" doc: "'])
    assert (config.data.anchor_prompt, config.data.positive_prompt) == ("query: ", " doc: ")


def test_init_from_refuses_its_source_and_a_non_empty_out(tmp_path, capsys):
    from bertjax.config import get_config
    from bertjax.model_dirs import save_model_dir
    from bertjax.models import EncoderForMaskedLM, abstract_params
    import jax
    import numpy as np

    model = EncoderForMaskedLM(get_config("modernbert-tiny", hidden_size=16, num_layers=1, num_heads=2,
                                          intermediate_size=16, vocab_size=64))
    save_model_dir(tmp_path / "base", model, jax.tree.map(lambda s: np.zeros(s.shape, s.dtype),
                                                          abstract_params(model)))
    before = (tmp_path / "base" / "model_config.json").read_text()
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(VALID))
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("keep me")
    args = ["init-from", "--source", str(tmp_path / "base"), "--config", str(tmp_path / "run.yaml"), "--out"]
    assert main([*args, str(tmp_path / "base")]) == 2
    assert "is the directory being read" in capsys.readouterr().err
    assert main([*args, str(tmp_path / "full")]) == 2
    assert "is not empty" in capsys.readouterr().err
    assert (tmp_path / "base" / "model_config.json").read_text() == before
    assert (tmp_path / "full" / "notes.txt").read_text() == "keep me" and len(list((tmp_path / "full").iterdir())) == 1


def test_prepare_checks_its_arguments_before_training_a_tokenizer(tmp_path, capsys):
    import time

    began = time.perf_counter()
    assert main(["prepare", "--train-tokenizer", "--out", str(tmp_path / "out"), "--documents-per-file", "0"]) == 2
    assert "--documents-per-file must be positive" in capsys.readouterr().err
    assert time.perf_counter() - began < 5 and not (tmp_path / "out").exists()  # no tokenizer was trained


def test_pretrain_help_names_every_objective():
    from bertjax.commands.pretrain import HELP

    assert all(name in HELP for name in ("MLM", "NSP/SOP", "ELECTRA", "distillation", "permutation LM"))


# ---------------------------------------------------------------------------------------------------------------
# Values that used to pass validation and fail late (robustness audit, finding 11), and the workdir's config.yaml,
# kernels and reruns (findings 2, 7 and 12).

def _tree(path: pathlib.Path) -> dict[str, bytes]:
    """Every file under `path` with its bytes (directories as None): to assert that a refusal touched nothing."""
    return {str(p.relative_to(path)): (p.read_bytes() if p.is_file() else None) for p in sorted(path.rglob("*"))}


@pytest.mark.parametrize("raw, message", [
    (_with("train", seed=-1), r"train.seed must be in \[0, 2\*\*32\), got -1"),
    (_with("train", seed=2**32), r"train.seed must be in \[0, 2\*\*32\)"),
    (_with("train", peak_tflops_per_device=0), "train.peak_tflops_per_device must be positive"),
    (_with("train", peak_tflops_per_device=-5), "train.peak_tflops_per_device must be positive"),
    (_with("eval", fill_mask_examples=-3), "eval.fill_mask_examples must be >= 0"),
    (_with("train", phases=[{"fraction": 1.0, "model": {"nosuchfield": 1}}]),
     r"unknown key train.phases\[0\].model.nosuchfield;"),
    (_with("train", phases=[{"fraction": 0.5}, {"fraction": 0.5, "model": {"rope_theta_glbal": 1.0}}]),
     r"unknown key train.phases\[1\].model.rope_theta_glbal \(did you mean rope_theta_global\?\)"),
    (_with("train", phases=[{"fraction": 1.0, "model": {"hidden_size": 7}}]),
     r"train.phases\[0\].model: EncoderConfig.hidden_size \(7\)"),
])
def test_values_that_used_to_fail_late_are_refused_naming_the_key(raw, message):
    with pytest.raises(ConfigError, match=message):
        run_config_from_dict(raw)


def test_seed_peak_and_examples_at_their_limits_are_accepted():
    config = run_config_from_dict(_with("train", seed=2**32 - 1, peak_tflops_per_device=None))
    assert config.train.seed == 2**32 - 1 and config.train.peak_tflops_per_device is None
    assert run_config_from_dict(_with("eval", fill_mask_examples=0)).eval.fill_mask_examples == 0
    assert run_config_from_dict(_with("train", peak_tflops_per_device=0.5)).train.peak_tflops_per_device == 0.5


@pytest.mark.parametrize("phases, message", [
    ([{"fraction": 0.5}, {"fraction": 0.5, "data": {"seq_len": 4096}}], r"train.phases\[1\].data.seq_len \(4096\)"),
    ([{"fraction": 1.0, "data": {"seq_len": 4096}}], r"train.phases\[0\].data.seq_len \(4096\)"),
    ([{"fraction": 0.5, "model": {"rope_theta_global": 5e3}},
      {"fraction": 0.5, "model": {"rope_theta_global": 5e3}, "data": {"seq_len": 128}}],
     r"^train.phases\[1\].data.seq_len \(128\) does not fit"),
])
def test_a_phase_whose_rows_do_not_fit_the_positions_is_named(phases, message):
    from bertjax.train.setup import setup_run

    raw = _with("model", overrides={"max_position_embeddings": 64, "hidden_size": 32, "num_heads": 2,
                                    "num_layers": 1, "intermediate_size": 32})
    raw["train"]["phases"] = phases
    with pytest.raises(ConfigError, match=message):
        setup_run(run_config_from_dict(raw), vocab_size=100, pad_id=0)


def _kernels(**overrides):
    return run_config_from_dict(_with("model", overrides=overrides))


@pytest.mark.parametrize("overrides, platform, message", [
    ({"attention_implementation": "pallas_tpu"}, "cpu",
     r"model.overrides.attention_implementation: 'pallas_tpu' runs only on tpu, but this run's platform is cpu; what "
     r"runs on cpu: \['auto', 'xla', 'xla_auto', 'xla_blockwise'\] \(or set model.overrides.attention_interpret=true"),
    ({"attention_implementation": "pallas_gpu"}, "tpu",
     r"'pallas_gpu' runs only on gpu, .* platform is tpu; .*'pallas_tpu'"),
    ({"attention_implementation": "pallas_gpu_mosaic"}, "cpu",
     "model.overrides.attention_implementation: 'pallas_gpu_mosaic' runs only on gpu"),
    ({"norm_implementation": "pallas_gpu"}, "cpu",
     r"model.overrides.norm_implementation: 'pallas_gpu' runs only on gpu, .*: \['xla'\] \(or set "
     r"model.overrides.norm_interpret=true"),
    ({"mlp": "glu", "glu_implementation": "pallas_gpu"}, "tpu", "model.overrides.glu_implementation: 'pallas_gpu'"),
])
def test_a_kernel_the_platform_cannot_run_is_refused_naming_the_key(overrides, platform, message):
    from bertjax.train.setup import check_kernels_run_on

    with pytest.raises(ConfigError, match=message):
        check_kernels_run_on(_kernels(**overrides), platform)


def test_kernels_that_run_here_or_in_interpret_mode_are_accepted():
    from bertjax.ops.attention import IMPLEMENTATIONS
    from bertjax.train.setup import check_kernels_run_on

    assert IMPLEMENTATIONS["pallas_tpu"].platforms == {"tpu"} and IMPLEMENTATIONS["xla"].platforms is None
    check_kernels_run_on(_kernels(attention_implementation="pallas_tpu"), "tpu")
    check_kernels_run_on(_kernels(attention_implementation="pallas_gpu", norm_implementation="pallas_gpu"), "gpu")
    check_kernels_run_on(_kernels(attention_implementation="pallas_tpu", attention_interpret=True), "cpu")
    check_kernels_run_on(_kernels(norm_implementation="pallas_gpu", norm_interpret=True), "cpu")
    phased = _with("train", phases=[{"fraction": 0.5}, {"fraction": 0.5,
                                                        "model": {"attention_implementation": "pallas_gpu"}}])
    with pytest.raises(ConfigError, match=r"^train.phases\[1\].model.attention_implementation: 'pallas_gpu'"):
        check_kernels_run_on(run_config_from_dict(phased), "cpu")


def test_an_attention_kernel_this_backend_cannot_run_leaves_no_workdir(tmp_path, capsys):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(VALID))
    workdir = tmp_path / "w"
    assert main(["pretrain", "--config", str(path), "--workdir", str(workdir),
                 "model.overrides.attention_implementation=pallas_tpu"]) == 2
    error = capsys.readouterr().err
    assert "model.overrides.attention_implementation: 'pallas_tpu' runs only on tpu" in error
    assert "platform is cpu" in error and not workdir.exists()


def test_the_config_file_in_the_workdir_is_not_overwritten(tmp_path, capsys):
    """`--config exp/config.yaml --workdir exp`: the run would replace the user's file by its resolved config."""
    exp = tmp_path / "exp"
    exp.mkdir()
    written = "# my experiment\n" + yaml.safe_dump(VALID)
    (exp / "config.yaml").write_text(written)
    before = _tree(exp)
    assert main(["pretrain", "--config", str(exp / "config.yaml"), "--workdir", str(exp), "train.steps=2"]) == 2
    assert "is the file bertjax writes its resolved config to" in capsys.readouterr().err
    (tmp_path / "other.yaml").write_text(yaml.safe_dump(VALID))
    assert main(["pretrain", "--config", str(tmp_path / "other.yaml"), "--workdir", str(exp)]) == 2
    assert "config.yaml was not written by bertjax: the workdir holds no bertjax run" in capsys.readouterr().err
    assert _tree(exp) == before  # the file untouched, no lock, no tokenizer


def test_a_workdir_of_another_run_type_is_refused_and_left_as_it_was(tmp_path, capsys):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(VALID))
    for name in ("finetune.json", "train_embedder.json"):
        workdir = tmp_path / name.split(".")[0]
        (workdir / "checkpoints" / "4").mkdir(parents=True)
        (workdir / "config.yaml").write_text("task: {num_labels: null}\n")
        (workdir / name).write_text("{}")
        before = _tree(workdir)
        assert main(["pretrain", "--config", str(path), "--workdir", str(workdir)]) == 2
        assert f"({name}), not one of `bertjax pretrain`" in capsys.readouterr().err
        assert _tree(workdir) == before  # no tokenizer/, no lock file


def test_a_workdir_whose_run_saved_no_checkpoint_pins_nothing(tmp_path, caplog):
    """A run that failed before its first checkpoint (a kernel the backend cannot run) left config.yaml,
    model_config.json and its tokenizer: the corrected rerun starts over, with a note, instead of being refused."""
    import logging

    from bertjax.train.run_config import to_dict
    from bertjax.train.workdir import CONFIG_FILE, check_config_is_ours, check_rerun, has_checkpoint, holds_run

    held = run_config_from_dict(_with("model", overrides={"attention_implementation": "pallas_tpu"}))
    (tmp_path / CONFIG_FILE).write_text(yaml.safe_dump(to_dict(held), sort_keys=False))
    (tmp_path / "model_config.json").write_text("{}")
    (tmp_path / "tokenizer").mkdir()
    (tmp_path / "checkpoints").mkdir()  # made by the run, empty
    fixed = run_config_from_dict(VALID)
    assert not has_checkpoint(tmp_path, fixed.checkpoint) and holds_run(tmp_path, fixed.checkpoint)
    check_config_is_ours(tmp_path, holds_run(tmp_path, fixed.checkpoint))  # bertjax's own record: fine
    with pytest.raises(ConfigError, match="holds a run with another model"):  # as before, with a checkpoint
        check_rerun(tmp_path, fixed, resumable=True)
    with caplog.at_level(logging.WARNING, logger="bertjax.train.workdir"):
        check_rerun(tmp_path, fixed, resumable=False)
    assert "holds no checkpoint of its earlier run: starting over" in caplog.text
    assert "model.overrides.attention_implementation: 'pallas_tpu' in the workdir" in caplog.text
    assert (tmp_path / "tokenizer").is_dir()  # made from the same settings: kept
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="bertjax.train.workdir"):
        check_rerun(tmp_path, run_config_from_dict(_with("tokenizer", vocab_size=4096)), resumable=False)
    assert "its tokenizer is made anew" in caplog.text and not (tmp_path / "tokenizer").exists()
    (tmp_path / "checkpoints" / "8").mkdir()
    assert has_checkpoint(tmp_path, fixed.checkpoint)
    restoring = run_config_from_dict(_with("checkpoint", restore_step=3))
    assert has_checkpoint(tmp_path / "elsewhere", restoring.checkpoint)


def test_rerun_in_a_workdir_without_checkpoints_starts_over_with_the_new_model(tmp_path):
    """End to end: the earlier run's config.yaml and model_config.json (another model, no checkpoint) do not block the
    corrected command, and are replaced by the new run's."""
    import json

    from bertjax.train.run_config import to_dict
    from train_helpers import run_pretrain, small_tokenizer, write_config

    config = write_config(tmp_path / "run.yaml", small_tokenizer())
    workdir = tmp_path / "w"
    (workdir / "checkpoints").mkdir(parents=True)
    earlier = load_run_config(config, ["model.overrides.hidden_size=64"])
    (workdir / "config.yaml").write_text(yaml.safe_dump(to_dict(earlier), sort_keys=False))
    (workdir / "model_config.json").write_text(json.dumps({"head": "masked_lm", "config": {"hidden_size": 64}}))
    result = run_pretrain(config, workdir, "train.steps=12", "checkpoint.every=12")
    assert "holds no checkpoint of its earlier run: starting over" in result.stderr
    assert "model.overrides.hidden_size: 64 in the workdir, 32 requested" in result.stderr
    assert json.loads((workdir / "model_config.json").read_text())["config"]["hidden_size"] == 32
    assert yaml.safe_load((workdir / "config.yaml").read_text())["model"]["overrides"]["hidden_size"] == 32
    assert (workdir / "checkpoints" / "12").is_dir()


def test_an_override_every_phase_replaces_is_an_error_not_a_no_op():
    """modernbert-base's phases each set their batch: a top-level batch override would change nothing."""
    config = str(next(path for path in CONFIGS if path.name == "modernbert-base.yaml"))
    with pytest.raises(ConfigError, match=r"override data.global_batch_size: every phase sets its own "
                                          r"global_batch_size \(train.phases\[i\].data.global_batch_size\)"):
        load_run_config(config, ["data.global_batch_size=256"])
    assert load_run_config(config, ["data.mlm_probability=0.2"]).data.mlm_probability == 0.2  # no phase sets it
    flat = load_run_config(config, ["train.phases=[]", "train.steps=1000", "data.global_batch_size=256"])
    assert flat.data.global_batch_size == 256 and flat.train.phases == ()


def test_a_pretraining_workdir_holding_only_its_tokenizer_reruns(tmp_path):
    """What a pod's other hosts hold (only process 0 writes the record), and what a run stopped during its setup
    leaves: the rerun goes on (and keeps the tokenizer). Another run's log there is the user's and is refused."""
    from bertjax.model_dirs import MODEL_CONFIG_FILE
    from bertjax.train.run_config import CheckpointConfig
    from bertjax.train.workdir import check_workdir_is_for

    workdir = tmp_path / "run"
    (workdir / "tokenizer").mkdir(parents=True)
    (workdir / "tokenizer" / "tokenizer.model").write_bytes(b"pieces")
    check_workdir_is_for(workdir, MODEL_CONFIG_FILE, CheckpointConfig())
    (workdir / "loss.png").write_bytes(b"my plot")
    with pytest.raises(ConfigError, match="holds no bertjax run .* but holds loss.png, which a run writes there"):
        check_workdir_is_for(workdir, MODEL_CONFIG_FILE, CheckpointConfig())


def test_restore_step_is_not_recorded_so_a_rerun_of_the_workdir_resumes_from_the_latest(tmp_path, caplog):
    """checkpoint.restore_step goes back once: the workdir's config.yaml records it as null (rerunning that file, or
    the command after a preemption, would otherwise set aside everything trained since, again), and a rerun naming it
    is no changed setting. An older bertjax recorded it as given: that record is no difference either."""
    import logging

    from bertjax.train.workdir import CONFIG_FILE, check_rerun, record_run

    restoring = run_config_from_dict(_with("checkpoint", restore_step=8))
    record_run(tmp_path, restoring, {})
    recorded = yaml.safe_load((tmp_path / CONFIG_FILE).read_text())
    assert recorded["checkpoint"]["restore_step"] is None
    assert run_config_from_dict(recorded) == run_config_from_dict(VALID)
    with caplog.at_level(logging.WARNING, logger="bertjax.train.workdir"):
        assert check_rerun(tmp_path, restoring) == []
        recorded["checkpoint"]["restore_step"] = 8
        (tmp_path / CONFIG_FILE).write_text(yaml.safe_dump(recorded))
        assert check_rerun(tmp_path, run_config_from_dict(VALID)) == []
    assert "changed settings" not in caplog.text


def test_a_resume_that_changes_how_the_data_is_laid_out_says_the_position_does_not_carry_over(tmp_path, caplog):
    import logging

    from bertjax.train.workdir import check_rerun, record_run

    record_run(tmp_path, run_config_from_dict(VALID), {})
    with caplog.at_level(logging.WARNING, logger="bertjax.train.workdir"):
        check_rerun(tmp_path, run_config_from_dict(_with("optimizer", learning_rate=0.0123)))
    assert "changed settings: optimizer.learning_rate" in caplog.text and "seen again" not in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="bertjax.train.workdir"):
        check_rerun(tmp_path, run_config_from_dict(_with("data", seq_len=64, mlm_probability=0.3)))
    assert "as the old data.seq_len laid them out" in caplog.text and "seen again" in caplog.text, caplog.text


def test_a_key_given_twice_or_a_file_that_is_not_utf8_is_a_clear_error(tmp_path, capsys):
    """PyYAML keeps the last of two equal keys: the first optimizer block was dropped unnoticed."""
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(VALID) + "optimizer: {name: adamw}\ntrain: {steps: 4}\n")
    assert main(["pretrain", "--config", str(path), "--workdir", str(tmp_path / "w")]) == 2
    assert "key 'train' is given twice" in capsys.readouterr().err
    path.write_bytes(b"model: {preset: modernbert-tiny}\n# caf\xe9\n")
    assert main(["pretrain", "--config", str(path), "--workdir", str(tmp_path / "w")]) == 2
    assert f"{path}: not UTF-8 text" in capsys.readouterr().err
    assert not (tmp_path / "w").exists()


def test_deberta_attention_settings_are_overrides_like_the_other_families_options(tmp_path):
    """model.overrides.disentangled.* updates the preset's DeBERTa options, as longformer.* and xlnet.* do (it was a
    type error: the dict was not read as DisentangledAttentionConfig)."""
    from bertjax.config import get_config

    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(_with("model", preset="deberta-v3-tiny")))
    config = load_run_config(path, ["model.overrides.disentangled.implementation=blockwise",
                                    "model.overrides.disentangled.block_size=64"])
    disentangled = get_config(config.model.preset, **config.model.overrides).disentangled
    assert (disentangled.implementation, disentangled.block_size) == ("blockwise", 64)
    assert disentangled.position_buckets == get_config("deberta-v3-tiny").disentangled.position_buckets
    with pytest.raises(ConfigError, match="implementaton"):
        load_run_config(path, ["model.overrides.disentangled.implementaton=dense"])


def test_compile_check_resolves_deberta_attention_for_the_target_platform(tmp_path):
    """The AOT setup resolved attention_implementation "auto" for the target, but DeBERTa's disentangled "auto"
    resolved later for the machine compiling: a GPU compile-check compiled the CPU's XLA path."""
    from bertjax.train.setup import build_model_config

    config = run_config_from_dict(_with("model", preset="deberta-v3-tiny"))
    resolved = {platform: build_model_config(config, vocab_size=128, pad_id=0, max_seq_len=32,
                                             attention_platform=platform).disentangled.implementation
                for platform in ("gpu", "tpu", None)}
    assert resolved == {"gpu": "pallas_gpu", "tpu": "dense", None: "auto"}


def test_pretraining_refuses_bfloat16_master_weights(tmp_path):
    """model.overrides.param_dtype=bfloat16 was accepted: updates below bfloat16's spacing rounded away (8 of 10 norm
    scales still exactly 1 after 20 steps), where fine-tuning and train-embedder force float32."""
    from bertjax.train.setup import build_model_config

    config = run_config_from_dict(_with("model", overrides={"param_dtype": "bfloat16"}))
    with pytest.raises(ConfigError, match="model.overrides.param_dtype='bfloat16': pretraining keeps float32"):
        build_model_config(config, vocab_size=128, pad_id=0, max_seq_len=32)
    bf16 = run_config_from_dict(_with("model", overrides={"dtype": "bfloat16"}))
    assert build_model_config(bf16, vocab_size=128, pad_id=0, max_seq_len=32).dtype == "bfloat16"


def test_a_roberta_family_model_follows_the_tokenizers_padding_and_separator():
    """roberta-base.yaml trains its own tokenizer ([PAD] 0, [SEP] 3): the preset's position offset 2 (RoBERTa's pad
    1 + 1) made the trained model impossible to export (transformers numbers positions from pad + 1), and a
    Longformer's sep_token_id 2 (its [CLS] here) put no global attention on a question. Both follow the tokenizer
    now, unless overridden; one token type means none is passed, as RoBERTa's own tokenizer gives all zeros."""
    from bertjax.finetune.tasks.base import Task
    from bertjax.hf.registry import FAMILIES
    from bertjax.train.setup import build_model_config

    roberta = run_config_from_dict(_with("model", preset="roberta-base"))
    own = build_model_config(roberta, vocab_size=512, pad_id=0, max_seq_len=32, sep_id=3)
    assert own.position_offset == 1
    FAMILIES["roberta"].to_hf_config(own, "masked_lm")  # refused before: position_offset=2 (needs 1)
    assert build_model_config(roberta, vocab_size=512, pad_id=1, max_seq_len=32).position_offset == 2
    kept = run_config_from_dict(_with("model", preset="roberta-base", overrides={"position_offset": 2}))
    assert build_model_config(kept, vocab_size=512, pad_id=0, max_seq_len=32).position_offset == 2
    assert build_model_config(run_config_from_dict(_with("model", preset="bert-base")), vocab_size=512, pad_id=5,
                              max_seq_len=32).position_offset == 0
    longformer = run_config_from_dict(_with("model", preset="longformer-tiny"))
    assert build_model_config(longformer, vocab_size=512, pad_id=0, max_seq_len=32, sep_id=3) \
        .longformer.sep_token_id == 3
    chosen = run_config_from_dict(_with("model", preset="longformer-tiny",
                                        overrides={"longformer": {"sep_token_id": 7}}))
    assert build_model_config(chosen, vocab_size=512, pad_id=0, max_seq_len=32, sep_id=3) \
        .longformer.sep_token_id == 7
    batch = {"input_ids": 1, "segment_ids": 2, "token_type_ids": 3}
    assert "token_type_ids" not in Task.model_kwargs(batch, 1) and Task.model_kwargs(batch, 2)["token_type_ids"] == 3


def test_resuming_into_a_workdir_without_its_records_says_what_is_missing(tmp_path, caplog):
    """A preempted TPU slice recreated: the checkpoints (checkpoint.directory, a bucket) are there, the workdir on
    worker 0's disk is new. The run resumed without a word, its metrics history and setting checks gone."""
    import logging

    from bertjax.train.workdir import check_rerun

    config = run_config_from_dict(_with("checkpoint", directory=str(tmp_path / "bucket")))
    with caplog.at_level(logging.WARNING):
        assert check_rerun(tmp_path / "fresh", config, resumable=True) == []
    assert "into a workdir without its records (config.yaml, metrics.jsonl)" in caplog.text
    assert str(tmp_path / "bucket") in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        check_rerun(tmp_path / "fresh", config, resumable=False)  # nothing to resume: a fresh run
    assert "without its records" not in caplog.text


def test_a_nested_model_option_that_differs_on_resume_gets_its_override_as_the_hint(tmp_path):
    """An older Longformer workdir (sep_token_id 2, the preset's) resumed now that it follows the tokenizer's
    [SEP] (3): the refusal named no override, though model.overrides.longformer.sep_token_id=2 resumes it."""
    import dataclasses
    import json

    from bertjax.config import get_config
    from bertjax.train.workdir import MODEL_CONFIG_FILE, check_model_config

    config = get_config("longformer-tiny", vocab_size=64)
    older = config.replace(longformer=dataclasses.replace(config.longformer, sep_token_id=2))
    newer = config.replace(longformer=dataclasses.replace(config.longformer, sep_token_id=3))
    (tmp_path / MODEL_CONFIG_FILE).write_text(json.dumps({"head": "masked_lm", "config": older.to_dict()}))
    with pytest.raises(ConfigError, match=r"resume it with the workdir's model "
                                          r"\(model.overrides.longformer.sep_token_id=2\)"):
        check_model_config(tmp_path, {"head": "masked_lm", "config": newer.to_dict()})
