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
