"""Edge cases of embedding, search and prediction input/output, each once a bug: chunking with a prompt on byte-level
BPE, generators of texts, NaN corpus rows, files beside `--output`, JSON Lines with Unicode line separators, null
cells and mixed text pairs, non-finite scores in predictions.jsonl, and data.max_length against the model's positions.

References: sentence-transformers (float32, 1e-5) for embeddings, numpy for top-k, the tokenizer's own layout of one
example for mixed pairs. Models are tiny and compiled a few times per test.
"""

from __future__ import annotations

import json
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.config import get_config
from bertjax.embeddings import Embedder, load_sentence_encoder
from bertjax.embeddings.search import top_k_search
from bertjax.models import abstract_params

CORPUS = ["the quick brown fox jumps over the lazy dog", "search query document passage hello world",
          "a cat sat on the mat and read a file line by line", "日本語 テキスト café naïve"] * 4


def run_cli(*argv) -> int:
    from bertjax.cli import main

    return main([str(a) for a in argv])


def random_params(model, seed: int = 0):
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda spec: jnp.asarray(rng.normal(0.0, 0.2, spec.shape), spec.dtype),
                        abstract_params(model))


# ---------------------------------------------------------------------------------------------------------------
# Chunking with a prompt, on a byte-level BPE tokenizer.

