"""`bertjax finetune` end to end on a tiny model (hidden 32, 2 layers): it learns a separable task, leaves its
artefacts, resumes exactly, and runs every task through `bertjax predict`."""

import json

import jax
import numpy as np
import pytest

from bertjax.finetune.prediction import predict
from bertjax.finetune.config import load_finetune_config
from bertjax.finetune.tasks import task_class
from bertjax.finetune.trainer import finetune
from bertjax.train.metrics import read_metrics
from finetune_helpers import NEUTRAL, POSITIVE, choice_rows, finetune_files, tiny_model_dir, write_jsonl

FAST = ["train.batch_size=16", "train.learning_rate=3e-3", "data.max_length=16", "train.progress_bar=false",
        "eval.batch_size=32"]

def config(task: str, *overrides: str):
    return load_finetune_config(None, FAST + list(overrides), task_class(task).defaults)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return finetune_files(tmp_path_factory.mktemp("finetune"), 256, 64)


@pytest.fixture(scope="module")
def full_run(files):
    workdir = files["root"] / "full"
    result = finetune(files["model"], task_class("sequence-classification"), files["train"], files["validation"],
                      workdir, config("sequence-classification"), say=lambda _: None)
    return workdir, result


def test_learns_a_separable_task_and_writes_its_artefacts(files, full_run):
    workdir, result = full_run
    records = read_metrics(workdir)
    validation = [r for r in records if r["split"] == "validation"]
    assert [r["step"] for r in validation] == [16, 32, 48] and [r["epoch"] for r in validation] == [1.0, 2.0, 3.0]
    assert set(validation[0]) == {"step", "epoch", "split", "loss", "accuracy", "f1_macro", "mcc", "f1"}
    assert max(r["accuracy"] for r in validation) >= 0.95
    results = json.loads((workdir / "results.json").read_text())
    best = max(validation, key=lambda r: r["accuracy"])
    assert (results["main_metric"], results["best"], results["best_step"]) == ("accuracy", best["accuracy"],
                                                                             best["step"])
    assert (workdir / "finetune.png").is_file() and any((workdir / "tensorboard").iterdir())
    # best/ predicts what the best evaluation measured
    predictions = predict(workdir / "best", files["validation"])
    gold = [json.loads(line)["label"] for line in files["validation"].read_text().splitlines()]
    assert np.mean([p["label"] == g for p, g in zip(predictions, gold)]) == pytest.approx(best["accuracy"])
    assert all(abs(sum(p["scores"].values()) - 1) < 1e-6 for p in predictions)
    assert json.loads((workdir / "best" / "finetune.json").read_text())["text_pairs"] == "none"  # single texts


