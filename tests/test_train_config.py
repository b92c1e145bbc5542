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
    (_with("model", overrides={"hiden_size": 8}), "model: EncoderConfig has no field"),
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