@pytest.fixture(scope="module")
def bpe_model(tmp_path_factory):
    """A random BertModel with a byte-level BPE tokenizer (a prompt's trailing space is a token of its own when the
    prompt is tokenised alone), saved by sentence-transformers with a query prompt, mean pooling and Normalize."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("sentence_transformers")
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(CORPUS * 5 + ["search_query: "] * 5, trainer)
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]", special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]", pad_token="[PAD]",
                                                cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]",
                                                model_max_length=64)
    config = transformers.BertConfig(vocab_size=len(fast), hidden_size=32, num_attention_heads=2, num_hidden_layers=2,
                                     intermediate_size=64, max_position_embeddings=64)
    torch.manual_seed(0)
    hf = tmp_path_factory.mktemp("bpe-hf")
    transformers.BertModel(config).save_pretrained(hf)
    fast.save_pretrained(hf)
    reference = SentenceTransformer(modules=[Transformer(str(hf), max_seq_length=32), Pooling(32, "mean"),
                                             Normalize()], prompts={"query": "search_query: "}, device="cpu")
    directory = tmp_path_factory.mktemp("bpe-st")
    reference.save(str(directory))
    return reference, directory


def test_chunking_with_a_prompt_tokenises_prompt_and_text_together(bpe_model):
    """overflow="chunk" with a prompt, byte-level BPE: texts that fit give exactly truncation's sequences and
    sentence-transformers' embeddings (1e-5); a long text's chunks each start with [CLS] and the prompt's tokens as
    they are inside prompt + text (not the prompt tokenised alone, whose trailing space is a lone token), and
    together hold every text token."""
    from bertjax.inference.pipeline import to_sequences

    reference, directory = bpe_model
    encoder = load_sentence_encoder(directory)
    prompt = encoder.prompts["query"]
    texts = ["hello world", "read a file", "", "dog"]
    chunker = Embedder(encoder, dtype="float32", overflow="chunk", stride=2)
    ours = chunker.embed(texts, prompt_name="query")
    np.testing.assert_allclose(ours, reference.encode(texts, prompt_name="query"), atol=1e-5)

    alone = encoder.tokenize([prompt], truncate=False)[0][1:-1]
    joint = chunker.token_ids(["hello world"], prompt)[0]
    assert len(alone) > 0 and list(joint[:len(alone)]) != list(alone)  # the case this test is about
    inference = chunker._inference(prompt)
    ids = chunker.token_ids(texts + [" ".join(CORPUS)], prompt)
    lead = chunker._prompt_tokens(ids, prompt)
    chunked = to_sequences(ids, inference.format, "chunk", 2, lead)
    truncated = to_sequences(ids, inference.format, "truncate")
    for i in range(len(texts)):
        np.testing.assert_array_equal(chunked.ids[i], truncated.ids[i])
    long_ids, long_lead = ids[-1], lead[-1]
    pieces = [s for s, source in zip(chunked.ids, chunked.source) if source == len(texts)]
    assert len(pieces) >= 3 and all(len(p) <= encoder.max_seq_length for p in pieces)
    for piece in pieces:
        np.testing.assert_array_equal(piece[:1 + long_lead], [encoder.tokenizer.cls_id, *long_ids[:long_lead]])
    np.testing.assert_array_equal(pieces[0], truncated.ids[-1])  # the first chunk is the truncated text
    room = encoder.max_seq_length - 2 - long_lead
    text = np.concatenate([p[1 + long_lead:-1][2 if k else 0:] for k, p in enumerate(pieces)])  # stride 2 shared
    np.testing.assert_array_equal(text, long_ids[long_lead:])
    assert all(len(p) - 2 - long_lead == room for p in pieces[:-1])


def test_chunk_prompt_too_long_and_bad_settings_are_clear_errors(bpe_model):
    encoder = load_sentence_encoder(bpe_model[1])
    with pytest.raises(ValueError, match="overflow must be one of"):
        Embedder(encoder, overflow="chunks")  # at construction, not at the first embed
    with pytest.raises(ValueError, match=r"stride must be in \[0, 30\)"):
        Embedder(encoder, overflow="chunk", stride=30)
    with pytest.raises(ValueError, match="the prompt is .* tokens, which leaves no room for text"):
        Embedder(encoder, dtype="float32", overflow="chunk").embed(["dog"], prompt="hello world " * 40)


def test_embed_takes_any_iterable_of_texts(bpe_model):
    """A generator is read once: the same [count, dim] as the list (it used to give [0, dim])."""
    encoder = load_sentence_encoder(bpe_model[1])
    embedder = Embedder(encoder, dtype="float32")
    texts = ["hello world", "dog", ""]
    listed = embedder.embed(texts)
    np.testing.assert_array_equal(embedder.embed(text for text in texts), listed)
    np.testing.assert_array_equal(embedder.embed(tuple(texts)), listed)
    with pytest.raises(TypeError, match="got one string"):
        embedder.embed("hello")


def test_token_ids_given_as_arrays_are_checked_against_the_vocabulary(bpe_model):
    """Ids from another tokenizer: one past the embedding gathered a NaN row, and packing spread it to every text in
    the row (all three came back NaN, without an error); -1 read the last row. Refused, naming the text."""
    from bertjax.inference import TextInference, encoder_row_fn, model_max_length

    encoder = load_sentence_encoder(bpe_model[1])
    embedder = Embedder(encoder, dtype="float32")
    ids = embedder.token_ids(["the cat sat", "hello world", "a dog"])
    vocab = encoder.model.config.vocab_size
    for bad_id in (vocab, -1):
        bad = [x.copy() for x in ids]
        bad[1][0] = bad_id
        low, high = (str(bad_id), r"\d+") if bad_id < 0 else (r"\d+", str(bad_id))
        with pytest.raises(ValueError, match=rf"text 1: token ids must be in \[0, {vocab}\) \(the model's "
                                             rf"vocabulary.*got min {low} and max {high}$"):
            embedder.embed_token_ids(bad)
    with pytest.raises(ValueError, match="text 0: token ids must be integers"):
        embedder.embed_token_ids([ids[0].astype(np.float32)])
    inference = TextInference(encoder_row_fn(encoder.model, "mean"), encoder.tokenizer,
                              model_max_length(encoder.model.config))
    sequences = [np.concatenate([[2], x, [3]]).astype(np.int32) for x in ids]
    sequences[2][1] = vocab + 7
    with pytest.raises(ValueError, match=rf"sequence 2: token ids must be in \[0, {vocab}\).*max {vocab + 7}"):
        inference.run_sequences(encoder.params, sequences)


# ---------------------------------------------------------------------------------------------------------------
# Search: NaN rows, lists.

def test_top_k_search_never_returns_nan_rows():
    """Corpus rows holding NaN or infinities are never returned (no index -1, no -inf score), k' counts only the
    usable rows, and a warning says how many rows were left out; the rest ranks as numpy ranks it."""
    rng = np.random.default_rng(0)
    corpus = rng.normal(size=(20, 8)).astype(np.float32)
    corpus[[3, 11]] = np.nan
    corpus[7, 2] = np.inf
    queries = rng.normal(size=(2, 8)).astype(np.float32)
    good = np.setdiff1d(np.arange(20), [3, 7, 11])
    unit = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)  # noqa: E731
    expected = good[np.argsort(-(unit(queries) @ unit(corpus[good]).T), axis=1, kind="stable")]
    for chunk_size in (4, 64):
        with pytest.warns(RuntimeWarning, match="3 of 20 corpus rows hold NaN or infinite values"):
            scores, indices = top_k_search(queries, corpus, k=20, chunk_size=chunk_size)
        assert indices.shape == (2, 17) and np.isfinite(scores).all()
        np.testing.assert_array_equal(indices, expected)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, some = top_k_search(queries, corpus[good], k=5)
    assert some.shape == (2, 5)
    with pytest.raises(ValueError, match="every corpus row .* holds NaN"):
        top_k_search(queries, np.full((3, 8), np.nan, np.float32), k=2)
    # A list of rows is an array-like corpus too.
    _, from_list = top_k_search(queries, corpus[good].tolist(), k=4)
    np.testing.assert_array_equal(from_list, np.searchsorted(good, expected[:, :4]))


# ---------------------------------------------------------------------------------------------------------------
# `bertjax embed` never destroys a file beside its output.

def test_embed_refuses_to_overwrite_the_input_or_a_foreign_description(tmp_path, capsys):
    """FILE.json beside --output FILE.npy: refused before any work when it is the input, or exists and was not
    written by bertjax embed (the file is left as it was); an earlier description is replaced."""
    from bertjax.embeddings.corpus import write_embeddings

    results = tmp_path / "results.json"
    results.write_text('{"text": "a"}\n{"text": "b"}\n')
    before = results.read_bytes()
    missing_model = tmp_path / "no-model"  # never read: the paths are checked first
    assert run_cli("embed", "--model", missing_model, "--input", results, "--output", tmp_path / "results.npy") == 2
    err = capsys.readouterr().err
    assert f"{results}, which is the --input file" in err and "results.npy" in err
    texts = tmp_path / "texts.txt"
    texts.write_text("a\nb\n")
    assert run_cli("embed", "--model", missing_model, "--input", texts, "--output", tmp_path / "results.npy") == 2
    err = capsys.readouterr().err
    assert f"{results}, which exists and was not written by bertjax embed" in err
    assert results.read_bytes() == before and not (tmp_path / "results.npy").exists()

    vectors = np.ones((2, 4), np.float32)
    out = tmp_path / "emb.npy"
    write_embeddings(out, vectors, {"model": "m", "model_fingerprint": "f", "input": str(texts)})
    write_embeddings(out, 2 * vectors, {"model": "m", "model_fingerprint": "f", "input": str(texts)})  # a rerun
    assert json.loads(out.with_suffix(".json").read_text())["count"] == 2
    np.testing.assert_array_equal(np.load(out), 2 * vectors)


# ---------------------------------------------------------------------------------------------------------------
# Text files: Unicode line separators, repaired bytes.

def test_read_texts_keeps_unicode_separators_and_names_the_users_file(tmp_path):
    """U+2028, U+2029 and U+0085 inside JSON strings are text, not line ends; with errors="replace" a bad line's
    error names the user's file (not a temporary copy)."""
    from bertjax.embeddings.corpus import read_texts

    texts = ["one\u2028two", "three\u2029four", "five\u0085six", "plain"]
    jsonl = tmp_path / "docs.jsonl"
    jsonl.write_bytes("\r\n".join(json.dumps({"text": t}, ensure_ascii=False) for t in texts).encode() + b"\r\n")
    assert read_texts(jsonl) == (texts, 0)
    assert read_texts(jsonl, errors="replace") == (texts, 0)
    broken = tmp_path / "broken.jsonl"
    broken.write_bytes(b'{"text": "caf\xe9"}\n{"text": \n')
    with pytest.raises(ValueError, match=f"^{broken}, line 2: not valid JSON"):
        read_texts(broken, errors="replace")
    with pytest.raises(FileNotFoundError, match=f"input file {tmp_path} is a directory"):
        read_texts(tmp_path)