def test_best_is_a_transformers_directory(files, full_run):
    """best/ loads in transformers with its labels and gives the probabilities `bertjax predict` gives."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from bertjax.data import load_tokenizer
    from bertjax.finetune.encoding import encode_texts

    best = full_run[0] / "best"
    model = transformers.AutoModelForSequenceClassification.from_pretrained(best).eval()
    assert model.config.id2label == {0: "negative", 1: "positive"}
    source = transformers.AutoConfig.from_pretrained(files["model"])  # its special-token ids are kept
    assert (model.config.bos_token_id, model.config.eos_token_id) == (source.bos_token_id, source.eos_token_id)
    assert source.bos_token_id is not None
    texts = [json.loads(line)["text"] for line in files["validation"].read_text().splitlines()[:8]]
    rows = encode_texts(load_tokenizer(best), texts, None, 16, True, "validation")
    with torch.no_grad():
        logits = model(input_ids=torch.tensor(rows["input_ids"], dtype=torch.long),
                       attention_mask=torch.tensor(rows["segment_ids"], dtype=torch.long)).logits
    reference = torch.softmax(logits, -1).numpy()
    ours = [[p["scores"]["negative"], p["scores"]["positive"]] for p in predict(best, files["validation"])[:8]]
    np.testing.assert_allclose(ours, reference, atol=1e-5)
    # transformers' own tokenizer of best/ gives those rows: [CLS] ... [SEP], the same ids
    tokenizer = transformers.AutoTokenizer.from_pretrained(best)
    for text, ids, segments in zip(texts, rows["input_ids"], rows["segment_ids"]):
        assert tokenizer(text, truncation=True, max_length=16)["input_ids"] == [int(i) for i, s in
                                                                               zip(ids, segments) if s]


def test_predict_scores_a_multi_label_checkpoint_with_a_sigmoid_per_label(files, full_run, tmp_path):
    """A transformers classifier trained with problem_type multi_label_classification: each label's probability
    is its own sigmoid, as transformers' pipeline scores it, and `labels` lists those at 0.5 or more. It used to
    get a softmax over the labels, without a word."""
    import shutil

    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from bertjax.data import load_tokenizer
    from bertjax.finetune.encoding import encode_texts

    model = transformers.AutoModelForSequenceClassification.from_pretrained(full_run[0] / "best").eval()
    model.config.problem_type = "multi_label_classification"
    with torch.no_grad():
        model.classifier.bias.copy_(torch.tensor([0.5, 0.5]))  # both labels apply to some texts, one to others
    hf = tmp_path / "multi-label"
    model.save_pretrained(hf)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (full_run[0] / "best" / name).is_file():
            shutil.copy(full_run[0] / "best" / name, hf / name)
    texts = [json.loads(line)["text"] for line in files["validation"].read_text().splitlines()[:8]]
    rows = encode_texts(load_tokenizer(hf), texts, None, 16, True, "validation")
    with torch.no_grad():
        logits = model(input_ids=torch.tensor(rows["input_ids"], dtype=torch.long),
                       attention_mask=torch.tensor(rows["segment_ids"], dtype=torch.long)).logits
    reference = torch.sigmoid(logits).numpy()
    records = predict(hf, files["validation"])[:8]
    np.testing.assert_allclose([[r["scores"]["negative"], r["scores"]["positive"]] for r in records], reference,
                               atol=1e-5)
    names = ("negative", "positive")
    for record, row in zip(records, reference):
        assert record["labels"] == [names[i] for i in np.argsort(-row, kind="stable") if row[i] >= 0.5]
        assert record["label"] == names[int(row.argmax())]
    assert {len(r["labels"]) for r in records} == {1, 2}

    # One output and no problem_type (a reranker): its sigmoid, as the pipeline scores it; it was a softmax, 1.0.
    config = transformers.AutoConfig.from_pretrained(hf, num_labels=1, problem_type=None)
    torch.manual_seed(0)
    single = transformers.AutoModelForSequenceClassification.from_config(config).eval()
    single.save_pretrained(hf)
    with torch.no_grad():
        logits = single(input_ids=torch.tensor(rows["input_ids"], dtype=torch.long),
                        attention_mask=torch.tensor(rows["segment_ids"], dtype=torch.long)).logits
    records = predict(hf, files["validation"])[:8]
    np.testing.assert_allclose([r["score"] for r in records], torch.sigmoid(logits).numpy()[:, 0], atol=1e-5)
    assert len({round(r["score"], 6) for r in records}) > 1


def test_a_checkpoints_classifier_starts_fresh_when_its_labels_mean_other_classes(files, full_run, tmp_path):
    """best/'s rows are negative, positive. A file labelled neg/pos (other names) or with the checkpoint's names in
    another order would have trained on rows that mean other classes (the shapes fit): the output layer is dropped
    and drawn fresh; the same names in the same order, in any case, keep it."""
    transformers = pytest.importorskip("transformers")
    from bertjax.finetune.trainer import known_labels, without_relabelled_rows
    from bertjax.model_dirs import load_model_dir

    model, params, _ = load_model_dir(full_run[0] / "best")
    task = task_class("sequence-classification")(config("sequence-classification").data,
                                                 config("sequence-classification").task)
    assert known_labels(model) == ("negative", "positive")
    rows = lambda labels: [{"text": "a b", "label": v} for v in labels]  # noqa: E731
    for labels, dropped in [(["NEGATIVE", "Positive"], []), (["neg", "pos"], ["classifier/out/bias",
                                                                               "classifier/out/kernel"])]:
        fitted = task.fit_labels(rows(labels), "f", known_labels(model))
        kept, relabelled = without_relabelled_rows(params, model, task, fitted)
        assert relabelled == dropped, labels
        assert ("out" in kept["classifier"]) == (not dropped)
    swapped = transformers.AutoModelForSequenceClassification.from_pretrained(full_run[0] / "best")
    swapped.config.id2label, swapped.config.label2id = {0: "positive", 1: "negative"}, {"positive": 0, "negative": 1}
    swapped.save_pretrained(tmp_path / "swapped")
    model, params, _ = load_model_dir(tmp_path / "swapped")
    fitted = task.fit_labels(rows(["negative", "positive"]), "f", known_labels(model))
    assert fitted.names == ("positive", "negative")  # the checkpoint's order: its rows keep their meaning
    assert without_relabelled_rows(params, model, task, fitted)[1] == []


def test_predict_refuses_outputs_that_are_nan(files, full_run, tmp_path):
    """A model whose activations overflow (its weights finite, so loading takes it) scored every example as its
    first label, a record like any other."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import shutil

    model = transformers.AutoModelForSequenceClassification.from_pretrained(full_run[0] / "best").eval()
    with torch.no_grad():  # 3e38 + 3e38 is past float32's range: inf, then NaN in the layer norm
        model.base_model.embeddings.word_embeddings.weight.fill_(3e38)
        model.base_model.embeddings.position_embeddings.weight.fill_(3e38)
    broken = tmp_path / "nan"
    model.save_pretrained(broken)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (full_run[0] / "best" / name).is_file():
            shutil.copy(full_run[0] / "best" / name, broken / name)
    with pytest.raises(ValueError, match=r"outputs are NaN for \d+ of \d+ encoded rows \(the first: row 1\); it "
                                         r"computes in float32"):
        predict(broken, files["validation"])


