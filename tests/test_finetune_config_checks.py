"""Fine-tuning settings that cannot work are refused before anything runs or is written, naming the dotted key
(problem type, QA stride, main metric, a changed rerun), and QA answers are located only inside their context."""

import json
from pathlib import Path

import pytest

from bertjax.finetune import qa
from bertjax.finetune.config import load_finetune_config
from bertjax.finetune.tasks import task_class
from bertjax.train.run_config import ConfigError, to_dict
from finetune_helpers import VOCAB, finetune_files

CONTEXT = "the cat sat on the mat in paris ."


def _tokenizer():
    from bertjax.data.tokenizers import WordPieceTokenizer
    return WordPieceTokenizer("\n".join(VOCAB + ["the", "cat", "sat", "on", "mat", "in"]))


def test_multi_label_problem_type_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match="task.problem_type multi_label_classification is not supported"):
        load_finetune_config(None, ["task.problem_type=multi_label_classification"])


def test_single_label_classification_with_one_label_is_refused():
    with pytest.raises(ConfigError, match="single_label_classification needs task.num_labels >= 2"):
        load_finetune_config(None, ["task.problem_type=single_label_classification", "task.num_labels=1"])


def test_null_score_diff_threshold_must_be_finite():
    assert load_finetune_config(None, ["data.null_score_diff_threshold=-1.5"]).data.null_score_diff_threshold == -1.5
    with pytest.raises(ConfigError, match="data.null_score_diff_threshold must be a finite number"):
        load_finetune_config(None, ["data.null_score_diff_threshold=.inf"])


def test_doc_stride_must_fit_the_context_room_of_max_length():
    with pytest.raises(ValueError, match=r"data.doc_stride \(128\) must be less than .* data.max_length \(128\)"):
        qa.make_windows(_tokenizer(), "where ?", CONTEXT, None, max_length=128, doc_stride=128)
    # max_length 16: a question takes up to 8 tokens and [CLS] q [SEP] c [SEP] 3 more, leaving 5 for the context.
    with pytest.raises(ValueError, match=r"data.doc_stride \(5\) .* leaves 5"):
        qa.make_windows(_tokenizer(), "where ?", CONTEXT, None, max_length=16, doc_stride=5)
    assert len(qa.make_windows(_tokenizer(), "where ?", CONTEXT, None, max_length=16, doc_stride=4).input_ids) == 1


def test_negative_or_overlong_answer_start_is_not_in_the_context():
    text = "paris ."
    assert qa.answer_in_context(CONTEXT, qa.Answer(text, CONTEXT.index(text)))
    # CONTEXT[-len(CONTEXT):-len(CONTEXT) + 7] is "the cat": a negative start counted from the end matched.
    assert not qa.answer_in_context(CONTEXT, qa.Answer("the cat", -len(CONTEXT)))
    assert not qa.answer_in_context(CONTEXT, qa.Answer("the cat", -1))
    assert not qa.answer_in_context(CONTEXT, qa.Answer(text, len(CONTEXT)))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return finetune_files(tmp_path_factory.mktemp("finetune-checks"), 32, 8)


def test_unknown_main_metric_is_refused_before_anything_is_written(files):
    from bertjax.finetune.trainer import finetune

    workdir = files["root"] / "bad-metric"
    task = task_class("sequence-classification")
    config = load_finetune_config(None, ["eval.main_metric=acuracy", "data.max_length=16"], task.defaults)
    with pytest.raises(ConfigError, match=r"eval.main_metric: 'acuracy' is not a metric of this task; its metrics: "
                                          r"\['accuracy', 'f1', 'f1_macro', 'loss', 'mcc'\]"):
        finetune(files["model"], task, files["train"], files["validation"], workdir, config, say=lambda _: None)
    assert not workdir.exists()  # so the corrected command is not refused as a changed rerun