# ---------------------------------------------------------------------------------------------------------------
# bertjax predict: standard JSON, data.max_length against the model.

def test_predictions_are_standard_json(tmp_path):
    from bertjax.jsonl import write_json_objects

    path = write_json_objects(tmp_path / "ok.jsonl", [{"score": None}, {"score": 1.5}], allow_nan=False)
    assert [json.loads(line) for line in path.read_text().splitlines()] == [{"score": None}, {"score": 1.5}]
    with pytest.raises(ValueError, match=r"bad.jsonl, line 2: .*NaN or infinity"):
        write_json_objects(tmp_path / "bad.jsonl", [{"score": 1.0}, {"score": float("-inf")}], allow_nan=False)


def test_fit_max_length_caps_defaults_and_refuses_explicit_lengths():
    from bertjax.finetune.config import FinetuneDataConfig
    from bertjax.finetune.tasks.base import fit_max_length

    roberta = get_config("roberta-tiny", max_position_embeddings=66)  # position_offset 2: 64 usable positions
    assert roberta.position_offset == 2
    data = FinetuneDataConfig(max_length=384, doc_stride=128)
    capped = fit_max_length(data, roberta)
    assert (capped.max_length, capped.doc_stride) == (64, 21)  # the stride shrinks with the window: 128 * 64 // 384
    assert fit_max_length(data, roberta, chosen={"data.doc_stride"}).doc_stride == 128  # the user's stays
    assert fit_max_length(FinetuneDataConfig(max_length=64), roberta) == FinetuneDataConfig(max_length=64)
    assert fit_max_length(FinetuneDataConfig(max_length=32), roberta, chosen={"data.max_length"}).max_length == 32
    with pytest.raises(ValueError, match=r"data.max_length=384 is longer than m takes: 64 tokens "
                                         r"\(max_position_embeddings 66 less position_offset 2\)"):
        fit_max_length(data, roberta, chosen={"data.max_length"}, model="m")