def test_resume_after_a_stop_gives_the_same_metrics(files, full_run, caplog):
    reference, _ = full_run
    workdir = files["root"] / "resumed"
    args = (files["model"], task_class("sequence-classification"), files["train"], files["validation"], workdir,
            config("sequence-classification"))
    stopped = finetune(*args, stop_after=21, say=lambda _: None)  # past the first evaluation, mid-epoch 2
    assert stopped.final_step == 21 and not stopped.results["finished"]
    # The record as an older bertjax wrote it, before these keys: each resumes as its default, which is what that
    # version did. A recorded key that differs is still refused (test_rerun_with_other_settings_is_refused).
    record = json.loads((workdir / "finetune.json").read_text())
    del record["config"]["train"]["nonfinite"], record["config"]["task"]["classifier_pooling"]
    (workdir / "finetune.json").write_text(json.dumps(record))
    with caplog.at_level("WARNING"):
        resumed = finetune(*args, say=lambda _: None)
    assert "before task.classifier_pooling, train.nonfinite: each takes its default" in caplog.text
    assert resumed.start_step == 21 and resumed.final_step == 48
    assert read_metrics(workdir) == read_metrics(reference)


def test_sigterm_saves_the_step_and_a_rerun_resumes_exactly(files, full_run):
    # A preemption (SIGTERM) during the step-16 evaluation: that step is saved, the run stops, and the rerun
    # continues from it to the metrics of the uninterrupted run.
    import os
    import signal

    reference, _ = full_run
    workdir = files["root"] / "preempted"
    args = (files["model"], task_class("sequence-classification"), files["train"], files["validation"], workdir,
            config("sequence-classification"))
    said = []

    def preempt(text):
        said.append(text)
        if text.startswith("step 16 "):
            os.kill(os.getpid(), signal.SIGTERM)

    handler = signal.getsignal(signal.SIGTERM)
    stopped = finetune(*args, say=preempt)
    assert stopped.final_step == 16 and not stopped.results["finished"]
    assert any(text.startswith("SIGTERM: saved a checkpoint at step 16") for text in said), said
    assert signal.getsignal(signal.SIGTERM) is handler  # the run's handler is gone with the run
    resumed = finetune(*args, say=lambda _: None)
    assert resumed.start_step == 16 and resumed.final_step == 48
    assert read_metrics(workdir) == read_metrics(reference)


def test_resume_after_a_crash_between_an_evaluation_and_its_checkpoint(files, full_run):
    """A run killed right after its step-32 evaluation (metrics.jsonl and best/ written, no checkpoint yet) resumes
    from step 16 and ends with the metrics of the uninterrupted run, the step-32 lines written once."""
    reference, _ = full_run
    workdir = files["root"] / "crashed"
    args = (files["model"], task_class("sequence-classification"), files["train"], files["validation"], workdir,
            config("sequence-classification"))

    def crash(text):
        if text.startswith("step 32 "):
            raise KeyboardInterrupt("killed")

    with pytest.raises(KeyboardInterrupt):
        finetune(*args, say=crash)
    assert max(r["step"] for r in read_metrics(workdir)) == 32
    resumed = finetune(*args, say=lambda _: None)
    assert resumed.start_step == 16 and resumed.final_step == 48
    assert read_metrics(workdir) == read_metrics(reference)
    assert json.loads((workdir / "results.json").read_text())["best"] == \
        json.loads((reference / "results.json").read_text())["best"]


def test_rerun_with_other_settings_is_refused(files, full_run):
    reference, _ = full_run
    with pytest.raises(ValueError, match=r"other settings \(train.epochs: 3 in the workdir, 4 requested\); only"):
        finetune(files["model"], task_class("sequence-classification"), files["train"], files["validation"],
                 reference, config("sequence-classification", "train.epochs=4"), say=lambda _: None)


def test_a_workdir_in_use_is_refused_and_left_as_it_was(files, full_run):
    # Two fine-tunes of one workdir would write each other's checkpoints and best/: the second is refused at once.
    from bertjax.train.workdir import LOCK_FILE, WorkdirBusy, WorkdirLock

    reference, _ = full_run
    before = sorted(path.name for path in reference.iterdir())
    holder = WorkdirLock(reference)
    holder.acquire()
    try:
        with pytest.raises(WorkdirBusy, match="workdir .* is in use by process"):
            finetune(files["model"], task_class("sequence-classification"), files["train"], files["validation"],
                     reference, config("sequence-classification"), say=lambda _: None)
        assert sorted(path.name for path in reference.iterdir()) == sorted(before + [LOCK_FILE])
    finally:
        holder.release()
    assert not (reference / LOCK_FILE).exists()


