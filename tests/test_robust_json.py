"""Malformed JSON in a downloaded directory or data file is a one-line error naming the file and the key, never a
traceback (audit 6, #6); and `bertjax search` shows texts only from the file that was embedded, never another file
a shared corpus's FILE.json names (audit 6, #9)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from bertjax.cli import main
from finetune_helpers import tiny_model_dir

# Far deeper than Python's recursion limit: json.loads raises RecursionError on it (a 200 KB file).
DEEP = "[" * 100_000 + "]" * 100_000


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory.mktemp("hf") / "model")


@pytest.fixture(scope="module")
def st_dir(tmp_path_factory, hf_dir):
    """The tiny model as a sentence-transformers directory (modules.json, 1_Pooling/, sentence_bert_config.json)."""
    from bertjax.embeddings import load_sentence_encoder, save_sentence_encoder

    out = tmp_path_factory.mktemp("st") / "model"
    save_sentence_encoder(load_sentence_encoder(hf_dir), out)
    return out


def edited(source, target, name: str, text: str):
    """A copy of the directory `source` with its file `name` replaced by `text`."""
    shutil.copytree(source, target)
    (target / name).write_text(text)
    return target


# ---------------------------------------------------------------------------------------------------------------
# Deeply nested JSON.

def test_deeply_nested_json_is_malformed_json_not_a_recursion_error(tmp_path):
    from bertjax.data.sources import jsonl_scanner
    from bertjax.jsonl import json_objects, read_json_file

    path = tmp_path / "deep.json"
    path.write_text(DEEP)
    with pytest.raises(ValueError, match="deep.json: invalid JSON \\(nested too deeply to read"):
        read_json_file(path)
    with pytest.raises(ValueError, match="data.jsonl, line 2: not valid JSON \\(nested too deeply to read\\)"):
        json_objects(['{"text": "a"}', DEEP, '{"text": "b"}'], "data.jsonl")
    # Pretraining text: the deep line is skipped and counted as every other bad line is; the scan goes on.
    data = f'{{"text": "a"}}\n{DEEP}\n{{"text": "b"}}\n'.encode()
    assert [found[2:] for found in jsonl_scanner("text")(data)] == [("a", None), (None, "not_json"), ("b", None)]


def test_deeply_nested_model_configs_are_one_line_errors(hf_dir, tmp_path):
    import bertjax
    from bertjax.model_dirs import read_model_config

    deep = edited(hf_dir, tmp_path / "deep", "config.json", '{"a": ' + DEEP + '}')
    with pytest.raises(ValueError, match="deep/config.json: invalid JSON"):
        bertjax.from_pretrained(str(deep))
    (tmp_path / "converted").mkdir()
    (tmp_path / "converted" / "model_config.json").write_text(DEEP)
    with pytest.raises(ValueError, match="converted/model_config.json: invalid JSON"):
        read_model_config(tmp_path / "converted")


def test_fill_mask_on_a_deeply_nested_config_says_so_in_one_line(hf_dir, tmp_path, capsys):
    deep = edited(hf_dir, tmp_path / "deep", "config.json", DEEP)
    assert main(["fill-mask", "--model", str(deep), "the [MASK]"]) == 2
    error = capsys.readouterr().err
    assert "deep/config.json: invalid JSON (nested too deeply to read" in error and "Traceback" not in error


# ---------------------------------------------------------------------------------------------------------------
# Values of the wrong type.

def test_a_vocab_size_beyond_int32_is_refused_naming_the_file(hf_dir, tmp_path):
    import bertjax

    config = json.loads((hf_dir / "config.json").read_text())
    bomb = edited(hf_dir, tmp_path / "bomb", "config.json", json.dumps({**config, "vocab_size": 10**12}))
    with pytest.raises(ValueError, match="bomb/config.json: EncoderConfig.vocab_size must be at most 2147483647"):
        bertjax.from_pretrained(str(bomb))


@pytest.mark.parametrize("key,value,match", [
    ("layer_norm_eps", [1e-12], "layer_norm_eps must be a number, got list"),  # float() raised a bare TypeError
    ("hidden_dropout_prob", "0.1", "hidden_dropout_prob must be a number, got str"),
    ("hidden_act", ["gelu"], "unsupported activation hidden_act=\\['gelu'\\]"),  # unhashable: a TypeError
    ("model_type", ["bert"], "unknown model_type \\['bert'\\]"),
])
def test_config_values_of_the_wrong_json_type_are_named(hf_dir, tmp_path, key, value, match):
    import bertjax

    config = json.loads((hf_dir / "config.json").read_text())
    bad = edited(hf_dir, tmp_path / "bad", "config.json", json.dumps({**config, key: value}))
    with pytest.raises(ValueError, match=f"bad/config.json: {match}"):
        bertjax.from_pretrained(str(bad))


@pytest.mark.parametrize("weight_map,match", [
    (["model.safetensors"],
     "not a checkpoint index: 'weight_map' must map tensor names to shard file names, got an array"),
    ({"bert.pooler.dense.weight": ["model.safetensors"]}, "'weight_map' values must be shard file names, got an"),
    (None, "not a checkpoint index: 'weight_map' must map tensor names to shard file names, got null"),
])
def test_an_index_whose_weight_map_is_of_the_wrong_type_is_refused(hf_dir, tmp_path, weight_map, match):
    import bertjax

    shutil.copytree(hf_dir, tmp_path / "idx")
    (tmp_path / "idx" / "model.safetensors").unlink()
    (tmp_path / "idx" / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(ValueError, match="idx/model.safetensors.index.json: " + match):
        bertjax.from_pretrained(str(tmp_path / "idx"))


def test_sentence_transformers_files_of_the_wrong_type_are_refused_naming_the_file_and_key(st_dir, tmp_path):
    from bertjax.embeddings import load_sentence_encoder

    modules = json.loads((st_dir / "modules.json").read_text())
    cases = [
        ({"modules.json": ["x", *modules[1:]]},
         "modules.json: each module entry must be an object with 'type' and 'path', got a string"),
        ({"modules.json": {"0": modules[0]}}, "modules.json: expected an array at the top level, got an object"),
        # Read for the default max_seq_length, when sentence_bert_config.json sets none.
        ({"tokenizer_config.json": [1, 2], "sentence_bert_config.json": {}},
         "tokenizer_config.json: expected an object at the top level, got an array"),
        ({"sentence_bert_config.json": {"max_seq_length": "abc"}},
         "sentence_bert_config.json: max_seq_length must be an integer, got 'abc'"),
        ({"sentence_bert_config.json": {"max_seq_length": 32.5}},
         "sentence_bert_config.json: max_seq_length must be an integer, got 32.5"),
        ({"sentence_bert_config.json": {"modality_config": ["text"]}},
         "sentence_bert_config.json: modality_config must map modality names to objects"),
        ({"sentence_bert_config.json": DEEP}, "sentence_bert_config.json: invalid JSON \\(nested too deeply"),
    ]
    for number, (files, match) in enumerate(cases):
        broken = shutil.copytree(st_dir, tmp_path / str(number))
        for name, value in files.items():
            (broken / name).write_text(value if isinstance(value, str) else json.dumps(value))
        with pytest.raises(ValueError, match=match):
            load_sentence_encoder(broken)
    assert load_sentence_encoder(st_dir).max_seq_length > 2  # the unedited directory loads


# ---------------------------------------------------------------------------------------------------------------
# search: the texts shown come from the file that was embedded.

def search_json(model, corpus, capsys, *extra) -> tuple[int, str, str]:
    capsys.readouterr()
    status = main(["search", "--model", str(model), "--corpus", str(corpus), "--query", "good day", "-k", "2",
                   "--json", *map(str, extra)])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_search_shows_only_the_texts_that_were_embedded(hf_dir, tmp_path, capsys):
    texts = tmp_path / "elsewhere" / "texts.txt"  # the legitimate workflow: the texts anywhere, the corpus anywhere
    texts.parent.mkdir()
    texts.write_text("good day\nbad day\n")
    corpus = tmp_path / "out" / "corpus.npy"
    assert main(["embed", "--model", str(hf_dir), "--input", str(texts), "--output", str(corpus)]) == 0
    status, out, _ = search_json(hf_dir, corpus, capsys)
    assert status == 0 and {hit["text"] for hit in json.loads(out)["hits"]} == {"good day", "bad day"}

    # A shared corpus whose FILE.json names a private file with as many lines: refused, nothing of it printed.
    secret = tmp_path / "home" / "secret.txt"
    secret.parent.mkdir()
    secret.write_text("PRIVATE KEY MATERIAL\nmore of it\n")
    description = json.loads(corpus.with_suffix(".json").read_text())
    corpus.with_suffix(".json").write_text(json.dumps({**description, "input": str(secret)}))
    status, out, err = search_json(hf_dir, corpus, capsys)
    assert status == 2 and "PRIVATE" not in out + err
    assert f"corpus.json names {secret} as the corpus texts, but its content is not what was embedded" in err
    assert "--texts FILE" in err
    # The same without the digest (a FILE.json written before it was recorded): outside the corpus's folder.
    del description["input_sha256"]
    corpus.with_suffix(".json").write_text(json.dumps({**description, "input": str(secret)}))
    status, out, err = search_json(hf_dir, corpus, capsys)
    assert status == 2 and "PRIVATE" not in out + err and "lies outside the corpus's folder" in err
    # --texts names the file: the user's own choice, read as before.
    status, out, _ = search_json(hf_dir, corpus, capsys, "--texts", texts)
    assert status == 0 and {hit["text"] for hit in json.loads(out)["hits"]} == {"good day", "bad day"}
    # No digest, texts beside the corpus (an older corpus shared as a folder): shown.
    beside = corpus.parent / "texts.txt"
    shutil.copy(texts, beside)
    corpus.with_suffix(".json").write_text(json.dumps({**description, "input": str(beside)}))
    status, out, _ = search_json(hf_dir, corpus, capsys)
    assert status == 0 and {hit["text"] for hit in json.loads(out)["hits"]} == {"good day", "bad day"}
    # An input that is not a file name is an error naming FILE.json, not a traceback.
    corpus.with_suffix(".json").write_text(json.dumps({**description, "input": 7}))
    status, _, err = search_json(hf_dir, corpus, capsys)
    assert status == 2 and "corpus.json: 'input' must be a file name, got a number" in err
    # A FILE.json that is not an object is a one-line error too.
    corpus.with_suffix(".json").write_text("[1, 2]")
    status, _, err = search_json(hf_dir, corpus, capsys)
    assert status == 2 and "corpus.json: expected an object at the top level, got an array" in err
    # Keys of another type, or a count that is not the matrix's, were ignored (or acted on): errors naming the key.
    for changes, message in (({"truncate_dim": "x"}, "'truncate_dim' must be an integer or null, got a string"),
                             ({"normalized": 1}, "'normalized' must be true/false, got a number"),
                             ({"count": 99}, "'count' is 99, but corpus.npy holds 2 x ")):
        corpus.with_suffix(".json").write_text(json.dumps({**description, **changes}))
        status, _, err = search_json(hf_dir, corpus, capsys)
        assert status == 2 and message in err, err
    assert np.load(corpus).shape[0] == 2


@pytest.mark.parametrize("record", [{"task": "sequence-classification"}, {"task": "summarise", "labels": []},
                                   {"task": "sequence-classification", "labels": 3, "regression": False,
                                    "unanswerable": None, "data": {}}])
def test_a_damaged_fine_tuning_record_is_named_not_a_traceback(tmp_path, record):
    from bertjax.finetune.prediction import load_task

    (tmp_path / "finetune.json").write_text(json.dumps(record))
    with pytest.raises(ValueError, match=r"finetune.json: not a fine-tuning record bertjax can read"):
        load_task(tmp_path, None, [])