def test_predict_question_answering_on_a_short_model(tmp_path):
    """A QA checkpoint of 48 positions: predict's default data.max_length (384) is capped to 48, giving the records
    of an explicit data.max_length=48 and doc_stride=16 (128 scaled by 48 / 384); a longer explicit one is an error
    naming data.max_length; an empty context has no span and a null score (standard JSON, not -Infinity)."""
    import bertjax
    from bertjax.finetune.prediction import predict
    from bertjax.config import TaskConfig as HeadConfig
    from bertjax.data.tokenizers import WordPieceTokenizer
    from bertjax.models import MODEL_CLASSES

    words = "the cat sat on mat who where is paris in france what did".split()
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words
    config = get_config("bert-tiny", vocab_size=len(vocab), pad_token_id=0, max_position_embeddings=48,
                        task=HeadConfig(num_labels=2))
    model = MODEL_CLASSES["question_answering"](config)
    bertjax.save_pretrained(str(tmp_path / "qa"), model, random_params(model, seed=1))
    WordPieceTokenizer("\n".join(vocab)).save(tmp_path / "qa")
    rows = [{"id": "a", "question": "where is the cat", "context": "the cat sat on the mat in paris " * 6},
            {"id": "b", "question": "", "context": ""}]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    capped = predict(tmp_path / "qa", tmp_path / "in.jsonl")
    assert capped == predict(tmp_path / "qa", tmp_path / "in.jsonl", ["data.max_length=48", "data.doc_stride=16"])
    assert capped[0]["answer"] and capped[1] == {"id": "b", "answer": "", "start": -1, "end": -1, "score": None}
    with pytest.raises(ValueError, match=r"data.max_length=64 is longer than --model .* takes: 48 tokens"):
        predict(tmp_path / "qa", tmp_path / "in.jsonl", ["data.max_length=64"])
    assert run_cli("predict", "--model", tmp_path / "qa", "--input", tmp_path / "in.jsonl",
                   "--output", tmp_path / "out.jsonl") == 0
    json.loads((tmp_path / "out.jsonl").read_text().splitlines()[1], parse_constant=pytest.fail)


# ---------------------------------------------------------------------------------------------------------------
# --output against --input: predict and embed share one check, made before the model loads.