def test_restore_step_and_checkpoint_directory_are_honoured(files, full_run, tmp_path):
    """checkpoint.directory (another run's checkpoints) and checkpoint.restore_step (an earlier step) choose what a
    run resumes from, as in pretraining: from step 32 it trains to 48 and measures what the reference run did."""
    import shutil

    reference, _ = full_run
    shutil.copytree(reference / "checkpoints", tmp_path / "checkpoints")
    resumed = finetune(files["model"], task_class("sequence-classification"), files["train"], files["validation"],
                       tmp_path / "w", config("sequence-classification", f"checkpoint.directory={tmp_path}/checkpoints",
                                              "checkpoint.restore_step=32"), say=lambda _: None)
    assert (resumed.start_step, resumed.final_step) == (32, 48)
    last = [r for r in read_metrics(reference) if r["step"] == 48]
    assert [r for r in read_metrics(tmp_path / "w") if r["step"] == 48] == last
    # restore_step acts once: neither config.yaml nor finetune.json records it, so a rerun resumes from step 48.
    import yaml
    assert yaml.safe_load((tmp_path / "w" / "config.yaml").read_text())["checkpoint"]["restore_step"] is None
    assert json.loads((tmp_path / "w" / "finetune.json").read_text())["config"]["checkpoint"]["restore_step"] is None


def test_validation_label_unseen_in_training(files, tmp_path):
    validation = write_jsonl(tmp_path / "v.jsonl", [{"text": "good day", "label": "positive"},
                                                     {"text": "a day", "label": "neutral"}])
    with pytest.raises(ValueError, match=r"row 2: label 'neutral'.*does not occur in the training file"):
        finetune(files["model"], task_class("sequence-classification"), files["train"], validation,
                 tmp_path / "w", config("sequence-classification"), say=lambda _: None)


def test_tokenizer_larger_than_the_model_is_refused(files, full_run, tmp_path):
    import re
    import shutil

    from bertjax.data.tokenizers import WordPieceTokenizer
    from finetune_helpers import VOCAB

    model = shutil.copytree(full_run[0] / "best", tmp_path / "model")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):  # transformers' copy
        (model / name).unlink()
    WordPieceTokenizer("\n".join(VOCAB + ["extra", "words"])).save(model)  # 2 tokens past the embedding
    expected = re.escape(f"{model}: the tokenizer has {len(VOCAB) + 2} tokens but the model's vocab_size is "
                         f"{len(VOCAB)}")
    with pytest.raises(ValueError, match=expected):
        finetune(model, task_class("sequence-classification"), files["train"], files["validation"], tmp_path / "w",
                 config("sequence-classification"), say=lambda _: None)
    assert not (tmp_path / "w").exists()
    with pytest.raises(ValueError, match=expected):
        predict(model, files["validation"])


def test_a_default_max_length_is_capped_to_the_model_and_a_chosen_one_is_refused(files, tmp_path):
    import yaml

    short = tiny_model_dir(tmp_path / "short", max_position_embeddings=24)
    task = task_class("sequence-classification")
    defaults = load_finetune_config(None, [o for o in FAST if not o.startswith("data.max_length")], task.defaults)
    assert defaults.data.max_length == 128
    said = []
    def run(workdir, **kwargs):
        return finetune(short, task, files["train"], files["validation"], workdir, defaults, say=said.append,
                        stop_after=1, **kwargs)
    run(tmp_path / "w")
    assert any("data.max_length 128 -> 24" in line for line in said)
    assert yaml.safe_load((tmp_path / "w" / "config.yaml").read_text())["data"]["max_length"] == 24
    run(tmp_path / "w")  # the same command again resumes: the workdir holds the capped config
    assert any("resuming" in line for line in said)
    with pytest.raises(ValueError, match=r"data.max_length=128 is longer than --model .* takes: 24 tokens"):
        run(tmp_path / "chosen", chosen={"data.max_length"})
    assert not (tmp_path / "chosen").exists()


# ---------------------------------------------------------------------------------------------------------------
# The other tasks, one short run each, through the command line.

def _tagging(rng, count):
    rows = []
    for _ in range(count):
        words = [str(w) for w in rng.choice(NEUTRAL + POSITIVE, size=6)]
        rows.append({"tokens": words, "tags": ["B-POS" if w in POSITIVE else "O" for w in words]})
    return rows


def _questions(rng, count):
    rows = []
    for i in range(count):
        words = [str(w) for w in rng.choice(NEUTRAL, size=20)]
        k = int(rng.integers(20))
        words[k] = str(rng.choice(POSITIVE))
        start = len(" ".join(words[:k])) + (1 if k else 0)
        answers = {"text": [words[k]], "answer_start": [start]}
        rows.append({"id": f"q{i}", "question": "who ?", "context": " ".join(words), "answers": answers})
    return rows


