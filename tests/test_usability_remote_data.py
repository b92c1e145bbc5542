"""Data on buckets (issue 14, point 5): `bertjax prepare --out gs://...` and `data.input: gs://...` go through
etils.epath, tested on an in-memory filesystem that stands for a bucket (no bucket is reachable here)."""

from __future__ import annotations

import importlib
import importlib.util
import json

import numpy as np
import pytest
from etils import epath
from etils.epath import backend as epath_backend
from fsspec.implementations.memory import MemoryFileSystem

from bertjax.cli import main
from bertjax.data import default_corpus_documents, load_tokenizer, open_documents
from bertjax.train.run_config import run_config_from_dict
from train_helpers import TINY_RUN


class FakeBucket(MemoryFileSystem):
    """fsspec's in-memory filesystem answering for gs:// (a store of its own, not the shared memory:// one)."""

    protocol = ("gs", "gcs")
    store: dict = {}
    pseudo_dirs = [""]
    root_marker = ""

    @classmethod
    def _strip_protocol(cls, path):
        path = str(path)
        for prefix in ("gs://", "gcs://"):
            path = path.removeprefix(prefix)
        return path.strip("/")


@pytest.fixture(scope="module")
def bucket(tmp_path_factory):
    fs = FakeBucket()
    fs.store.clear()
    patch = pytest.MonkeyPatch()
    # epath reaches gs:// through fsspec (without TensorFlow installed): hand it the fake filesystem instead of gcsfs.
    patch.setattr(epath_backend._FileSystemSpecBackend, "_get_filesystem", lambda self, name: fs)
    # and to the check that gcsfs is installed (bertjax.data.remote.require_filesystem)
    patch.setitem(importlib.import_module("fsspec.registry")._registry, "gs", FakeBucket)
    patch.setenv("BERTJAX_CACHE_DIR", str(tmp_path_factory.mktemp("remote_cache")))
    documents = default_corpus_documents("all")[:200]
    for part in range(2):
        path = epath.Path(f"gs://bucket/corpus/part-{part}.txt")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(documents[part::2]) + "\n")
    yield fs
    patch.undo()


@pytest.fixture(scope="module")
def prepared(bucket):
    assert main(["prepare", "--input", "gs://bucket/corpus", "--train-tokenizer", "--vocab-size", "600",
                 "--out", "gs://bucket/prepared", "--eval-fraction", "0.1"]) == 0
    return "gs://bucket/prepared"


def test_prepare_writes_to_the_bucket(bucket, prepared):
    root = epath.Path(prepared)
    metadata = json.loads((root / "metadata.json").read_text())
    for name in metadata["splits"]["train"]["files"] + metadata["splits"]["eval"]["files"]:
        assert (root / name).is_file()
    assert (root / "tokenizer" / "tokenizer.model").is_file()
    documents = metadata["splits"]["train"]["documents"] + metadata["splits"]["eval"]["documents"]
    assert documents == len(open_documents("gs://bucket/corpus", split="all"))
    # a second prepare into the same bucket directory is refused, as on a local disk
    assert main(["prepare", "--input", "gs://bucket/corpus", "--tokenizer", str(_local_tokenizer(prepared)),
                 "--out", prepared]) == 2