def test_predict_and_embed_refuse_an_output_that_is_the_input_under_any_name(tmp_path, capsys):
    """The same path, a path spelled otherwise, a symbolic link and a hard link to the input are all refused, as
    are a directory and a path below a file, before the model is read (it does not exist here); the input keeps its
    bytes."""
    import os

    source = tmp_path / "in.jsonl"
    source.write_text('{"text": "a day"}\n{"text": "good"}\n')
    before = source.read_bytes()
    (tmp_path / "link.jsonl").symlink_to(source.name)
    os.link(source, tmp_path / "hard.jsonl")
    missing_model = tmp_path / "no-model"
    for output in (source, tmp_path / "sub" / ".." / "in.jsonl"):
        assert run_cli("predict", "--model", missing_model, "--input", source, "--output", output) == 2
        assert f"--output {output} is the --input file: writing the predictions would destroy it" in \
            capsys.readouterr().err
    for name in ("link.jsonl", "hard.jsonl"):
        assert run_cli("predict", "--model", missing_model, "--input", source, "--output", tmp_path / name) == 2
        assert f"is the --input file {source} under another name" in capsys.readouterr().err
    assert run_cli("predict", "--model", missing_model, "--input", source, "--output", tmp_path) == 2
    assert f"--output {tmp_path}: {tmp_path} is a directory; give the name of a file" in capsys.readouterr().err
    assert run_cli("predict", "--model", missing_model, "--input", source, "--output", source / "out.jsonl") == 2
    assert f"{source} is a file, not a directory" in capsys.readouterr().err
    assert source.read_bytes() == before and (tmp_path / "hard.jsonl").read_bytes() == before

    # embed: FILE.npy's description FILE.json hard-linked to the input.
    os.link(source, tmp_path / "emb.json")
    assert run_cli("embed", "--model", missing_model, "--input", source, "--output", tmp_path / "emb.npy") == 2
    err = capsys.readouterr().err
    assert f"would write their description to {tmp_path / 'emb.json'}, which is the --input file {source}" in err
    assert source.read_bytes() == before and not (tmp_path / "emb.npy").exists()


def _unwritable_folder(tmp_path):
    """A folder no file can be created in: a read-only one, or /sys for root (whom permissions do not stop)."""
    import os
    from pathlib import Path

    if os.geteuid() != 0:
        folder = tmp_path / "read-only"
        folder.mkdir(mode=0o555)
        return folder
    if not Path("/sys").is_dir():
        pytest.skip("running as root without /sys: no folder that refuses files")
    return Path("/sys")


def test_outputs_that_exist_or_cannot_be_written_are_refused_before_any_work(tmp_path, capsys):
    """An --output in a folder that refuses files used to be found once the predictions or embeddings were made
    (and thrown away); predict replaced an existing file, embed a .npy that no FILE.json describes as its own."""
    source = tmp_path / "in.jsonl"
    source.write_text('{"text": "a day"}\n')
    missing_model = tmp_path / "no-model"  # never read: the paths are checked first
    folder = _unwritable_folder(tmp_path)
    for command, name in (("predict", "out.jsonl"), ("embed", "out.npy")):
        assert run_cli(command, "--model", missing_model, "--input", source, "--output", folder / name) == 2
        assert f"--output {folder / name}: cannot write in {folder}" in capsys.readouterr().err
    mine = tmp_path / "mine.jsonl"
    mine.write_text("precious\n")
    assert run_cli("predict", "--model", missing_model, "--input", source, "--output", mine) == 2
    assert f"--output {mine} exists; pass --overwrite" in capsys.readouterr().err
    assert run_cli("predict", "--model", missing_model, "--input", source, "--output", mine, "--overwrite") == 2
    assert "--overwrite" not in capsys.readouterr().err  # past the check: the missing model is what stops it
    matrix = tmp_path / "mine.npy"
    np.save(matrix, np.ones((2, 3), np.float32))
    assert run_cli("embed", "--model", missing_model, "--input", source, "--output", matrix) == 2
    assert "has no mine.json beside it" in capsys.readouterr().err
    assert mine.read_text() == "precious\n" and np.load(matrix).shape == (2, 3)


# ---------------------------------------------------------------------------------------------------------------
# The embedding commands against a tokenizer larger than the model, and texts that are not strings.

@pytest.fixture(scope="module")
def small_vocab_model(tmp_path_factory):
    """A tiny BERT directory (hidden 32) whose tokenizer has 2 tokens more than the model's embedding rows."""
    from bertjax.data.tokenizers import WordPieceTokenizer
    from finetune_helpers import VOCAB, tiny_model_dir

    model = tiny_model_dir(tmp_path_factory.mktemp("small-vocab") / "model")
    WordPieceTokenizer("\n".join(VOCAB + ["extra", "words"])).save(model)
    return model, len(VOCAB)


