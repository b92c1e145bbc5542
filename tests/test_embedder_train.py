"""`bertjax train-embedder` end to end on a tiny model (falling loss, resume, a sentence-transformers model at the
end), and clear errors for bad pairs files and settings."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from finetune_helpers import NEUTRAL, tiny_model_dir, write_jsonl

from bertjax.embeddings.pairs import read_pairs
from bertjax.embeddings.train_config import EmbedderDataConfig, embedder_config_from_dict, load_embedder_config
from bertjax.train.run_config import ConfigError

CUES = ["good", "great", "fine", "nice", "happy", "warm", "bright", "kind", "bad", "poor", "sad", "cold", "dark",
        "rude", "grim", "dull", "paris", "france"]


def cue_pairs(count: int, seed: int, negatives: int = 0) -> list[dict]:
    """The anchor and its positive share two cue words among neutral ones; each hard negative has other cues (one:
    column "negative"; more: sentence-transformers' n-tuple columns negative_1 ... negative_n)."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(count):
        cues = list(rng.choice(CUES, size=2, replace=False))
        sentence = lambda words: " ".join(rng.permutation(words + list(rng.choice(NEUTRAL, 3))))  # noqa: E731
        row = {"anchor": sentence(cues), "positive": sentence(cues)}
        for n in range(negatives):
            other = sentence(list(rng.choice([c for c in CUES if c not in cues], size=2, replace=False)))
            row["negative" if negatives == 1 else f"negative_{n + 1}"] = other
        rows.append(row)
    return rows


RAW = {"train": {"batch_size": 8, "mini_batch_size": 4, "learning_rate": 2e-3, "warmup_ratio": 0.0, "steps": 12,
                 "log_every": 2, "progress_bar": False},
       "data": {"max_length": 16},
       "eval": {"every": 6, "k": 3, "batch_size": 16},
       "checkpoint": {"every": 6, "async_save": False}}
UNIQUE = {**RAW, "train": {**RAW["train"], "batch_sampler": "no_duplicates"}}  # sentence-transformers' advice


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("embedder")
    model = tiny_model_dir(root / "model")
    train = write_jsonl(root / "train.jsonl", cue_pairs(48, 0, negatives=2))  # an n-tuple file
    validation = write_jsonl(root / "validation.jsonl", cue_pairs(24, 1, negatives=1))
    return root, model, train, validation


def test_train_resume_and_model_dir(files, capsys, caplog):
    """6 steps in Python, stopped (as a kill after a checkpoint), then the same run through the command: it resumes
    at 6 and ends with the loss down, retrieval measured before, during and after, and a sentence-transformers
    directory holding the trained parameters."""
    import jax
    import yaml

    from bertjax.cli import main
    from bertjax.embeddings import load_sentence_encoder
    from bertjax.embeddings.training import train_embedder
    from bertjax.train.checkpoints import restore_params
    from bertjax.train.metrics import read_metrics

    root, model, train, validation = files
    workdir = root / "run"
    config = embedder_config_from_dict(UNIQUE)
    first = train_embedder(config, workdir, model, train, validation, stop_after=6)
    assert (first.start_step, first.final_step, first.model_dir) == (0, 6, None)
    with pytest.raises(FileNotFoundError, match="train-embedder workdir whose run has not finished"):
        load_sentence_encoder(workdir)
    # As an older bertjax wrote it, before train.nonfinite and loss.similarity: each resumes as its default.
    held = yaml.safe_load((workdir / "config.yaml").read_text())
    del held["train"]["nonfinite"], held["loss"]["similarity"]
    (workdir / "config.yaml").write_text(yaml.safe_dump(held))
    config_file = root / "run.yaml"
    config_file.write_text(yaml.safe_dump(UNIQUE))
    code = main(["train-embedder", "--model", str(model), "--train", str(train), "--validation", str(validation),
                 "--workdir", str(workdir), "--config", str(config_file)])
    assert code == 0
    out = capsys.readouterr().out
    assert "steps 6 -> 12 of 12" in out and "recall@3 on the validation pairs:" in out, out
    assert "48 pairs with 2 hard negatives each" in out, out  # the n-tuple file's negative_1 and negative_2
    assert "written by an older bertjax, before loss.similarity, train.nonfinite: each takes its default" in caplog.text
    assert f"sentence-transformers model in {workdir / 'model'}" in out

    records = read_metrics(workdir)
    losses = [r["loss"] for r in records if "loss" in r]
    assert [r["step"] for r in records if "loss" in r] == [2, 4, 6, 8, 10, 12]  # nothing logged twice
    assert losses[-1] < 0.7 * losses[0], losses
    evals = [r for r in records if "eval_recall@3" in r]
    assert [r["step"] for r in evals] == [0, 6, 12]
    assert evals[-1]["eval_mrr@3"] > evals[0]["eval_mrr@3"], evals
    for name in ("config.yaml", "loss.png", "train_embedder.json", "tensorboard", "checkpoints/12"):
        assert (workdir / name).exists(), name

    # model/: a sentence-transformers directory holding the parameters of the last checkpoint.
    assert json.loads((workdir / "model" / "modules.json").read_text())[1]["type"].endswith("Pooling")
    loaded = load_sentence_encoder(workdir / "model")
    trained = restore_params(workdir / "checkpoints" / "12")
    differences = jax.tree.map(lambda a, b: float(np.max(np.abs(np.asarray(a) - np.asarray(b)))), loaded.params,
                               {k: trained[k] for k in loaded.params})
    assert max(jax.tree.leaves(differences)) <= 1e-6
    texts = ["good day", "the cold night"]
    assert np.max(np.abs(load_sentence_encoder(model).encode(texts) - loaded.encode(texts))) > 1e-3  # it trained
    np.testing.assert_array_equal(load_sentence_encoder(workdir).encode(texts), loaded.encode(texts))  # the workdir
    sentence_transformers = pytest.importorskip("sentence_transformers")
    reference = sentence_transformers.SentenceTransformer(str(workdir / "model"), device="cpu")
    np.testing.assert_allclose(reference.encode(texts + [""]), loaded.encode(texts + [""]), atol=1e-5)

    # Rerunning the finished run reports the retrieval after training from metrics.jsonl (it trains nothing).
    assert main(["train-embedder", "--model", str(model), "--train", str(train), "--validation", str(validation),
                 "--workdir", str(workdir), "--config", str(config_file)]) == 0
    out = capsys.readouterr().out
    assert "steps 12 -> 12 of 12" in out and " before, " in out and "- after" not in out, out

    # checkpoint.restore_step resumes from an earlier checkpoint, as in pretraining, and repeats the later steps.
    rewind = {**UNIQUE, "checkpoint": {**RAW["checkpoint"], "restore_step": 6}}
    rewound = train_embedder(embedder_config_from_dict(rewind),
                             workdir, model, train, validation)
    assert (rewound.start_step, rewound.final_step) == (6, 12)
    assert [r["loss"] for r in read_metrics(workdir) if "loss" in r] == losses
    # It went back once: config.yaml records no restore_step, so rerunning that file resumes from the latest step.
    import yaml
    recorded = yaml.safe_load((workdir / "config.yaml").read_text())
    assert recorded["checkpoint"]["restore_step"] is None
    again = train_embedder(embedder_config_from_dict(recorded), workdir, model, train, validation)
    assert (again.start_step, again.final_step) == (12, 12)

    # Resuming with another loss is refused, naming the key.
    changed = embedder_config_from_dict({**UNIQUE, "loss": {"symmetric": True}})
    with pytest.raises(ConfigError, match="loss.symmetric"):
        train_embedder(changed, workdir, model, train, validation)


# ---------------------------------------------------------------------------------------------------------------
# Bad input.

def test_pairs_file_errors(tmp_path):
    data = EmbedderDataConfig()
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(ValueError, match="empty.jsonl: the file is empty"):
        read_pairs(empty, data)
    header_only = tmp_path / "header.csv"
    header_only.write_text("anchor,positive\n")
    with pytest.raises(ValueError, match="no examples"):
        read_pairs(header_only, data)
    missing = write_jsonl(tmp_path / "missing.jsonl", [{"anchor": "a", "text": "b"}])
    with pytest.raises(ValueError, match=r"no column 'positive'.*data.positive_column=NAME"):
        read_pairs(missing, data)
    some_negatives = write_jsonl(tmp_path / "some.jsonl", [{"anchor": "a", "positive": "b", "negative": "c"},
                                                           {"anchor": "d", "positive": "e"}])
    with pytest.raises(ValueError, match=r"row 2: no column 'negative'"):
        read_pairs(some_negatives, data)
    not_text = write_jsonl(tmp_path / "number.jsonl", [{"anchor": "a", "positive": 3}])
    with pytest.raises(ValueError, match=r"row 1: column 'positive' .* must hold text, got int"):
        read_pairs(not_text, data)
    short_row = tmp_path / "short.csv"
    short_row.write_text("anchor,positive\nq,d\nonly anchor\n")
    with pytest.raises(ValueError, match=r"row 2: no value in column 'positive'"):
        read_pairs(short_row, data)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_pairs(tmp_path / "absent.jsonl", data)
    csv = tmp_path / "ok.csv"
    csv.write_text('query,doc\n"a, b",c\n')
    pairs = read_pairs(csv, EmbedderDataConfig(anchor_column="query", positive_column="doc"))
    assert (pairs.anchors, pairs.positives, pairs.negatives) == (["a, b"], ["c"], None)
    # sentence-transformers' n-tuples (mine_hard_negatives): every numbered negative is read, in numeric order.
    tuples = write_jsonl(tmp_path / "tuples.jsonl", [{"anchor": "a", "positive": "b", "negative_2": "d",
                                                      "negative_10": "e", "negative_1": "c"}])
    pairs = read_pairs(tuples, data)
    assert pairs.negatives == (["c"], ["d"], ["e"]) and pairs.columns == [["a"], ["b"], ["c"], ["d"], ["e"]]
    listed = EmbedderDataConfig(negative_column=("negative_10", "negative_1", "negative_2"))
    assert read_pairs(tuples, listed).negatives == (["e"], ["c"], ["d"])
    with pytest.raises(ValueError, match=r"columns \['negative_2', 'negative_10'\] look like hard negatives.*"
                                         r"data.negative_column=\[negative_1, negative_2, negative_10\]"):
        read_pairs(tuples, EmbedderDataConfig(negative_column="negative_1"))  # one of three: two dropped
    with pytest.raises(ValueError, match=r"no column 'neg' \(data.negative_column\[1\]\)"):
        read_pairs(tuples, EmbedderDataConfig(negative_column=("negative_1", "neg", "negative_2", "negative_10")))
    ragged = write_jsonl(tmp_path / "ragged.jsonl", [{"anchor": "a", "positive": "b"},
                                                     {"anchor": "c", "positive": "d", "negative_1": "e"}])
    with pytest.raises(ValueError, match=r"row 1: no column 'negative_1' \(data.negative_column\), which 1 other"):
        read_pairs(ragged, data)
    both = write_jsonl(tmp_path / "both.jsonl", [{"anchor": "a", "positive": "b", "negative": "c", "negative_1": "d"}])
    with pytest.raises(ValueError, match=r"columns \['negative_1'\] look like hard negatives"):
        read_pairs(both, data)
    with pytest.raises(ConfigError, match="data.negative_column must name at least one column"):
        load_embedder_config(None, ["data.negative_column=[]"])
    with pytest.raises(ConfigError, match="must differ"):
        load_embedder_config(None, ["data.negative_column=[negative_1, anchor]"])
    assert load_embedder_config(None, ["data.negative_column=[n1, n2]"]).data.negative_column == ("n1", "n2")


def test_config_errors(tmp_path, files):
    with pytest.raises(ConfigError, match="train.mini_batch_size .* must divide train.batch_size"):
        load_embedder_config(None, ["train.batch_size=64", "train.mini_batch_size=48"])
    with pytest.raises(ConfigError, match="unknown key loss.temperature"):
        load_embedder_config(None, ["loss.temperature=0.05"])
    with pytest.raises(ConfigError, match="train.batch_size must be at least 2"):
        load_embedder_config(None, ["train.batch_size=1"])
    from bertjax.embeddings.training import train_embedder

    root, model, train, _ = files
    config = embedder_config_from_dict({**RAW, "train": {**RAW["train"], "batch_size": 64, "mini_batch_size": None}})
    with pytest.raises(ValueError, match="48 pairs, fewer than train.batch_size"):
        train_embedder(config, tmp_path / "w", model, train)
    assert not (tmp_path / "w").exists()  # a failed setup leaves no half-made workdir


def test_workdir_problems_are_named_and_a_run_without_checkpoint_starts_over(tmp_path, files, caplog):
    """A damaged record of the run is named as such (with a checkpoint to resume, the records matter); without a
    checkpoint (a run that failed before its first save) any setting may change and the run starts over; the same
    file spelled another way is the same run; a --workdir that is a file and a data.max_length over the model's
    positions are config errors naming them."""
    from bertjax.embeddings.train_config import save_embedder_config
    from bertjax.embeddings.training import RUN_FILE, _identity, check_rerun, load_encoder, train_embedder
    from bertjax.train.workdir import CONFIG_FILE

    root, model, train, _ = files
    config = embedder_config_from_dict(RAW)
    save_embedder_config(config, tmp_path / CONFIG_FILE)
    (tmp_path / RUN_FILE).write_text(json.dumps(_identity(model, train, None)))
    changed = embedder_config_from_dict({**RAW, "loss": {"scale": 5.0}})  # loss settings are fixed on resume
    with pytest.raises(ConfigError, match="holds a run with other settings"):
        check_rerun(tmp_path, changed, _identity(model, train, None), resumable=True, drops_out=False)
    # Nothing to resume:
    check_rerun(tmp_path, changed, _identity(model, train, None), resumable=False, drops_out=False)
    assert "holds no checkpoint of its earlier run: starting over" in caplog.text
    # The same training file through "..": the same run.
    respelled = train.parent / ".." / train.parent.name / train.name
    check_rerun(tmp_path, config, _identity(model, respelled, None), resumable=True, drops_out=False)

    (tmp_path / CONFIG_FILE).write_text("train: [unclosed\n")
    with pytest.raises(ConfigError, match=f"{CONFIG_FILE} is not valid YAML .*damaged"):
        check_rerun(tmp_path, config, _identity(model, train, None), resumable=True, drops_out=False)
    (tmp_path / RUN_FILE).write_text("{\n")
    with pytest.raises(ConfigError, match=f"{RUN_FILE} is not valid JSON .*damaged"):
        check_rerun(tmp_path, config, _identity(model, train, None), resumable=True, drops_out=False)

    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    with pytest.raises(ConfigError, match="--workdir .*a_file is a file, not a directory"):
        train_embedder(config, a_file, model, train)
    with pytest.raises(ConfigError, match=r"data.max_length must be in \[2, \d+\] \(the positions of"):
        load_encoder(model, embedder_config_from_dict({**RAW, "data": {"max_length": 100_000}}))


@pytest.mark.parametrize("name, value, held", [("seed", 5, "0"), ("batch_size", 16, "8"),
                                               ("learning_rate", 1e-3, "0.002"), ("warmup_ratio", 0.5, "0.0"),
                                               ("weight_decay", 0.0, "0.01"), ("max_grad_norm", 2.0, "1.0"),
                                               ("batch_sampler", "no_duplicates", "'random'")])
def test_a_resume_refuses_what_decides_the_pairs_or_the_optimizers_trajectory(tmp_path, name, value, held):
    """As fine-tuning does: the key named with the workdir's value and the requested one, whatever the dropout."""
    from bertjax.embeddings.train_config import save_embedder_config
    from bertjax.embeddings.training import check_rerun

    save_embedder_config(embedder_config_from_dict(RAW), tmp_path / "config.yaml")
    changed = embedder_config_from_dict({**RAW, "train": {**RAW["train"], name: value}})
    for drops_out in (False, True):
        shown = repr(value) if isinstance(value, str) else value
        with pytest.raises(ConfigError, match=rf"other settings \(train.{name}: {held} in the workdir, {shown} "
                                              r"requested\); only train.epochs, train.steps"):
            check_rerun(tmp_path, changed, {}, resumable=True, drops_out=drops_out)


def test_a_resume_may_run_longer_and_change_the_chunking_only_without_dropout(tmp_path, caplog):
    """More epochs or steps, logging, evaluation and checkpointing are listed in a warning; train.mini_batch_size
    (GradCache's chunks, which draw their own dropout masks) only when the model has no dropout."""
    from bertjax.embeddings.train_config import save_embedder_config
    from bertjax.embeddings.training import check_rerun

    save_embedder_config(embedder_config_from_dict(RAW), tmp_path / "config.yaml")
    longer = embedder_config_from_dict({**RAW, "train": {**RAW["train"], "steps": 24, "epochs": 3, "log_every": 1},
                                        "eval": {**RAW["eval"], "every": 3}, "checkpoint": {"every": 3}})
    check_rerun(tmp_path, longer, {}, resumable=True, drops_out=True)
    assert "train.steps: 12 in the workdir, 24 requested" in caplog.text
    chunked = embedder_config_from_dict({**RAW, "train": {**RAW["train"], "mini_batch_size": 8}})
    check_rerun(tmp_path, chunked, {}, resumable=True, drops_out=False)
    with pytest.raises(ConfigError, match=r"train.mini_batch_size: 4 in the workdir, 8 requested"):
        check_rerun(tmp_path, chunked, {}, resumable=True, drops_out=True)


def test_a_stopped_run_of_a_dropout_model_refuses_a_changed_chunking_seed_or_train_file(tmp_path):
    """End to end (a checkpoint at step 2): the model's own dropout decides whether train.mini_batch_size may
    change, and a train file rewritten at the same path is refused naming it, before anything is written."""
    from bertjax.embeddings.training import RUN_FILE, train_embedder

    model = tiny_model_dir(tmp_path / "model", dropout_rate=0.1)
    train = write_jsonl(tmp_path / "train.jsonl", cue_pairs(16, 0))
    raw = {**RAW, "train": {**RAW["train"], "steps": 4}, "checkpoint": {"every": 2, "async_save": False}}
    workdir = tmp_path / "run"
    train_embedder(embedder_config_from_dict(raw), workdir, model, train, stop_after=2)
    record = (workdir / RUN_FILE).read_text()
    for name, held, requested in (("mini_batch_size", 4, 8), ("seed", 0, 3)):
        changed = embedder_config_from_dict({**raw, "train": {**raw["train"], name: requested}})
        with pytest.raises(ConfigError, match=f"train.{name}: {held} in the workdir, {requested} requested"):
            train_embedder(changed, workdir, model, train)
    write_jsonl(train, cue_pairs(16, 7))  # regenerated at the same path
    with pytest.raises(ConfigError, match=rf"another content of its train file {train} \(\d+ bytes, sha256 "):
        train_embedder(embedder_config_from_dict(raw), workdir, model, train)
    assert (workdir / RUN_FILE).read_text() == record


def test_trained_model_carries_its_similarity_and_prompts(files, tmp_path):
    """A run with loss.similarity=dot and prompt texts saves a model that says so: sentence-transformers'
    similarity_fn_name, and the texts as its "query" and "document" prompts (a prompt given by name stays as is)."""
    from bertjax.embeddings import load_sentence_encoder, save_sentence_encoder
    from bertjax.embeddings.training import load_encoder

    _, model, _, _ = files
    raw = {**RAW, "loss": {"similarity": "dot"}, "data": {**RAW["data"], "anchor_prompt": "query: ",
                                                          "positive_prompt": "passage: "}}
    encoder = load_encoder(model, embedder_config_from_dict(raw))
    assert (encoder.similarity_fn_name, encoder.prompts) == ("dot", {"query": "query: ", "document": "passage: "})
    save_sentence_encoder(encoder, tmp_path / "saved")
    saved = load_sentence_encoder(tmp_path / "saved")
    assert (saved.similarity_fn_name, saved.prompts) == ("dot", {"query": "query: ", "document": "passage: "})
    by_name = load_encoder(tmp_path / "saved", embedder_config_from_dict({**raw, "data": {
        **raw["data"], "anchor_prompt": "query", "positive_prompt": None}}))
    assert by_name.prompts == {"query": "query: ", "document": "passage: "}


def test_summary_dates_an_evaluation_older_than_the_last_step(monkeypatch, capsys, tmp_path):
    """A run stopped between evaluations (Ctrl-C at step 159, last evaluation at 150) prints that evaluation with
    its step, not as the result after training."""
    from bertjax.cli import main
    from bertjax.embeddings import training

    def stopped(*args, **kwargs):
        return training.EmbedderResult(workdir=tmp_path, start_step=0, final_step=159, total_steps=200,
                                       preempted=True, eval_start={"eval_mrr@10": 0.5},
                                       eval_end={"eval_mrr@10": 0.9}, seconds=1.0, encoder=None, model_dir=None,
                                       eval_end_step=150)

    monkeypatch.setattr(training, "train_embedder", stopped)
    assert main(["train-embedder", "--model", "m", "--train", "t.jsonl", "--workdir", str(tmp_path)]) == 0
    assert "mrr@10 on the validation pairs: 0.5000 before, 0.9000 at step 150 (the latest evaluation)" in \
        capsys.readouterr().out


def test_nonfinite_advice_names_the_run_types_keys():
    """The embedder's non-finite stop names its own keys (train.*), not pretraining's optimizer.* ones."""
    from bertjax.train.optimizers import TRAINER_OPTIMIZER_KEYS
    from bertjax.train.guards import NonFiniteError, NonFiniteGuard

    for keys, rate, clip in ((None, "optimizer.learning_rate", "optimizer.clip_global_norm"),
                             (TRAINER_OPTIMIZER_KEYS, "train.learning_rate", "train.max_grad_norm")):
        guard = NonFiniteGuard("stop", keys=keys)
        guard.observe(1, {"loss": float("nan"), "grad_norm": 1.0})
        with pytest.raises(NonFiniteError, match=f"Lower {rate}, set {clip}, or skip"):
            guard.check(None)


def test_demo_pairs_and_shipped_configs(tmp_path):
    from bertjax.embeddings.demo_pairs import split_docstring, write_pairs

    doc = "Return the number of items.\n\nThe count is approximate when other threads add or remove items at the " \
          "same time, so do not rely on it."
    assert split_docstring(doc) == ("Return the number of items.", doc.split("\n\n", 1)[1])
    assert split_docstring("One line only, no body at all here.") is None
    assert split_docstring("Two\nline summary.\n\n" + "word " * 20) is None
    twice = "Return self, the same text.\n\n" + "another body with enough words " * 3
    counts = write_pairs(tmp_path, [doc, twice, twice.replace("another", "a second")])
    assert sum(counts.values()) == 1  # the summary that occurs twice has no single answer: dropped
    rows = [json.loads(line) for split in ("train", "validation") for line in
            (tmp_path / f"{split}.jsonl").read_text().splitlines()]
    assert rows == [{"anchor": "Return the number of items.", "positive": doc.split("\n\n", 1)[1]}]
    repo = Path(__file__).resolve().parents[1]
    for path in sorted((repo / "configs" / "embedder").glob("*.yaml")):
        load_embedder_config(path)
    assert load_embedder_config(repo / "configs" / "embedder" / "contrastive.yaml") == load_embedder_config(None)


def test_evaluation_embeddings_equal_encode_with_prompts(files):
    """The jitted embedding the evaluation uses gives SentenceEncoder.encode's vectors, prompt left out of
    pooling included."""
    import optax

    from bertjax.embeddings.training import embed_texts, load_encoder, make_steps
    from bertjax.train import mesh as mesh_lib
    from bertjax.train.run_config import MeshConfig
    from bertjax.train.state import boxed_initialiser, state_shardings

    _, model, _, _ = files
    config = embedder_config_from_dict({"data": {"max_length": 16}})
    encoder = load_encoder(model, config)
    encoder = encoder.replace(pooling=encoder.pooling.replace(include_prompt=False, normalize=True))
    mesh = mesh_lib.build_mesh(MeshConfig())
    optimizer = optax.sgd(0.1)
    _, shardings = state_shardings(boxed_initialiser(encoder.model), optimizer, mesh)
    _, embed_step = make_steps(encoder.model, optimizer, lambda step: 0.1, mesh, shardings, config,
                               np.zeros(2, np.int32))
    texts = ["good day", "", "the cold dark night was grim and dull"]
    got = embed_texts(embed_step, encoder.params, encoder, texts, "who : ", 4, mesh)
    np.testing.assert_allclose(got, encoder.encode(texts, prompt="who : "), atol=1e-5)


def test_a_users_config_and_another_kind_of_run_are_refused_before_anything_is_written(tmp_path, files):
    """A config.yaml the user keeps in the workdir would be replaced by the resolved config; a pretraining
    workdir holds another kind of run. Both are refused with the workdir left byte for byte."""
    from bertjax.embeddings.training import train_embedder

    root, model, train, _ = files
    config = embedder_config_from_dict(RAW)
    exp = tmp_path / "exp"
    exp.mkdir()
    (exp / "config.yaml").write_text("# my settings\ntrain:\n  epochs: 5\n")
    before = (exp / "config.yaml").read_bytes()
    with pytest.raises(ConfigError, match=r"--config .*config.yaml is the file bertjax writes its resolved config to"):
        train_embedder(config, exp, model, train, config_path=exp / "config.yaml")
    with pytest.raises(ConfigError, match="was not written by bertjax"):
        train_embedder(config, exp, model, train)
    assert (exp / "config.yaml").read_bytes() == before and [p.name for p in exp.iterdir()] == ["config.yaml"]
    pretraining = tmp_path / "pretraining"
    pretraining.mkdir()
    (pretraining / "model_config.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"holds a run of `bertjax pretrain` \(model_config.json\), not one of "
                                          r"`bertjax train-embedder`"):
        train_embedder(config, pretraining, model, train)
    assert [p.name for p in pretraining.iterdir()] == ["model_config.json"]


def test_a_bfloat16_model_directory_trains_in_float32(files, tmp_path):
    """A directory stored in bfloat16 (`convert --dtype bfloat16`) is trained with float32 parameters and compute:
    bfloat16 master weights rounded away most updates at 5e-5."""
    from bertjax.cli import main
    from bertjax.embeddings.training import load_encoder

    _, model, _, _ = files
    stored = tmp_path / "bf16"
    assert main(["convert", "--from-hf", str(model), "--out", str(stored), "--dtype", "bfloat16"]) == 0
    encoder = load_encoder(stored, embedder_config_from_dict(RAW))
    assert (encoder.config.dtype, encoder.config.param_dtype) == ("float32", "float32")