def test_rerun_names_each_changed_key_and_allows_what_leaves_the_weights_alone(tmp_path):
    from bertjax.finetune.trainer import RUN_FILE, _check_workdir

    identity = {"model": "/m", "task": "sequence-classification", "train": "/t", "validation": "/v"}
    held = load_finetune_config(None, [])
    (tmp_path / RUN_FILE).write_text(json.dumps({**identity, "config": to_dict(held)}))
    allowed = load_finetune_config(None, ["train.progress_bar=false", "eval.every=5", "checkpoint.keep=1"])
    assert [key for key, _, _ in _check_workdir(tmp_path, allowed, identity)] == \
        ["train.progress_bar", "eval.every", "checkpoint.keep"]
    changed = load_finetune_config(None, ["train.epochs=4", "train.max_grad_norm=null"])
    with pytest.raises(ConfigError) as error:
        _check_workdir(tmp_path, changed, identity)
    message = str(error.value)
    assert "train.epochs: 3 in the workdir, 4 requested; train.max_grad_norm: 1.0 in the workdir, None requested" \
        in message and len(message) < 400, message
    with pytest.raises(ConfigError, match="another train"):
        _check_workdir(tmp_path, held, {**identity, "train": "/other"})


def test_a_data_file_changed_at_its_path_is_refused_naming_it_and_older_records_still_resume(tmp_path):
    from bertjax.finetune.trainer import RUN_FILE, _check_workdir
    from bertjax.train.workdir import FINGERPRINTS, data_identity

    train, validation = tmp_path / "train.jsonl", tmp_path / "validation.jsonl"
    train.write_text('{"text": "good", "label": "pos"}\n')
    validation.write_text('{"text": "bad", "label": "neg"}\n')
    identity = {"model": "/m", "task": "sequence-classification",
                **data_identity({"train": train, "validation": validation})}
    held = load_finetune_config(None, [])
    (tmp_path / RUN_FILE).write_text(json.dumps({**identity, "config": to_dict(held)}))
    assert _check_workdir(tmp_path, held, identity) == []
    validation.write_text('{"text": "bad", "label": "pos"}\n')  # edited in place: the same size
    changed = {**identity, **data_identity({"train": train, "validation": validation})}
    with pytest.raises(ConfigError, match=rf"another content of its validation file {validation} \(32 bytes, sha256 "
                                          r"\w{12} then, 32 bytes, sha256 \w{12} now\): the file changed since"):
        _check_workdir(tmp_path, held, changed)
    # A workdir written before fingerprints were recorded resumes on its paths alone.
    older = {k: v for k, v in identity.items() if k != FINGERPRINTS}
    (tmp_path / RUN_FILE).write_text(json.dumps({**older, "config": to_dict(held)}))
    assert _check_workdir(tmp_path, held, changed) == []


def test_a_stopped_run_records_its_data_files_and_refuses_one_regenerated(files, tmp_path):
    import shutil

    from bertjax.finetune.trainer import RUN_FILE, finetune

    train = shutil.copy(files["train"], tmp_path / "train.jsonl")
    task = task_class("sequence-classification")
    config = load_finetune_config(None, ["data.max_length=16", "train.batch_size=8", "train.progress_bar=false"],
                                  task.defaults)
    workdir = tmp_path / "run"
    finetune(files["model"], task, train, files["validation"], workdir, config, stop_after=1, say=lambda _: None)
    record = (workdir / RUN_FILE).read_text()
    assert set(json.loads(record)["fingerprints"]) == {"train", "validation"}
    rows = Path(train).read_text().splitlines(keepends=True)
    Path(train).write_text("".join(rows[:16]))  # the file regenerated with half its rows
    with pytest.raises(ConfigError, match=f"another content of its train file {train} "):
        finetune(files["model"], task, train, files["validation"], workdir, config, say=lambda _: None)
    assert (workdir / RUN_FILE).read_text() == record


def test_negative_seed_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match="train.seed must be >= 0, got -1"):
        load_finetune_config(None, ["train.seed=-1"])


def test_the_config_file_in_the_workdir_is_not_overwritten(tmp_path, capsys):
    """`finetune --config exp/config.yaml --workdir exp` would replace the user's file by the resolved config."""
    from bertjax.cli import main

    exp = tmp_path / "exp"
    exp.mkdir()
    (exp / "config.yaml").write_text("# my settings\ntrain:\n  epochs: 5\n")
    before = (exp / "config.yaml").read_bytes()
    args = ["finetune", "--model", str(tmp_path / "model"), "--task", "sequence-classification", "--train",
            str(tmp_path / "t.jsonl"), "--validation", str(tmp_path / "v.jsonl"), "--workdir", str(exp)]
    assert main([*args, "--config", str(exp / "config.yaml"), "train.epochs=1"]) == 2
    assert "is the file bertjax writes its resolved config to" in capsys.readouterr().err
    assert main(args) == 2
    assert "was not written by bertjax" in capsys.readouterr().err
    assert (exp / "config.yaml").read_bytes() == before and [p.name for p in exp.iterdir()] == ["config.yaml"]