def test_embedding_commands_refuse_a_tokenizer_larger_than_the_model(small_vocab_model, tmp_path, capsys):
    """embed, search and train-embedder refuse the directory when loading it, with the message predict and
    finetune give (ids past the table would give NaN rows): nothing is written, and train-embedder makes no
    workdir. A SentenceEncoder built with such a tokenizer is refused too."""
    import re

    model, vocab = small_vocab_model
    expected = (f"{model}: the tokenizer has {vocab + 2} tokens but the model's vocab_size is {vocab}, so ids "
                f"{vocab}..{vocab + 1} have no embedding")
    with pytest.raises(ValueError, match=re.escape(expected)):
        load_sentence_encoder(model)
    texts = tmp_path / "texts.txt"
    texts.write_text("good day\nextra words\n")
    assert run_cli("embed", "--model", model, "--input", texts, "--output", tmp_path / "e.npy") == 2
    assert expected in capsys.readouterr().err and not (tmp_path / "e.npy").exists()
    corpus = tmp_path / "corpus.npy"
    np.save(corpus, np.ones((2, 32), np.float32))
    assert run_cli("search", "--model", model, "--corpus", corpus, "--query", "extra") == 2
    assert expected in capsys.readouterr().err
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"anchor": f"good {i}", "positive": "extra words"}) + "\n" for i in range(8)))
    assert run_cli("train-embedder", "--model", model, "--train", pairs, "--workdir", tmp_path / "w",
                   "train.batch_size=4", "train.steps=1") == 2
    assert expected in capsys.readouterr().err and not (tmp_path / "w").exists()
    # fill-mask failed only for a text holding the extra words, and convert passed the pair on (both directions).
    assert run_cli("fill-mask", "--model", model, "good [MASK] day") == 2
    assert expected in capsys.readouterr().err
    assert run_cli("convert", "--from-hf", model, "--out", tmp_path / "converted") == 2
    assert expected in capsys.readouterr().err and not (tmp_path / "converted").exists()

    from bertjax.data.tokenizers import WordPieceTokenizer
    from finetune_helpers import VOCAB, tiny_model_dir

    good = load_sentence_encoder(tiny_model_dir(tmp_path / "good"))
    with pytest.raises(ValueError, match=re.escape(f"SentenceEncoder: the tokenizer has {vocab + 2} tokens")):
        good.replace(tokenizer=WordPieceTokenizer("\n".join(VOCAB + ["extra", "words"])))


def test_a_text_that_is_not_a_string_is_named_by_its_index(tmp_path):
    """SentenceEncoder.encode / tokenize and Embedder.embed name the first text that is not a string (the tokenizer
    alone says "List elements must be str or bytes"), and all refuse one bare string."""
    from finetune_helpers import tiny_model_dir

    encoder = load_sentence_encoder(tiny_model_dir(tmp_path / "model"))
    embedder = Embedder(encoder, dtype=None)
    for call, name in ((encoder.encode, "encode"), (encoder.tokenize, "tokenize"), (embedder.embed, "embed")):
        with pytest.raises(ValueError, match="^text 1 is a NoneType, not a string$"):
            call(["good day", None])
        with pytest.raises(ValueError, match="^text 0 is a int, not a string$"):
            call(iter([3]))
        with pytest.raises(TypeError, match=f"^{name} takes a list of texts, got one string; wrap it in a list$"):
            call("good day")
    assert encoder.encode(text for text in ["good day", ""]).shape == (2, encoder.dim)  # any iterable of strings


def test_text_rows_take_the_tokenizers_layout_and_refuse_xlnets():
    """TextInference built [CLS] text [SEP] from cls_id / sep_id whatever the tokenizer's layout: XLNet's
    `text <sep> <cls>` (its <cls> of token type 2) ran silently in a layout its model never saw."""
    from types import SimpleNamespace

    from bertjax.data.special_template import TEXT, Item, SpecialTemplate, bert_template
    from bertjax.inference.pipeline import SequenceFormat

    roberta = SimpleNamespace(special_template=bert_template(0, 2), cls_id=0, sep_id=2)
    assert SequenceFormat.for_tokenizer(roberta, 16) == SequenceFormat(prefix=(0,), suffix=(2,), max_length=16)
    suffix_only = SimpleNamespace(special_template=SpecialTemplate(single=(Item(TEXT, 0, 0), Item(2, 0)), pair=None))
    assert SequenceFormat.for_tokenizer(suffix_only, 16).prefix == ()
    xlnet = SimpleNamespace(special_template=SpecialTemplate(
        single=(Item(TEXT, 0, 0), Item(4, 0), Item(3, 2)), pair=None), cls_id=3, sep_id=4)
    with pytest.raises(ValueError, match=r"`text id 4 id 3` \(token types \[0, 0, 2\]\)"):
        SequenceFormat.for_tokenizer(xlnet, 16)