@pytest.mark.parametrize("task, make, overrides, metric", [
    ("token-classification", _tagging, [], "f1"),
    ("question-answering", _questions, ["data.doc_stride=4", "train.epochs=3"], "f1"),
    ("multiple-choice", choice_rows, [], "accuracy"),
])
def test_each_task_trains_and_predicts(files, tmp_path, task, make, overrides, metric):
    from bertjax.cli import main

    rng = np.random.default_rng(0)
    train = write_jsonl(tmp_path / "train.jsonl", make(rng, 128))
    validation = write_jsonl(tmp_path / "validation.jsonl", make(rng, 32))
    workdir = tmp_path / "work"
    assert main(["finetune", "--model", str(files["model"]), "--task", task, "--train", str(train), "--validation",
                 str(validation), "--workdir", str(workdir), "train.epochs=2", *FAST, *overrides]) == 0
    results = json.loads((workdir / "results.json").read_text())
    assert results["main_metric"] == metric and results["best"] is not None
    output = tmp_path / "predictions.jsonl"
    assert main(["predict", "--model", str(workdir / "best"), "--input", str(validation), "--output",
                 str(output)]) == 0
    predictions = [json.loads(line) for line in output.read_text().splitlines()]
    rows = [json.loads(line) for line in validation.read_text().splitlines()]
    assert len(predictions) == len(rows)
    if task == "token-classification":
        assert all(len(p["tags"]) == len(r["tokens"]) for p, r in zip(predictions, rows))
        predicted = [p["tags"] for p in predictions]
        assert np.mean([p == r["tags"] for p, r in zip(predicted, rows)]) >= 0.9  # single-word entities: easy
    if task == "question-answering":
        assert all(p["answer"] == r["context"][p["start"]:p["end"]] for p, r in zip(predictions, rows))
        assert [p["id"] for p in predictions] == [r["id"] for r in rows]
        # Read as SQuAD v2 (answers may be ""): each record says by how much [CLS] beat its best span, and the
        # threshold decides: a very high one keeps every span, a very low one answers nothing.
        v2 = ["task.unanswerable=true"]
        kept = predict(workdir / "best", validation, [*v2, "data.null_score_diff_threshold=1e6"])
        assert [k["answer"] for k in kept] == [p["answer"] for p in predictions]
        assert all(isinstance(k["null_score_diff"], float) for k in kept)
        assert {k["answer"] for k in predict(workdir / "best", validation,
                                             [*v2, "data.null_score_diff_threshold=-1e6"])} == {""}
    if task == "multiple-choice":
        assert all(len(p["scores"]) == 3 for p in predictions)