def test_a_directory_of_the_users_holding_files_a_run_writes_is_refused_untouched(tmp_path, capsys):
    """A --workdir that holds no run but a results.json, metrics.jsonl or plot of the user's: the run would
    replace them (as only config.yaml was protected)."""
    from bertjax.cli import main

    mine = tmp_path / "mine"
    mine.mkdir()
    for name in ("results.json", "metrics.jsonl", "finetune.png", "notes.txt"):
        (mine / name).write_text(f"my own {name}\n")
    args = ["finetune", "--model", str(tmp_path / "model"), "--task", "sequence-classification", "--train",
            str(tmp_path / "t.jsonl"), "--validation", str(tmp_path / "v.jsonl"), "--workdir", str(mine)]
    assert main(args) == 2
    assert "holds metrics.jsonl, results.json, finetune.png, which a run writes there" in capsys.readouterr().err
    assert {p.name: p.read_text() for p in mine.iterdir()} == {name: f"my own {name}\n" for name in
                                                              ("results.json", "metrics.jsonl", "finetune.png",
                                                               "notes.txt")}


def test_the_outputs_a_run_may_replace_are_the_names_each_run_writes():
    from bertjax.embeddings.training import MODEL_DIR, RUN_FILE as EMBEDDER_RECORD
    from bertjax.finetune import report
    from bertjax.finetune.trainer import BEST_DIR, RUN_FILE as FINETUNE_RECORD
    from bertjax.model_dirs import MODEL_CONFIG_FILE
    from bertjax.train import metrics
    from bertjax.train.workdir import RUN_OUTPUTS

    logged = {metrics.METRICS_FILE, metrics.TENSORBOARD_DIR}
    assert {record: set(names) for record, names in RUN_OUTPUTS.items()} == {
        MODEL_CONFIG_FILE: logged | {metrics.PLOT_FILE},
        FINETUNE_RECORD: logged | {report.RESULTS_FILE, report.PLOT_FILE, BEST_DIR},
        EMBEDDER_RECORD: logged | {metrics.PLOT_FILE, MODEL_DIR}}


def test_glue_grid_is_checked_before_anything_trains(tmp_path, capsys):
    from bertjax.cli import main
    from bertjax.finetune.glue import run_glue

    (tmp_path / "data" / "SST-2").mkdir(parents=True)
    (tmp_path / "data" / "SST-2" / "train.tsv").write_text("sentence\tlabel\ngood\t1\n")
    workdir = tmp_path / "glue"
    args = ["glue", "--model", str(tmp_path / "model"), "--data-dir", str(tmp_path / "data"), "--workdir",
            str(workdir)]
    with pytest.raises(SystemExit):  # argparse: a learning rate of 0 trains nothing
        main([*args, "--learning-rates", "1e-4,0"])
    assert "expected positive numbers, got '1e-4,0'" in capsys.readouterr().err
    with pytest.raises(ConfigError, match=r"GLUE SST-2, grid point learning rate 0, weight decay 1e-06, 1 epochs "
                                          r".*train.learning_rate must be positive"):
        run_glue(tmp_path / "model", tmp_path / "data", workdir, learning_rates=[1e-4, 0], weight_decays=[1e-6],
                 epochs=[1], say=lambda _: None)
    with pytest.raises(ConfigError, match="grid point learning rate 0.0001.*train.batch_size must be positive"):
        run_glue(tmp_path / "model", tmp_path / "data", workdir, learning_rates=[1e-4], weight_decays=[0],
                 epochs=[1], overrides=["train.batch_size=0"], say=lambda _: None)
    assert not workdir.exists()  # nothing read, written or trained
    # WNLI was passed over without a word, and --tasks WNLI called it unknown.
    (tmp_path / "data" / "WNLI").mkdir()
    (tmp_path / "data" / "WNLI" / "train.tsv").write_text("index\tsentence1\tsentence2\tlabel\n")
    said = []
    with pytest.raises(ConfigError, match="train.learning_rate must be positive"):
        run_glue(tmp_path / "model", tmp_path / "data", workdir, learning_rates=[0], weight_decays=[1e-6],
                 epochs=[1], say=said.append)
    assert any("WNLI: skipped (WNLI's dev set is adversarial" in line for line in said), said
    with pytest.raises(ValueError, match="WNLI is not fine-tuned"):
        run_glue(tmp_path / "model", tmp_path / "data", workdir, tasks=["WNLI"], say=said.append)