def test_an_overwrite_in_the_bucket_leaves_no_old_tokenizer(bucket, prepared, tmp_path):
    """`prepare --overwrite` into a bucket directory prepared with a SentencePiece tokenizer, now with a WordPiece
    one: the old tokenizer.model is gone from the bucket (load_tokenizer would prefer it over the new vocab.txt)."""
    from tokenizers import BertWordPieceTokenizer

    from bertjax.data.tokenizers import WordPieceTokenizer

    out = "gs://bucket/prepared-twice"
    assert main(["prepare", "--input", "gs://bucket/corpus", "--tokenizer", str(_local_tokenizer(prepared)),
                 "--out", out]) == 0
    assert (epath.Path(out) / "tokenizer" / "tokenizer.model").is_file()
    trained = BertWordPieceTokenizer(lowercase=True)
    trained.train_from_iterator(default_corpus_documents("all")[:200], vocab_size=300,
                                special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    vocab = trained.get_vocab()
    WordPieceTokenizer("\n".join(sorted(vocab, key=vocab.get)) + "\n", lowercase=True).save(tmp_path / "wordpiece")
    assert main(["prepare", "--input", "gs://bucket/corpus", "--tokenizer", str(tmp_path / "wordpiece"),
                 "--out", out, "--overwrite"]) == 0
    assert sorted(p.name for p in (epath.Path(out) / "tokenizer").iterdir()) == ["tokenizer_config.json",
                                                                                  "vocab.txt"]
    assert load_tokenizer(_local_tokenizer(out)).kind == "wordpiece"


def _local_tokenizer(prepared: str):
    from bertjax.data.sources import prepared_directory
    return prepared_directory(prepared) / "tokenizer"


def test_remote_inputs_read_like_local_ones(bucket, prepared, tmp_path):
    local = tmp_path / "corpus"
    local.mkdir()
    for part in range(2):
        (local / f"part-{part}.txt").write_text(epath.Path(f"gs://bucket/corpus/part-{part}.txt").read_text())
    for remote_spec, local_spec in (("gs://bucket/corpus", str(local)), ("gs://bucket/corpus/*.txt",
                                                                          str(local / "*.txt")),
                                    ("gs://bucket/corpus/part-1.txt", str(local / "part-1.txt"))):
        remote_docs, local_docs = open_documents(remote_spec), open_documents(local_spec)
        assert [remote_docs[i] for i in range(len(remote_docs))] == [local_docs[i] for i in range(len(local_docs))]
    tokenizer = load_tokenizer(_local_tokenizer(prepared))
    raw = open_documents(str(local), split="eval", eval_fraction=0.1)
    tokens = open_documents(prepared, split="eval")
    assert len(raw) == len(tokens) > 0
    for i in range(len(raw)):
        np.testing.assert_array_equal(tokens[i], tokenizer.encode(raw[i]))
    with pytest.raises(FileNotFoundError, match="no file matches"):
        open_documents("gs://bucket/corpus/*.jsonl")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        open_documents("gs://bucket/nothing.txt")


@pytest.mark.parametrize("spec", ["gs://bucket/shared", "gs://bucket/shared/*.txt"])
def test_object_names_with_dot_dot_are_refused_before_anything_is_copied(bucket, tmp_path, monkeypatch, spec):
    """Whoever can write a shared bucket could name an object `dir/../../x`: copied as listed, it would replace a
    file outside the cache (the user's ~/.bashrc from the default one). Nothing is copied, and nothing replaced."""
    cache = tmp_path / "deep" / "er" / "cache"
    monkeypatch.setenv("BERTJAX_CACHE_DIR", str(cache))
    victim = tmp_path / "deep" / "victim.txt"
    victim.parent.mkdir(parents=True)
    victim.write_text("the user's own file\n")
    bucket.pipe("bucket/shared/metadata.json", b"{}")
    bucket.pipe("bucket/shared/a.txt", b"a document\n")
    bucket.pipe("bucket/shared/../../../../../victim.txt", b"written outside the cache\n")
    with pytest.raises(ValueError, match=r"'\.\.' segment .*refused"):
        open_documents(spec)
    assert victim.read_text() == "the user's own file\n"
    assert not any(path.is_file() for path in tmp_path.rglob("*") if path != victim)


def test_pretrain_reads_the_bucket(bucket, prepared, tmp_path):
    from bertjax.train.loop import pretrain

    raw = json.loads(json.dumps(TINY_RUN))
    raw["data"].update(input=prepared, eval_fraction=0.1)
    raw["train"].update(steps=2)
    raw["schedule"] = {"name": "constant"}
    raw["checkpoint"].update(async_save=False)
    result = pretrain(run_config_from_dict(raw), tmp_path / "run")
    assert result.final_step == 2
    # the run took the tokenizer the data was prepared with, from the bucket
    assert result.tokenizer.fingerprint == load_tokenizer(_local_tokenizer(prepared)).fingerprint
    assert np.isfinite([r["loss"] for r in map(json.loads, (tmp_path / "run" / "metrics.jsonl").read_text()
                                                .splitlines()) if "loss" in r]).all()


@pytest.mark.parametrize("command, args, holds", [
    ("pretrain", ["--config", "run.yaml"], "the tokenizer, metrics.jsonl"),
    ("finetune", ["--model", "no-model", "--task", "sequence-classification", "--train", "t.csv",
                  "--validation", "v.csv"], "results.json and the best model (best/)"),
    ("train-embedder", ["--model", "no-model", "--train", "pairs.jsonl"], "the trained model (model/)"),
    ("glue", ["--model", "no-model", "--data-dir", "glue"], "glue.json, the prepared task data"),
])
def test_a_bucket_workdir_is_refused_before_anything_is_made_naming_checkpoint_directory(command, args, holds,
                                                                                        tmp_path, monkeypatch,
                                                                                        capsys):
    """Taken as a local path, gs://b/run became a directory `gs:` here and the run failed at its first checkpoint."""
    import yaml

    monkeypatch.chdir(tmp_path)
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(TINY_RUN))
    assert main([command, *args, "--workdir", "gs://my-bucket/run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"bertjax {command}: error: --workdir gs://my-bucket/run is a bucket path: "
                          f"`bertjax {command}` keeps"), err
    assert holds in err, err
    # glue's grid points share one config, so one checkpoint.directory would not do for them all
    hint = "checkpoint.directory=gs://my-bucket/run/checkpoints"
    assert (hint in err) is (command != "glue") and err.rstrip().endswith(("--workdir", "/checkpoints")), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.yaml"]  # no local `gs:` directory


@pytest.mark.skipif(any(importlib.util.find_spec(name) for name in ("gcsfs", "tensorflow")),
                    reason="gcsfs (or TensorFlow) is installed: gs:// paths are readable here")
@pytest.mark.parametrize("override", ["checkpoint.directory=gs://bucket/checkpoints", "data.input=gs://bucket/corpus"])
def test_a_bucket_path_without_gcsfs_is_one_line_naming_the_install(override, tmp_path, capsys, monkeypatch):
    """A bucket path on an install without gcsfs (etils' epath extra does not bring it) is refused before the
    model is built, in one line naming the field and `bertjax[gcs]`, not a traceback at the first checkpoint."""
    # the module's fake bucket may still stand in for gcsfs (a module fixture): take it out for this test
    monkeypatch.delitem(importlib.import_module("fsspec.registry")._registry, "gs", raising=False)
    config = tmp_path / "tiny.yaml"
    config.write_text(json.dumps(TINY_RUN))
    assert main(["pretrain", "--config", str(config), "--workdir", str(tmp_path / "run"), override]) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and "gs://bucket/" in error and "pip install 'bertjax[gcs]'" in error, error
    assert override.split("=")[0] in error or "data.input" in override  # the field named (an input: its path)
    assert not (tmp_path / "run").exists()
    if override.startswith("checkpoint"):  # and prepare's --out, checked before the first look at the bucket
        assert main(["prepare", "--input", "default", "--train-tokenizer", "--out", "gs://bucket/prepared"]) == 2
        assert "--out gs://bucket/prepared: gs:// paths need the gcsfs package" in capsys.readouterr().err


def test_a_filesystem_error_of_its_own_class_is_one_line_naming_the_path(bucket, monkeypatch, capsys, tmp_path):
    """hf:// without network: huggingface_hub raises httpx's ConnectError, which is no OSError, and prepare ended in
    a 105-line traceback. Any error a filesystem raises while an input is read is reported as that path's."""
    class ConnectError(Exception):  # an HTTP client's own class, as httpx's
        pass

    def unreachable(self, name):
        raise ConnectError("[Errno -2] Name or service not known")

    monkeypatch.setattr(epath_backend._FileSystemSpecBackend, "_get_filesystem", unreachable)
    with pytest.raises(OSError, match=r"gs://bucket/corpus: cannot be read \(ConnectError: \[Errno -2\]"):
        open_documents("gs://bucket/corpus")
    assert main(["prepare", "--input", "gs://bucket/corpus", "--train-tokenizer", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "cannot be read (ConnectError" in err and "Traceback" not in err