def test_a_sharded_mesh_fine_tunes_as_one_device(files, tmp_path):
    """A token-classification run over 8 devices as data x fsdp x tensor = 2 x 2 x 2 (weights and the per-token
    head split) logs the metrics of the same run on one device."""
    import subprocess
    import sys

    from train_helpers import REPO, cpu_env

    rng = np.random.default_rng(0)
    train = write_jsonl(tmp_path / "train.jsonl", _tagging(rng, 32))
    validation = write_jsonl(tmp_path / "validation.jsonl", _tagging(rng, 12))
    overrides = ["train.batch_size=8", "train.epochs=1", "eval.every=2", "eval.batch_size=8"]
    finetune(files["model"], task_class("token-classification"), train, validation, tmp_path / "one",
             config("token-classification", *overrides), say=lambda _: None)
    run = subprocess.run([sys.executable, "-m", "bertjax", "finetune", "--model", str(files["model"]), "--task",
                          "token-classification", "--train", str(train), "--validation", str(validation), "--workdir",
                          str(tmp_path / "eight"), *FAST, *overrides, "mesh.data=2", "mesh.fsdp=2", "mesh.tensor=2"],
                         env=cpu_env(devices=8), cwd=REPO, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    one, eight = read_metrics(tmp_path / "one"), read_metrics(tmp_path / "eight")
    assert [(r["step"], r["split"]) for r in eight] == [(r["step"], r["split"]) for r in one] and len(one) == 4
    for a, b in zip(eight, one):
        for key, value in b.items():
            assert a[key] == (value if isinstance(value, str) else pytest.approx(value, abs=1e-6)), (b["step"], key)


def test_packed_rows_predict_what_padded_rows_do(files, full_run):
    """Packing only moves examples into shared rows: every example gets the scores it gets alone."""
    workdir, _ = full_run
    padded = predict(workdir / "best", files["validation"], ["data.max_length=16"])
    packed = predict(workdir / "best", files["validation"], ["data.packing=true", "data.max_length=64"])
    for one, other in zip(padded, packed):
        assert one["label"] == other["label"]
        for name in one["scores"]:
            assert one["scores"][name] == pytest.approx(other["scores"][name], abs=1e-5)


def test_evaluation_runs_without_dropout(files):
    """Real checkpoints load with dropout on (hidden_dropout_prob 0.1); evaluation must switch it off, as
    transformers' Trainer evaluates in eval mode. Every other test model here has dropout_rate=0, so this one
    has 0.3, and the reference is `bertjax predict` on best/, which is deterministic. The validation loss and
    accuracy in the workdir's metrics must be what best/ gives on the validation file. Dropout at evaluation
    would make them noisy and biased, and so best/ and early stopping too."""
    import bertjax
    from bertjax.data.tokenizers import WordPieceTokenizer
    from bertjax.models import MODEL_CLASSES, init_params
    from finetune_helpers import VOCAB

    model_dir = files["root"] / "model-with-dropout"
    model_config = bertjax.get_config("bert-tiny", vocab_size=len(VOCAB), pad_token_id=0, dropout_rate=0.3)
    model = MODEL_CLASSES["masked_lm"](model_config)
    bertjax.save_pretrained(str(model_dir), model, init_params(model, jax.random.key(0)))
    WordPieceTokenizer("\n".join(VOCAB)).save(model_dir)
    workdir = files["root"] / "dropout"
    finetune(model_dir, task_class("sequence-classification"), files["train"], files["validation"], workdir,
             config("sequence-classification", "train.epochs=1"), say=lambda _: None)
    [validation] = [r for r in read_metrics(workdir) if r["split"] == "validation"]
    assert json.loads((workdir / "best" / "config.json").read_text())["hidden_dropout_prob"] == 0.3
    predictions = predict(workdir / "best", files["validation"])
    gold = [json.loads(line)["label"] for line in files["validation"].read_text().splitlines()]
    loss = -np.mean([np.log(p["scores"][g]) for p, g in zip(predictions, gold)])
    assert validation["loss"] == pytest.approx(loss, rel=1e-5)
    assert validation["accuracy"] == pytest.approx(np.mean([p["label"] == g for p, g in zip(predictions, gold)]))


def test_early_stopping_stops_and_stays_stopped(files):
    workdir = files["root"] / "early"
    args = (files["model"], task_class("sequence-classification"), files["train"], files["validation"], workdir,
            config("sequence-classification", "eval.every=4", "train.early_stopping_patience=2"))
    result = finetune(*args, say=lambda _: None)
    validation = [r["accuracy"] for r in read_metrics(workdir) if r["split"] == "validation"]
    best = validation.index(max(validation))
    assert result.results["stopped_early"] and len(validation) == best + 3 and result.final_step < 48
    records = read_metrics(workdir)
    again = finetune(*args, say=lambda _: None)  # rerunning a stopped run trains no further
    assert again.final_step == result.final_step and read_metrics(workdir) == records


def test_a_loss_as_main_metric_is_minimised(files):
    """eval.main_metric=loss keeps the lowest validation loss in best/ and stops when it stops falling, as
    transformers' Trainer does for metric_for_best_model="loss" (it used to keep the highest)."""
    workdir = files["root"] / "by-loss"
    result = finetune(files["model"], task_class("sequence-classification"), files["train"], files["validation"],
                      workdir, config("sequence-classification", "eval.every=4", "eval.main_metric=loss",
                                      "train.early_stopping_patience=2"), say=lambda _: None)
    validation = [r for r in read_metrics(workdir) if r["split"] == "validation"]
    losses = [r["loss"] for r in validation]
    best = losses.index(min(losses))
    assert result.results["best"] == min(losses) and result.results["best_step"] == validation[best]["step"]
    assert losses[0] > min(losses)  # it learned: the first evaluation is not the best
    if result.results["stopped_early"]:
        assert len(validation) == best + 3
    else:
        assert len(validation) - 1 - best < 2


# ---------------------------------------------------------------------------------------------------------------
# Examples longer than data.max_length: counted, and no tag the model never chose.

POSITIONS = 64  # bert-tiny's max_position_embeddings: the most data.max_length may be


def _token_model(path, labels):
    """A randomly initialised token-classification transformers directory (labels from id2label) and its tokenizer."""
    import jax

    import bertjax
    from bertjax.config import TaskConfig
    from bertjax.data.tokenizers import WordPieceTokenizer
    from bertjax.models import MODEL_CLASSES, init_params
    from finetune_helpers import VOCAB

    config = bertjax.get_config("bert-tiny", vocab_size=len(VOCAB), pad_token_id=0, dropout_rate=0.0,
                                task=TaskConfig(num_labels=len(labels), labels=tuple(labels)))
    model = MODEL_CLASSES["token_classification"](config)
    bertjax.save_pretrained(str(path), model, init_params(model, jax.random.key(0)))
    WordPieceTokenizer("\n".join(VOCAB)).save(path)
    return path


def test_token_predict_gives_unseen_words_null_tags_and_counts_cut_sentences(tmp_path, capsys):
    """With data.max_length=8 (6 words): a 10-word sentence's last 4 words get tag and score null (the labels have
    no "O" to make up), a whitespace word (no token) too; only the cut sentence is counted, in one warning line."""
    from bertjax.cli import main

    model = _token_model(tmp_path / "pos", ["NOUN", "VERB", "ADJ"])
    rows = [{"tokens": NEUTRAL},  # 10 words: 6 fit
            {"tokens": ["good", "  ", "day"]},  # a word of whitespace only: no token, no position
            {"tokens": NEUTRAL[:6] + [" "]}]  # exactly full, then a word without tokens: not cut
    source = write_jsonl(tmp_path / "in.jsonl", rows)
    said = []
    records = predict(model, source, ["data.max_length=8"], say=said.append)
    assert [r["tokens"] for r in records] == [r["tokens"] for r in rows]
    first, second, third = records
    assert all(tag in ("NOUN", "VERB", "ADJ") for tag in first["tags"][:6]) and first["tags"][6:] == [None] * 4
    assert all(0 < score <= 1 for score in first["scores"][:6]) and first["scores"][6:] == [None] * 4
    assert second["tags"][1] is None and second["scores"][1] is None and None not in second["tags"][::2]
    assert third["tags"][6] is None and None not in third["tags"][:6]
    assert said == [f"{source}: 1 of 3 examples are longer than data.max_length=8 tokens and were cut; their words "
                    "past the cut were never seen by the model and have tag and score null; pass "
                    f"data.max_length={POSITIONS} (the most the model takes) to see more of them"]

    assert main(["predict", "--model", str(model), "--input", str(source), "--output", str(tmp_path / "out.jsonl"),
                 "data.max_length=8"]) == 0
    assert capsys.readouterr().err == f"warning: {said[0]}\n"
    written = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert written == records  # null in the file, as JSON's null
    predict(model, source, ["data.max_length=16"], say=said.append)
    assert len(said) == 1  # everything fits: no warning


def test_token_metrics_count_unseen_words_as_outside(files):
    """Evaluation on a cut sentence: an entity past the cut is missed (recall 1/2), never matched by a made-up tag."""
    from bertjax.data.tokenizers import load_tokenizer
    from bertjax.finetune.tasks import Labels

    run = config("token-classification", "data.max_length=8")
    task = task_class("token-classification")(run.data, run.task)
    tags = ["B-POS"] + ["O"] * 7 + ["B-POS", "O"]
    encoded = task.encode(load_tokenizer(files["model"]), [{"tokens": NEUTRAL, "tags": tags}], Labels(("O", "B-POS")),
                          "rows", with_targets=True)
    assert encoded.truncated == 1
    logits = np.zeros((1, 8, 2), np.float32)
    logits[0, :, 0] = 1.0  # "O" everywhere ...
    logits[0, 1] = [0.0, 1.0]  # ... but "B-POS" on the first word's token (after [CLS])
    outputs = {"logits": logits}
    assert task.metrics(outputs, encoded, Labels(("O", "B-POS"))) == {"precision": 1.0, "recall": 0.5, "f1": 2 / 3}
    assert task.predictions(outputs, encoded, Labels(("O", "B-POS")))[0]["tags"] == ["B-POS"] + ["O"] * 5 + [None] * 4


def test_sequence_predict_counts_cut_examples(files, full_run):
    """best/ keeps data.max_length=16: a 14-word text fits exactly (not counted), a 15-word one and a 10 + 10 word
    pair are cut; with data.max_length=64 nothing is."""
    workdir, _ = full_run
    words = (NEUTRAL + POSITIVE) * 2
    source = write_jsonl(files["root"] / "long.jsonl", [
        {"text": " ".join(words[:14])}, {"text": " ".join(words[:15])}, {"text": "good day"},
        {"text": " ".join(words[:10]), "text_pair": " ".join(words[:10])}])
    said = []
    records = predict(workdir / "best", source, say=said.append)
    assert len(records) == 4 and all(r["label"] in ("positive", "negative") for r in records)
    pair_note = (f"{source}: 1 of 4 rows have a second text (column 'text_pair'), but the model was trained on "
                 "single texts: they are read as pairs")  # best/ was trained on single texts
    assert said == [pair_note, f"{source}: 2 of 4 examples are longer than data.max_length=16 tokens and were cut; "
                    "each is predicted from the tokens that fit (the longer text of a pair is cut first); pass "
                    f"data.max_length={POSITIONS} (the most the model takes) to see more of them"]
    predict(workdir / "best", source, ["data.max_length=64"], say=said.append)
    assert said[2:] == [pair_note]


def test_a_diverging_run_stops_before_saving_or_skips_the_updates(files, caplog):
    """A non-finite loss or gradient norm: train.nonfinite=stop (default) stops with an error before best/ or a
    checkpoint holds the diverged weights; skip keeps the weights of the last finite update and trains on."""
    from bertjax.train.guards import NonFiniteError

    diverging = ("train.learning_rate=1e38", "train.max_grad_norm=null", "train.warmup_ratio=0", "eval.every=2",
                 "train.epochs=1")
    workdir = files["root"] / "diverged"
    with pytest.raises(NonFiniteError, match=r"step \d+: non-finite .*Lower train.learning_rate, set "
                                             r"train.max_grad_norm"):
        finetune(files["model"], task_class("sequence-classification"), files["train"], files["validation"],
                 workdir, config("sequence-classification", *diverging), say=lambda _: None)
    assert not (workdir / "best").exists()
    assert not (workdir / "results.json").exists()

    skipping = files["root"] / "skipped"
    with caplog.at_level("WARNING", logger="bertjax.train.guards"):
        result = finetune(files["model"], task_class("sequence-classification"), files["train"], files["validation"],
                          skipping, config("sequence-classification", *diverging, "train.nonfinite=skip"),
                          say=lambda _: None, stop_after=6)
    skipped = [r for r in caplog.records if "update skipped" in r.getMessage()]
    assert result.final_step == 6 and skipped
    assert all(np.isfinite(np.asarray(leaf)).all() for leaf in jax.tree.leaves(result.params))
    losses = [r["loss"] for r in read_metrics(skipping) if r["split"] == "train"]
    assert all(np.isfinite(losses))  # the skipped steps' losses are left out of the reported mean


def test_a_bfloat16_model_directory_trains_float32_master_weights(files, tmp_path):
    """`convert --from-hf --dtype bfloat16` stores bfloat16 parameters; fine-tuning from it kept them as the
    optimizer's weights, and at 2e-5 about 92% of the backbone never moved (updates below bfloat16's spacing)."""
    from bertjax.cli import main

    stored = tmp_path / "bf16"
    assert main(["convert", "--from-hf", str(files["model"]), "--out", str(stored), "--dtype", "bfloat16"]) == 0
    result = finetune(stored, task_class("sequence-classification"), files["train"], files["validation"],
                      tmp_path / "run", config("sequence-classification", "train.epochs=1"), say=lambda _: None,
                      stop_after=1)
    assert {np.asarray(leaf).dtype for leaf in jax.tree.leaves(result.params)} == {np.dtype("float32")}
    assert result.model.config.dtype == "bfloat16"  # the directory's compute dtype is kept


def test_a_longformer_trains_with_the_global_token_bound_of_its_data(files, tmp_path, monkeypatch):
    """Under jit a traced global mask without a bound makes every position a global slot ([seq, seq]); fine-tuning
    knows its rows before the steps compile, so its steps carry their most global tokens (1 per unpacked row)."""
    from bertjax.finetune import trainer

    model_dir = tiny_model_dir(tmp_path / "longformer", "longformer-tiny", position_offset=1)  # padding id 0
    seen = {}

    class Stop(Exception):
        pass

    def capture(task, model, *args, **kwargs):
        seen["config"] = model.config
        raise Stop

    monkeypatch.setattr(trainer, "make_steps", capture)
    task = task_class("sequence-classification")
    config = load_finetune_config(None, ["data.max_length=16"], task.defaults)
    with pytest.raises(Stop):
        finetune(model_dir, task, files["train"], files["validation"], tmp_path / "run", config, say=lambda _: None)
    assert seen["config"].longformer.max_global_tokens == 1


def test_predict_runs_a_longformer_with_the_global_token_bound_of_its_input(tmp_path, monkeypatch):
    """QA puts the question (and <s>) in global attention: `predict` gives its program the most a row has."""
    import bertjax
    from bertjax.data.tokenizers import WordPieceTokenizer
    from bertjax.finetune import inference
    from finetune_helpers import VOCAB

    mlm_dir = tiny_model_dir(tmp_path / "mlm", "longformer-tiny", position_offset=1,  # padding id 0
                             longformer={"sep_token_id": VOCAB.index("[SEP]")})
    model, params = bertjax.from_pretrained(str(mlm_dir), head="question_answering")
    bertjax.save_pretrained(str(tmp_path / "qa"), model, params)
    WordPieceTokenizer("\n".join(VOCAB)).save(tmp_path / "qa")
    rows = _questions(np.random.default_rng(0), 4)
    rows[2]["question"] = "who is it and where is it ?"  # 8 words, each a token: <s> + 8 are global
    seen = {}

    class Stop(Exception):
        pass

    def capture(model, *args, **kwargs):
        seen["config"] = model.config
        raise Stop

    monkeypatch.setattr(inference, "predict_outputs", capture)
    with pytest.raises(Stop):
        predict(tmp_path / "qa", write_jsonl(tmp_path / "questions.jsonl", rows))
    assert seen["config"].longformer.max_global_tokens == 9