def test_a_pretraining_workdir_is_not_a_finetuning_workdir(tmp_path, capsys):
    """Fine-tuning into a pretraining workdir would rewrite its config.yaml and find its checkpoints."""
    from bertjax.cli import main

    pretraining = tmp_path / "runs" / "tiny"
    pretraining.mkdir(parents=True)
    (pretraining / "model_config.json").write_text("{}")
    (pretraining / "config.yaml").write_text("train: {steps: 600}\n")
    args = ["finetune", "--model", str(tmp_path / "model"), "--task", "sequence-classification", "--train",
            str(tmp_path / "t.jsonl"), "--validation", str(tmp_path / "v.jsonl"), "--workdir", str(pretraining)]
    assert main(args) == 2
    assert "holds a run of `bertjax pretrain` (model_config.json), not one of `bertjax finetune`" in \
        capsys.readouterr().err
    assert sorted(p.name for p in pretraining.iterdir()) == ["config.yaml", "model_config.json"]


@pytest.mark.parametrize("task", ["token-classification", "question-answering", "multiple-choice"])
def test_packing_a_task_that_does_not_pack_is_refused(task):
    """data.packing used to be accepted and ignored by every task but sequence classification (trained unpacked,
    config.yaml saying packed)."""
    config = load_finetune_config(None, ["data.packing=true"], task_class(task).defaults)
    with pytest.raises(ConfigError, match=f"data.packing: the {task} task does not pack"):
        task_class(task)(config.data, config.task)
    config = load_finetune_config(None, ["data.packing=true"], task_class("sequence-classification").defaults)
    assert task_class("sequence-classification")(config.data, config.task).data.packing


def test_task_unanswerable_decides_whether_an_answer_may_be_empty(tmp_path):
    """A transformers SQuAD v2 checkpoint has no finetune.json, so predict never answered "" and every
    unanswerable question scored 0; a SQuAD v2 subset without impossible questions turned no-answer off as well.
    task.unanswerable says it; other tasks refuse the key."""
    transformers = pytest.importorskip("transformers")
    from bertjax.finetune.prediction import load_task
    from bertjax.model_dirs import load_model_dir
    from finetune_helpers import tiny_model_dir

    base = tiny_model_dir(tmp_path / "base")
    qa_dir = tmp_path / "squad2"
    transformers.BertForQuestionAnswering(transformers.AutoConfig.from_pretrained(base)).save_pretrained(qa_dir)
    for name in ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json"):
        if (base / name).is_file():
            (qa_dir / name).write_bytes((base / name).read_bytes())
    model, _, _ = load_model_dir(qa_dir)
    assert not load_task(qa_dir, model, [])[1].unanswerable
    assert load_task(qa_dir, model, ["task.unanswerable=true"])[1].unanswerable

    qa_task = task_class("question-answering")
    rows = [{"question": "q", "context": "c d", "answers": {"text": ["d"], "answer_start": [2]}}]
    config = load_finetune_config(None, ["task.unanswerable=true"], qa_task.defaults)
    assert qa_task(config.data, config.task).fit_labels(rows, "v2-subset.jsonl", None).unanswerable
    empty = [{**rows[0], "answers": {"text": [], "answer_start": []}}]
    config = load_finetune_config(None, ["task.unanswerable=false"], qa_task.defaults)
    assert not qa_task(config.data, config.task).fit_labels(empty, "f", None).unanswerable
    classification = task_class("sequence-classification")
    config = load_finetune_config(None, ["task.unanswerable=true"], classification.defaults)
    with pytest.raises(ConfigError, match="task.unanswerable: the sequence-classification task has no empty answer"):
        classification(config.data, config.task)
