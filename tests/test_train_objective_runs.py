"""Every objective trains a tiny model on the embedded corpus for a few dozen steps, and its held-out loss falls.

The MLM run doubles as the distillation teacher: the student (one layer, initialised from the teacher's layer 0)
reads the teacher's workdir and tokenizer, as `objective.teacher: <workdir>` does from the command line.
"""

import json

import pytest

from bertjax.inference.fill_mask import load_predictor
from bertjax.model_dirs import EXPORTS_DIR
from bertjax.train.loop import pretrain
from bertjax.train.metrics import read_metrics
from bertjax.train.run_config import load_run_config
from train_helpers import REPO, small_tokenizer

STEPS = 30
CONFIGS = REPO / "configs" / "pretrain"
# The shipped CPU configs at test sizes: rows of 32 tokens, batches of 8, hidden 32, 30 steps.
SHRINK = ["data.seq_len=32", "data.global_batch_size=8", "data.window_documents=64",
          "model.overrides.hidden_size=32", "model.overrides.num_heads=4", "model.overrides.intermediate_size=64",
          "model.overrides.max_position_embeddings=64", f"train.steps={STEPS}", "train.log_every=10",
          "train.progress_bar=false", "eval.every=0", "eval.batches=3", "eval.fill_mask_examples=0",
          f"checkpoint.every={STEPS}", "schedule.unit=fraction", "schedule.warmup=0.1",
          "optimizer.learning_rate=3.0e-3"]


def run(workdir, config: str, *overrides: str, tokenizer: bool = True):
    extra = [f"tokenizer.path={small_tokenizer()}"] if tokenizer else []
    return pretrain(load_run_config(CONFIGS / config, [*SHRINK, *extra, *overrides]), workdir)


def assert_learns(result):
    assert result.final_step == STEPS
    assert result.eval_loss_end < result.eval_loss_start, (result.eval_loss_start, result.eval_loss_end)


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    """The main job's config (configs/pretrain/tiny.yaml), two layers."""
    return run(tmp_path_factory.mktemp("mlm") / "run", "tiny.yaml", "model.overrides.num_layers=2",
               "model.overrides.local_window=8", "schedule.decay=0.3")


def test_mlm_learns(teacher):
    assert_learns(teacher)
    assert "mlm_accuracy" in read_metrics(teacher.workdir)[-1]


def test_mlm_nsp_learns(tmp_path):
    result = run(tmp_path / "bert", "bert-base.yaml", "model.overrides.num_layers=2", "train.phases=[]",
                 "data.max_predictions=5")
    assert_learns(result)
    assert "eval_nsp_accuracy" in read_metrics(result.workdir)[-1]


def test_mlm_sop_learns(tmp_path):
    result = run(tmp_path / "albert", "tiny-albert.yaml", "model.overrides.num_layers=2",
                 "model.overrides.embedding_size=16")
    assert_learns(result)
    last = read_metrics(result.workdir)[-1]
    assert "eval_sop_accuracy" in last and "eval_nsp_accuracy" not in last


def test_eurobert_mlm_learns(tmp_path):
    result = run(tmp_path / "eurobert", "tiny-eurobert.yaml", "model.overrides.num_layers=2",
                 "model.overrides.num_kv_heads=2", "schedule.decay=0.3")
    assert_learns(result)


def test_distillation_learns_from_a_pretraining_workdir(tmp_path, teacher):
    # No tokenizer given: the student reads the teacher's; one layer, initialised from the teacher's first.
    result = run(tmp_path / "student", "tiny-distilbert.yaml", f"objective.teacher={teacher.workdir}",
                 "model.overrides.num_layers=1", "model.overrides.local_window=8", tokenizer=False)
    assert_learns(result)
    last = read_metrics(result.workdir)[-1]
    for name in ("kl_loss", "mlm_loss", "cosine_loss", "eval_kl_loss"):
        assert name in last, name
    assert (result.workdir / "tokenizer").is_dir()
    # The teacher is part of the run: a resume against a teacher trained on since (another fingerprint) is refused;
    # it went on silently. A description written before teachers were recorded still resumes.
    from bertjax.train import workdir as workdir_lib
    from bertjax.train.run_config import ConfigError

    described = json.loads((result.workdir / "model_config.json").read_text())
    assert described["frozen"]["teacher"] == str(teacher.workdir.resolve())
    workdir_lib.check_model_config(result.workdir, described)
    changed = {**described, "frozen": {**described["frozen"], "fingerprint": "0" * 16}}
    with pytest.raises(ConfigError, match="trained against other frozen parameters .* the run started from "
                                          f"{teacher.workdir.resolve()}"):
        workdir_lib.check_model_config(result.workdir, changed)
    moved = {**described, "frozen": {**described["frozen"], "teacher": "/another/disk/teacher"}}
    workdir_lib.check_model_config(result.workdir, moved)  # the same teacher copied elsewhere: by its contents
    older = {k: v for k, v in described.items() if k != "frozen"}
    (result.workdir / "model_config.json").write_text(json.dumps(older))
    workdir_lib.check_model_config(result.workdir, changed)


def test_electra_learns_and_saves_both_models(tmp_path):
    result = run(tmp_path / "electra", "tiny-electra.yaml", "model.overrides.num_layers=2",
                 "model.overrides.embedding_size=16")
    assert_learns(result)
    last = read_metrics(result.workdir)[-1]
    for name in ("generator_mlm_accuracy", "rtd_accuracy", "rtd_precision", "rtd_recall", "replacement_rate"):
        assert name in last, name
    assert 0.0 < last["replacement_rate"] < 0.15
    described = json.loads((result.workdir / "model_config.json").read_text())
    assert described["head"] == "replaced_token_detection" and described["params_key"] == "discriminator"
    for name in ("discriminator", "generator"):
        assert (result.workdir / EXPORTS_DIR / name / "model_config.json").is_file(), name
    # fill-mask on the workdir reads the discriminator, which has no MLM head: the error names the generator export.
    generator = result.workdir / EXPORTS_DIR / "generator"
    with pytest.raises(ValueError, match=f"such as this run's generator: --model {generator}"):
        load_predictor(result.workdir)
    [[options]] = load_predictor(generator).many(["the [MASK] ."], 3)  # one text, one mask
    assert all(0.0 <= option.probability <= 1.0 for option in options)


def test_deberta_v3_replaced_token_detection_with_gdes_learns_and_saves_both_models(tmp_path):
    """configs/pretrain/tiny-deberta-v3.yaml: the discriminator's embeddings are the generator's (under
    stop_gradient) plus its own residual, which its workdir description and exports compute from shapes first."""
    result = run(tmp_path / "deberta-v3", "tiny-deberta-v3.yaml", "model.overrides.num_layers=2")
    assert_learns(result)
    described = json.loads((result.workdir / "model_config.json").read_text())
    assert described["head"] == "replaced_token_detection" and described["config"]["family"] == "deberta-v2"
    for name in ("discriminator", "generator"):
        assert (result.workdir / EXPORTS_DIR / name / "model_config.json").is_file(), name
