"""The inference layer (bertjax.inference) and what runs on it: Embedder, top-k search, `bertjax embed` / `search`.

References are independent of the path under test: one text alone in its row (packing off by construction) for
packed rows, numpy for unpacking and for top-k, SentenceEncoder.encode (itself held to sentence-transformers in
test_embeddings.py) for the Embedder. Every model is tiny and compiled once per test.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.config import get_config
from bertjax.data.special_template import bert_template
from bertjax.embeddings import Embedder, EncoderForEmbedding, PoolingConfig, load_sentence_encoder
from bertjax.embeddings.embed import embedding_row_fn
from bertjax.embeddings.search import top_k_search
from bertjax.inference import BucketConfig, TextInference
from bertjax.inference.packing import batch_shapes
from bertjax.models import abstract_params
from bertjax.models.pooling import POOLING_MODES
from train_helpers import cpu_env

ALL_MODES = tuple(POOLING_MODES)
FAMILIES = ("bert-tiny", "roberta-tiny", "albert-tiny", "distilbert-tiny", "electra-tiny-discriminator",
            "eurobert-tiny", "modernbert-tiny", "deberta-v3-tiny", "xlnet-tiny")


class IdTokenizer:
    """Special ids and their layout only: these tests hand the layer token ids directly."""
    pad_id, cls_id, sep_id = 0, 1, 2
    special_template = bert_template(cls_id, sep_id)


def random_params(model, seed: int = 0):
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda spec: jnp.asarray(rng.normal(0.0, 0.2, spec.shape), spec.dtype),
                        abstract_params(model))


# ---------------------------------------------------------------------------------------------------------------
# Packed rows, every family and pooling mode.

@pytest.mark.parametrize("family", FAMILIES)
def test_packed_rows_equal_one_text_at_a_time(family):
    """Texts packed several to a row (best fit, segment ids) give what each text alone in its row gives: every
    pooling mode at once, prompts excluded per text, normalised. One compiled program serves both layouts (one
    row per batch, same slot count), so the only difference is the packing."""
    overrides = {} if family.startswith("xlnet") else {"max_position_embeddings": 64}
    config = get_config(family, **overrides)
    model = EncoderForEmbedding(config, pooling=PoolingConfig(modes=ALL_MODES, include_prompt=False,
                                                              normalize=True))
    params = random_params(model)
    rng = np.random.default_rng(1)
    lengths = (0, 3, 9, 1, 14, 5, 2, 20)
    sequences = [np.concatenate([[1], rng.integers(5, config.vocab_size, n), [2]]).astype(np.int32)
                 for n in lengths]
    prompts = np.asarray([min(2, n) for n in lengths], np.int32)
    inference = TextInference(embedding_row_fn(model), IdTokenizer, 32,
                              buckets=BucketConfig(lengths=(32,), max_tokens=32, max_segments=6))
    packed = inference.run_sequences(params, sequences, {"prompt_lengths": prompts}).segments["embedding"]
    alone = np.concatenate([inference.run_sequences(params, [s], {"prompt_lengths": prompts[i:i + 1]})
                            .segments["embedding"] for i, s in enumerate(sequences)])
    assert inference.compiles == 1
    assert packed.shape == (len(lengths), len(ALL_MODES) * config.hidden_size) and packed.dtype == np.float32
    assert np.isfinite(packed).all()
    np.testing.assert_allclose(packed, alone, atol=1e-5, err_msg=family)


# ---------------------------------------------------------------------------------------------------------------
# Buckets: few programs, outputs back in input order.

def test_bucketing_compiles_at_most_the_configured_programs_over_1000_lengths():
    """1000 texts of random lengths (1..300 tokens, model length 256: long ones truncated), streamed in calls of
    varying size: the row function compiles at most batch_shapes(plan) programs, and every per-text output lands
    at its own index (checked against numpy: token count, id sum, and the token spans themselves)."""

    def row_fn(params, batch, max_segments):
        ids, segments = batch["input_ids"], batch["segment_ids"]
        member = segments[..., None] == jnp.arange(1, max_segments + 1)
        return {"segments": {"count": member.sum(1), "sum": jnp.where(member, ids[..., None], 0).sum(1)},
                "tokens": {"ids": ids * (segments != 0)}}

    inference = TextInference(row_fn, IdTokenizer, 256,
                              buckets=BucketConfig(lengths=(16, 32, 64, 128), max_tokens=1024, max_segments=8))
    shapes = batch_shapes(inference.plan)
    assert len(shapes) <= 3 * len(inference.plan.lengths)
    rng = np.random.default_rng(0)
    lengths = rng.integers(0, 300, 1000)
    texts = [rng.integers(5, 1000, n).astype(np.int32) for n in lengths]
    start = 0
    for size in (1, 7, 100, 250, 642):
        chunk = texts[start:start + size]
        out = inference.run_tokens(None, chunk)
        expected = [np.concatenate([[1], t[:254], [2]]) for t in chunk]
        assert out.segments["count"].shape == (size,)
        np.testing.assert_array_equal(out.segments["count"], [len(e) for e in expected])
        np.testing.assert_array_equal(out.segments["sum"], [e.sum() for e in expected])
        assert all(np.array_equal(got, e) for got, e in zip(out.tokens["ids"], expected))
        start += size
    assert start == 1000
    # Padding rows: fewer than the smallest batch of each length (the tail runs in quarter / sixteenth batches).
    from bertjax.inference.packing import batch_sizes, pack
    from bertjax.inference.pipeline import SequenceFormat, to_sequences

    sequences = to_sequences(texts, SequenceFormat((1,), (2,), 256)).ids
    batches, _ = pack(sequences, inference.plan, 0)
    for length in inference.plan.lengths:
        mine = [b for b in batches if b.input_ids.shape[1] == length]
        empty = sum(b.input_ids.shape[0] - b.real_rows for b in mine)
        assert empty < batch_sizes(inference.plan, length, 1)[0] or not mine, (length, empty)
    assert 1 <= inference.compiles <= len(shapes), (inference.compiles, sorted(shapes))


def test_warm_up_compiles_every_shape_so_a_job_compiles_nothing():
    """warm_up runs one padding batch of every [rows, length] of batch_shapes: afterwards any stream of texts
    (per-slot inputs included) compiles no program."""

    def row_fn(params, batch, max_segments):
        member = batch["segment_ids"][..., None] == jnp.arange(1, max_segments + 1)
        return {"segments": {"count": member.sum(1) + batch["extra"]}}

    inference = TextInference(row_fn, IdTokenizer, 64, buckets=BucketConfig(lengths=(16, 32), max_tokens=256))
    assert inference.warm_up(None, {"extra": np.zeros(1, np.int32)}) == len(batch_shapes(inference.plan))
    rng = np.random.default_rng(2)
    texts = [rng.integers(5, 100, n).astype(np.int32) for n in rng.integers(0, 80, 300)]
    out = inference.run_tokens(None, texts, {"extra": np.arange(300, dtype=np.int32)})
    np.testing.assert_array_equal(out.segments["count"], [min(len(t), 62) + 2 + i for i, t in enumerate(texts)])
    assert inference.compiles == len(batch_shapes(inference.plan))


def test_warm_up_of_a_known_job_compiles_only_its_shapes():
    """warm_up(shapes=batch_shapes_of(job)) compiles exactly the job's batch shapes (fewer than every shape), after
    which the job compiles nothing; a shape the plan cannot make is refused by name."""

    def row_fn(params, batch, max_segments):
        return {"segments": {"count": (batch["segment_ids"][..., None] == jnp.arange(1, max_segments + 1)).sum(1)}}

    inference = TextInference(row_fn, IdTokenizer, 64, buckets=BucketConfig(lengths=(16, 32), max_tokens=256))
    rng = np.random.default_rng(3)
    texts = [rng.integers(5, 100, n).astype(np.int32) for n in rng.integers(40, 62, 20)]  # all rows of 64
    shapes = inference.batch_shapes_of(texts)
    assert shapes and all(length == 64 for _, length in shapes) and shapes < batch_shapes(inference.plan)
    assert inference.warm_up(None, shapes=shapes) == len(shapes)
    inference.run_tokens(None, texts)
    assert inference.compiles == len(shapes)
    with pytest.raises(ValueError, match=r"shapes \[\(3, 64\)\] are not batch shapes"):
        inference.warm_up(None, shapes=[(3, 64)])


def test_default_token_budget_follows_the_platform():
    """No max_tokens: 2,048 tokens per batch on CPU (big batches spill its caches), 16,384 on accelerators."""
    from bertjax.inference.buckets import plan_buckets

    assert plan_buckets(BucketConfig(), 512, 1, "cpu").rows == {64: 32, 128: 16, 256: 8, 512: 4}
    assert plan_buckets(BucketConfig(), 512, 2, "tpu").rows == {64: 256, 128: 128, 256: 64, 512: 32}
    assert plan_buckets(BucketConfig(max_tokens=1024), 128, 1, "gpu").rows == {64: 16, 128: 8}


# ---------------------------------------------------------------------------------------------------------------
# Embedder over a real tokenizer.

WORDS = "the a of and to in is it that for on with cat dog sat mat hello world query document".split()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A random-weight BertModel with a WordPiece tokenizer, saved as a sentence-transformers directory with
    prompts, prompt-excluding pooling over three modes and normalisation."""
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    from bertjax.embeddings import save_sentence_encoder

    hf = tmp_path_factory.mktemp("hf")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"abcdefghijklmnopqrstuvwxyz.,:!?'_",
             *("##" + c for c in "abcdefghijklmnopqrstuvwxyz"), *WORDS]
    tokenizer = transformers.BertTokenizerFast(vocab={t: i for i, t in enumerate(vocab)}, do_lower_case=False)
    config = transformers.BertConfig(vocab_size=len(vocab), hidden_size=32, num_attention_heads=4,
                                     num_hidden_layers=2, intermediate_size=64, max_position_embeddings=64)
    torch.manual_seed(0)
    transformers.BertModel(config).save_pretrained(hf)
    tokenizer.save_pretrained(hf)
    encoder = load_sentence_encoder(hf).replace(
        pooling=PoolingConfig(modes=("mean", "cls", "max"), include_prompt=False, normalize=True),
        prompts={"query": "query: ", "document": "search_document: "}, max_seq_length=48)
    out = tmp_path_factory.mktemp("st")
    save_sentence_encoder(encoder, out)
    return out


def sample_texts(count: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, rng.integers(0, 60))) for _ in range(count)]


def test_embedder_equals_encode_in_input_order_with_bad_texts(model_dir):
    """Packed, bucketed embedding of texts (empty ones, a 100k-character one, one all non-ASCII) equals
    SentenceEncoder.encode one text per row (float32, 1e-5), with a prompt excluded from pooling; bfloat16
    compute stays close; one row per input text, always."""
    encoder = load_sentence_encoder(model_dir)
    texts = sample_texts(24) + ["", "dog " * 25_000, "", "日本語のテキスト \u2028 ünïcödé"]
    reference = encoder.encode(texts, prompt_name="query")
    embedder = Embedder(encoder, dtype="float32", max_tokens=256)
    ours = embedder.embed(texts, prompt_name="query")
    assert ours.shape == (len(texts), encoder.dim) and ours.dtype == np.float32
    np.testing.assert_allclose(ours, reference, atol=1e-5)
    assert embedder.embed([]).shape == (0, encoder.dim)
    assert embedder.compiles <= 2
    # Tokenised once, embedded from the ids: the same vectors; after warm_up on those ids the job compiles nothing.
    fresh = Embedder(encoder, dtype="float32", max_tokens=256)
    ids = fresh.token_ids(texts, encoder.prompts["query"])
    fresh.warm_up(prompt_name="query", token_ids=ids)
    warmed = fresh.compiles
    np.testing.assert_array_equal(fresh.embed_token_ids(ids, prompt_name="query"), ours)
    assert fresh.compiles == warmed
    # The default, "auto", computes in float32 on CPU (bfloat16 matmuls run slower there), as `bertjax embed` does.
    assert Embedder(encoder).model.config.dtype == "float32"
    half = Embedder(encoder, dtype="bfloat16", max_tokens=256).embed(texts, prompt_name="query")
    assert half.dtype == np.float32
    np.testing.assert_allclose(half, reference, atol=3e-2)
    with pytest.raises(ValueError, match="text 1 is a int"):
        embedder.embed(["ok", 3])


def test_chunking_averages_the_chunks_of_a_long_text(model_dir):
    """overflow="chunk": a text longer than max_seq_length becomes chunks of [CLS] prompt window [SEP] (windows
    sharing `stride` tokens), whose embeddings are averaged and re-normalised; short texts are as with truncation."""
    encoder = load_sentence_encoder(model_dir)
    long_text = " ".join(sample_texts(30, seed=3))
    short = "hello world"
    chunked = Embedder(encoder, dtype="float32", overflow="chunk", stride=8).embed([long_text, short],
                                                                                  prompt_name="query")
    ids = encoder.tokenize([long_text], truncate=False)[0][1:-1]
    prompt = encoder.tokenize(["query: "], truncate=False)[0][1:-1]
    room = encoder.max_seq_length - 2 - len(prompt)
    starts = range(0, len(ids) - 8, room - 8)
    assert len(starts) >= 3
    rows = [np.concatenate([[encoder.tokenizer.cls_id], prompt, ids[s:s + room], [encoder.tokenizer.sep_id]])
            for s in starts]
    seq = max(len(r) for r in rows)
    input_ids = np.zeros((len(rows), seq), np.int32)
    segment_ids = np.zeros((len(rows), seq), np.int32)
    for i, row in enumerate(rows):
        input_ids[i, :len(row)], segment_ids[i, :len(row)] = row, 1
    per_chunk = np.asarray(jax.jit(encoder.embed_rows, static_argnums=3)(encoder.params, input_ids, segment_ids, 1,
                                              encoder.prompt_length("query: ")))[:, 0]
    expected = per_chunk.mean(0) / np.linalg.norm(per_chunk.mean(0))
    np.testing.assert_allclose(chunked[0], expected, atol=1e-5)
    np.testing.assert_allclose(chunked[1], encoder.encode([short], prompt_name="query")[0], atol=1e-5)


# ---------------------------------------------------------------------------------------------------------------
# Top-k search.

def test_top_k_search_equals_numpy():
    rng = np.random.default_rng(0)
    corpus = rng.normal(size=(1000, 24)).astype(np.float32)
    corpus[17] = 0.0  # a zero row scores 0, not NaN
    queries = rng.normal(size=(6, 24)).astype(np.float32)
    unit = lambda x: x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)  # noqa: E731
    for similarity, scores in (("cosine", unit(queries) @ unit(corpus).T), ("dot", queries @ corpus.T)):
        expected = np.argsort(-scores, axis=1, kind="stable")[:, :10]
        for chunk_size in (128, 333, 4096):  # chunk edges inside, and a corpus in one padded chunk
            got_scores, got = top_k_search(queries, corpus, 10, similarity=similarity, chunk_size=chunk_size)
            np.testing.assert_array_equal(got, expected)
            np.testing.assert_allclose(got_scores, np.take_along_axis(scores, expected, 1), rtol=1e-5, atol=1e-5)
    scores, indices = top_k_search(queries[0], corpus[:3], k=10)  # k beyond the corpus: every row, ranked
    assert indices.shape == (1, 3) and sorted(indices[0]) == [0, 1, 2]
    with pytest.raises(ValueError, match="corpus holds no embeddings"):
        top_k_search(queries, corpus[:0], 5)
    with pytest.raises(ValueError, match="dimension mismatch: the queries have 24 dimensions, the corpus 16"):
        top_k_search(queries, corpus[:, :16], 5)


# ---------------------------------------------------------------------------------------------------------------
# Commands.

def run_cli(*argv: str) -> int:
    from bertjax.cli import main

    return main([str(a) for a in argv])


def test_embed_and_search_commands(model_dir, tmp_path, capsys):
    texts = sample_texts(30, seed=5)
    texts[3] = texts[9] = ""  # empty lines are texts
    lines = tmp_path / "corpus.txt"
    lines.write_text("\n".join(texts) + "\n", encoding="utf-8")
    out = tmp_path / "emb.npy"
    assert run_cli("embed", "--model", model_dir, "--input", lines, "--output", out, "--prompt-name", "document",
                   "--max-tokens", "512") == 0
    vectors = np.load(out)
    encoder = load_sentence_encoder(model_dir)
    assert vectors.shape == (len(texts), encoder.dim)
    np.testing.assert_allclose(vectors, encoder.encode(texts, prompt_name="document"), atol=1e-5)
    description = json.loads(out.with_suffix(".json").read_text())
    assert (description["count"], description["dim"], description["prompt"]) == (30, encoder.dim,
                                                                                 "search_document: ")

    capsys.readouterr()
    assert run_cli("search", "--model", model_dir, "--corpus", out, "--query", texts[0], "-k", "3", "--json") == 0
    hits = json.loads(capsys.readouterr().out)["hits"]
    query = encoder.encode([texts[0]], prompt_name="query")
    expected = np.argsort(-(vectors @ query[0]), kind="stable")[:3]
    assert [h["index"] for h in hits] == list(expected)
    assert [h["text"] for h in hits] == [texts[i] for i in expected]

    # JSONL with a column; the same texts give the same rows.
    jsonl = tmp_path / "corpus.jsonl"
    jsonl.write_text("".join(json.dumps({"id": i, "body": t}) + "\n" for i, t in enumerate(texts)), encoding="utf-8")
    out2 = tmp_path / "emb2.npy"
    assert run_cli("embed", "--model", model_dir, "--input", jsonl, "--column", "body", "--output", out2,
                   "--prompt-name", "document") == 0
    np.testing.assert_allclose(np.load(out2), vectors, atol=1e-6)

    # Bad input: clear one-line errors (exit status 2), never a silently shorter output.
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"fine\nbroken \xff\xfe bytes\n")
    capsys.readouterr()
    assert run_cli("embed", "--model", model_dir, "--input", bad, "--output", tmp_path / "bad.npy") == 2
    assert "line 2: not UTF-8 (byte 12 is 0xff)" in capsys.readouterr().err
    assert run_cli("embed", "--model", model_dir, "--input", bad, "--output", tmp_path / "bad.npy",
                   "--errors", "replace") == 0
    assert np.load(tmp_path / "bad.npy").shape[0] == 2
    assert run_cli("embed", "--model", model_dir, "--input", jsonl, "--column", "title",
                   "--output", tmp_path / "x.npy") == 2
    assert "row 1: no column 'title'" in capsys.readouterr().err
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    assert run_cli("embed", "--model", model_dir, "--input", empty, "--output", tmp_path / "empty.npy") == 0
    assert np.load(tmp_path / "empty.npy").shape == (0, encoder.dim)
    capsys.readouterr()
    assert run_cli("search", "--model", model_dir, "--corpus", tmp_path / "empty.npy", "--query", "x") == 2
    assert "the corpus is empty" in capsys.readouterr().err
    other = tmp_path / "other.npy"
    np.save(other, np.ones((4, 7), np.float32))
    assert run_cli("search", "--model", model_dir, "--corpus", other, "--query", "x") == 2
    assert "dimension mismatch" in capsys.readouterr().err
    bad = tmp_path / "bad.npy"
    for content, why in ((b"", "no NumPy header"), (b"\x80\x04garbage", "no NumPy header"),
                         (other.read_bytes()[:-20], "not a .npy embedding matrix")):
        bad.write_bytes(content)  # an empty file, random bytes (once "it holds Python objects"), a cut-off matrix
        assert run_cli("search", "--model", model_dir, "--corpus", bad, "--query", "x") == 2
        assert why in capsys.readouterr().err
    assert run_cli("search", "--model", model_dir, "--corpus", tmp_path, "--query", "x") == 2
    assert f"--corpus {tmp_path} is a directory" in capsys.readouterr().err
    truncated = tmp_path / "truncated.npy"
    assert run_cli("embed", "--model", model_dir, "--input", lines, "--output", truncated, "--truncate-dim",
                   "16") == 0
    assert np.load(truncated).shape == (30, 16)
    np.testing.assert_allclose(np.linalg.norm(np.load(truncated), axis=1), 1.0, atol=1e-5)
    description["model_fingerprint"] = "0" * 16  # as if the directory's weights had changed since
    out.with_suffix(".json").write_text(json.dumps(description))
    capsys.readouterr()
    assert run_cli("search", "--model", model_dir, "--corpus", out, "--query", "x") == 2
    assert f"embedded by --model {model_dir} with other weights or settings" in capsys.readouterr().err
    description["model"] = str(tmp_path / "another")  # as if another model of the same size had embedded it
    out.with_suffix(".json").write_text(json.dumps(description))
    assert run_cli("search", "--model", model_dir, "--corpus", out, "--query", "x") == 2
    assert "embedded by another model" in capsys.readouterr().err


def test_search_queries_as_the_corpus_was_embedded_and_never_shows_nan_rows(model_dir, tmp_path, capsys):
    """A corpus embedded with --normalize by a model that does not normalise is searched without repeating the
    flag (the query is normalised as FILE.json says; it used to be refused as "another model"); the opposite
    mismatch names the setting. Corpus rows holding NaN are never hits (no index -1, no -Infinity in --json) and a
    warning counts them."""
    from bertjax.embeddings import save_sentence_encoder

    encoder = load_sentence_encoder(model_dir)
    plain = tmp_path / "plain"
    save_sentence_encoder(encoder.replace(pooling=encoder.pooling.replace(normalize=False)), plain)
    texts = sample_texts(8, seed=7)
    lines = tmp_path / "corpus.txt"
    lines.write_text("\n".join(texts) + "\n", encoding="utf-8")
    out = tmp_path / "emb.npy"
    assert run_cli("embed", "--model", plain, "--input", lines, "--output", out, "--normalize") == 0
    vectors = np.load(out)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    capsys.readouterr()
    assert run_cli("search", "--model", plain, "--corpus", out, "--query", texts[2], "-k", "8", "--json",
                   "--similarity", "dot", "--prompt", "") == 0  # no query prompt: the query is a corpus text
    hits = json.loads(capsys.readouterr().out)["hits"]
    assert hits[0]["index"] == 2 and hits[0]["score"] == pytest.approx(1.0, abs=1e-5)

    unnormalised = tmp_path / "raw.npy"
    assert run_cli("embed", "--model", plain, "--input", lines, "--output", unnormalised) == 0
    capsys.readouterr()
    assert run_cli("search", "--model", plain, "--corpus", unnormalised, "--query", "x", "--normalize") == 2
    assert "with other settings: normalized False (now True)" in capsys.readouterr().err

    broken = vectors.copy()
    broken[[1, 5]] = np.nan
    np.save(out, broken)
    assert run_cli("search", "--model", plain, "--corpus", out, "--query", texts[0], "-k", "8", "--json") == 0
    captured = capsys.readouterr()
    line = captured.out.strip()
    assert "Infinity" not in line and "NaN" not in line
    hits = json.loads(line)["hits"]
    assert sorted(h["index"] for h in hits) == [0, 2, 3, 4, 6, 7]
    assert [h["text"] for h in hits] == [texts[h["index"]] for h in hits]
    assert "warning: --corpus" in captured.err and "2 of 8 corpus rows hold NaN" in captured.err


def test_search_ranks_as_the_model_compares_unless_told_otherwise(model_dir, tmp_path, capsys):
    """A model trained with dot-product scores (similarity_fn_name "dot", recorded in FILE.json) is searched by dot
    product without --similarity, as sentence-transformers' `similarity` ranks; --similarity cosine overrides. It
    used to rank by cosine whatever the model said."""
    from bertjax.embeddings import save_sentence_encoder

    encoder = load_sentence_encoder(model_dir)
    dot_model = tmp_path / "dot"
    save_sentence_encoder(encoder.replace(pooling=encoder.pooling.replace(normalize=False),
                                          similarity_fn_name="dot"), dot_model)
    texts = sample_texts(24, seed=11)
    lines = tmp_path / "corpus.txt"
    lines.write_text("\n".join(texts) + "\n", encoding="utf-8")
    out = tmp_path / "emb.npy"
    assert run_cli("embed", "--model", dot_model, "--input", lines, "--output", out) == 0
    assert json.loads(out.with_suffix(".json").read_text())["similarity_fn_name"] == "dot"
    corpus = np.load(out)
    query = load_sentence_encoder(dot_model).encode([texts[0]], prompt_name="query")[0]
    by_dot = list(np.argsort(-(corpus @ query), kind="stable")[:5])
    unit = corpus / np.linalg.norm(corpus, axis=1, keepdims=True)
    by_cosine = list(np.argsort(-(unit @ (query / np.linalg.norm(query))), kind="stable")[:5])
    assert by_dot != by_cosine  # the two rankings differ on this corpus, so the test tells them apart
    for flags, expected in (([], by_dot), (["--similarity", "cosine"], by_cosine)):
        capsys.readouterr()
        assert run_cli("search", "--model", dot_model, "--corpus", out, "--query", texts[0], "-k", "5", "--json",
                       *flags) == 0
        assert [h["index"] for h in json.loads(capsys.readouterr().out)["hits"]] == expected, flags


# ---------------------------------------------------------------------------------------------------------------
# Data parallel.

def test_search_into_a_pipe_whose_reader_exited_ends_quietly_with_sigpipes_status(model_dir, tmp_path):
    """`bertjax search ... | head -1` once head has exited: status 141 (128 + SIGPIPE, as `yes | head` leaves `yes`),
    and no traceback or "Exception ignored" message on stderr."""
    texts = sample_texts(12, seed=3)
    lines = tmp_path / "corpus.txt"
    lines.write_text("\n".join(texts) + "\n", encoding="utf-8")
    assert run_cli("embed", "--model", model_dir, "--input", lines, "--output", tmp_path / "emb.npy") == 0
    search = subprocess.Popen([sys.executable, "-m", "bertjax", "search", "--model", str(model_dir), "--corpus",
                               str(tmp_path / "emb.npy"), "--query", texts[0], "-k", "12"],
                              env=cpu_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    search.stdout.close()  # the reader is gone before the first result is printed
    errors = search.stderr.read()
    assert search.wait(timeout=120) == 141, errors
    assert "Traceback" not in errors and "Exception ignored" not in errors, errors


def test_data_parallel_over_four_devices_equals_one(tmp_path):
    """In a process with 4 CPU devices: batches are split over a 4-device data mesh and give the outputs of a
    one-device mesh."""
    script = textwrap.dedent("""
        import jax, jax.numpy as jnp, numpy as np
        from bertjax.config import get_config
        from bertjax.embeddings import EncoderForEmbedding, PoolingConfig
        from bertjax.embeddings.embed import embedding_row_fn
        from bertjax.inference import BucketConfig, TextInference, data_mesh
        from bertjax.models import abstract_params
        assert jax.device_count() == 4, jax.devices()
        model = EncoderForEmbedding(get_config("bert-tiny", max_position_embeddings=64),
                                    pooling=PoolingConfig(modes=("mean", "cls")))
        rng = np.random.default_rng(0)
        params = jax.tree.map(lambda s: jnp.asarray(rng.normal(0, 0.2, s.shape), s.dtype), abstract_params(model))
        from bertjax.data.special_template import bert_template
        class Tok: pad_id, cls_id, sep_id, special_template = 0, 1, 2, bert_template(1, 2)
        texts = [rng.integers(5, 128, n).astype(np.int32) for n in rng.integers(0, 40, 30)]
        outs = []
        for devices in (jax.devices(), jax.devices()[:1]):
            inference = TextInference(embedding_row_fn(model), Tok, 48, mesh=data_mesh(devices),
                                      buckets=BucketConfig(lengths=(48,), max_tokens=192, max_segments=4))
            assert all(rows % len(devices) == 0 for rows in inference.plan.rows.values())
            outs.append(inference.run_tokens(inference.runner.place_params(params), texts).segments["embedding"])
        assert outs[0].shape == (30, 64)
        np.testing.assert_allclose(outs[0], outs[1], atol=1e-5)
        print("ok")
    """)
    result = subprocess.run([sys.executable, "-c", script], env=cpu_env(devices=4), capture_output=True, text=True,
                            timeout=900)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]


# ---------------------------------------------------------------------------------------------------------------
# Fill-mask on the same path.

def test_fill_mask_packed_equals_the_model_on_each_text():
    """`bertjax fill-mask`'s predictor runs through TextInference (several texts packed per row); its top-k at
    each [MASK] equals a plain forward of each text alone (softmax over non-special tokens)."""
    import bertjax
    from bertjax.inference.fill_mask import encode_with_masks, make_predictor
    from bertjax.data import load_tokenizer
    from train_helpers import small_tokenizer

    tokenizer = load_tokenizer(small_tokenizer())
    config = get_config("bert-tiny", vocab_size=tokenizer.vocab_size, pad_token_id=tokenizer.pad_id)
    model = bertjax.EncoderForMaskedLM(config)
    params = random_params(model, seed=2)
    texts = ["The [MASK] statement ends a loop.", "A [MASK] returns [MASK] value from the function.", "[MASK]"]
    got = make_predictor(model, params, tokenizer).many(texts, 4)
    banned = np.zeros(config.vocab_size, bool)
    banned[tokenizer.special_ids] = True
    forward = jax.jit(lambda p, ids: model.apply({"params": p}, ids, token_type_ids=jnp.zeros_like(ids)).logits)
    for text, predictions in zip(texts, got):
        ids, masks = encode_with_masks(tokenizer, text)
        logits = np.asarray(forward(params, ids[None]))[0].astype(np.float64)
        logits[:, banned] = -np.inf
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        assert len(predictions) == len(masks)
        for position, options in zip(masks, predictions):
            ranked = np.argsort(-probs[position], kind="stable")[:20]  # pieces that decode to nothing are skipped
            expected = [t for t in ranked if tokenizer.decode([int(t)]).strip()][:4]
            assert [o.token_id for o in options] == list(expected) and len(options) == 4
            np.testing.assert_allclose([o.probability for o in options], probs[position][expected], rtol=1e-4)


def test_fill_mask_projects_only_its_mask_slots_onto_the_vocabulary():
    """The vocabulary projection (and its softmax and top-k) is most of a fill-mask row's cost at every token: the
    row function computes it at the row's mask slots only, and gives the other tokens zeros."""
    import bertjax
    from bertjax.inference.fill_mask import fill_mask_row_fn

    config = get_config("bert-tiny", vocab_size=211)
    model = bertjax.EncoderForMaskedLM(config)
    params = random_params(model, seed=2)
    ids = np.full((2, 24), 7, np.int32)
    ids[0, [3, 9]] = ids[1, 5] = 4  # mask id 4: two masks in row 0, one in row 1
    batch = {"input_ids": ids, "segment_ids": np.ones_like(ids)}
    row_fn = fill_mask_row_fn(model, (0, 4), 211, 8, 4, 2)
    shapes = [v.aval.shape for e in jax.make_jaxpr(row_fn, static_argnums=2)(params, batch, 1).eqns
              for v in e.outvars]
    assert (2, 2, 211) in shapes and not [s for s in shapes if s[-2:] == (24, 211)]
    tokens = jax.jit(row_fn, static_argnums=2)(params, batch, 1)["tokens"]
    full = jax.nn.softmax(np.where(np.isin(np.arange(211), [0, 4]), -np.inf,
                                   model.apply({"params": params}, ids).logits), axis=-1)
    for row, position in ((0, 3), (0, 9), (1, 5)):
        np.testing.assert_allclose(tokens["top_probs"][row, position], np.sort(full[row, position])[::-1][:8],
                                   rtol=1e-5)
    assert not np.asarray(tokens["top_probs"])[1, [0, 3, 9]].any()


# ---------------------------------------------------------------------------------------------------------------
# Task-head prediction (`bertjax predict`) on the same path.

TASK_HEADS = ("sequence-classification", "token-classification", "question-answering")


def padded_examples(config, lengths, width: int) -> dict[str, np.ndarray]:
    """Rows as the fine-tuning tasks encode them: [CLS] a [SEP] b [SEP] at the start of each row (token type 1 on
    the second part), 0 on padding."""
    rng = np.random.default_rng(3)
    arrays = {key: np.zeros((len(lengths), width), np.int32) for key in ("input_ids", "segment_ids", "token_type_ids")}
    for i, n in enumerate(lengths):
        arrays["input_ids"][i, :n] = np.concatenate([[1], rng.integers(5, config.vocab_size, n - 2), [2]])
        arrays["segment_ids"][i, :n] = 1
        arrays["token_type_ids"][i, n // 2:n] = 1 if config.type_vocab_size > 1 else 0
    return arrays


@pytest.mark.parametrize("family", ("bert-tiny", "modernbert-tiny"))
@pytest.mark.parametrize("task_name", TASK_HEADS)
def test_packed_task_prediction_equals_each_example_alone(family, task_name):
    """bertjax.finetune.inference packs examples several per row (segment ids, positions restarting per example)
    and gives each example the outputs the model gives it alone in a padded row of the task's width: per-example
    logits of the classification head (it pools each packed segment), per-token logits of tagging and QA at every
    real token (padding positions re-padded below any real logit). Output order and count equal the input's."""
    from bertjax.config import TaskConfig as HeadConfig
    from bertjax.finetune.config import FinetuneDataConfig, FinetuneTaskConfig
    from bertjax.finetune.inference import PAD_LOGIT, predict_outputs
    from bertjax.finetune.tasks import Encoded, task_class
    from bertjax.models import MODEL_CLASSES

    task = task_class(task_name)(FinetuneDataConfig(), FinetuneTaskConfig())
    config = get_config(family, max_position_embeddings=64, pad_token_id=0, task=HeadConfig(num_labels=3))
    model = MODEL_CLASSES[task.head](config)
    params = random_params(model, seed=4)
    width = 32
    lengths = (3, 17, 5, 32, 9, 2, 12, 4, 30, 6, 8)  # packed: several per row, one row of the full width
    arrays = padded_examples(config, lengths, width)
    encoded = Encoded(arrays, examples=[None] * len(lengths))
    packed = predict_outputs(model, params, task, encoded, IdTokenizer, max_tokens=4 * width)

    kwargs = {"token_type_ids": arrays["token_type_ids"]} if config.type_vocab_size else {}
    alone = jax.jit(lambda p, ids, seg, **kw: task.host_outputs(model.apply({"params": p}, ids, segment_ids=seg, **kw)))
    for i, n in enumerate(lengths):
        one = alone(params, arrays["input_ids"][i:i + 1], arrays["segment_ids"][i:i + 1],
                    **{k: v[i:i + 1] for k, v in kwargs.items()})
        for name, expected in one.items():
            got = packed[name][i]
            assert packed[name].shape[0] == len(lengths), (name, packed[name].shape)
            expected = np.asarray(expected)[0]
            if task.prediction_unit == "tokens":
                assert np.all(got[n:] == PAD_LOGIT)
                got, expected = got[:n], expected[:n]
            np.testing.assert_allclose(got, expected, atol=2e-5, err_msg=f"{family} {task_name} {name} example {i}")


def test_predict_command_packs_and_keeps_input_order(tmp_path):
    """`bertjax predict` on a saved sequence-classification model: one record per input line, in input order, with
    the label and probabilities the model gives each text alone (an empty text included)."""
    import bertjax
    from bertjax.finetune.prediction import predict
    from bertjax.config import TaskConfig as HeadConfig
    from bertjax.data.tokenizers import WordPieceTokenizer
    from bertjax.models import MODEL_CLASSES

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS
    config = get_config("bert-tiny", vocab_size=len(vocab), pad_token_id=0, max_position_embeddings=128,
                        task=HeadConfig(num_labels=3, labels=("neg", "neu", "pos")))
    model = MODEL_CLASSES["sequence_classification"](config)
    params = random_params(model, seed=5)
    bertjax.save_pretrained(str(tmp_path / "model"), model, params)
    tokenizer = WordPieceTokenizer("\n".join(vocab))
    tokenizer.save(tmp_path / "model")
    rng = np.random.default_rng(6)
    texts = [" ".join(rng.choice(WORDS, int(n))) for n in rng.integers(0, 20, 40)]
    texts[7] = ""
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    records = predict(tmp_path / "model", tmp_path / "in.jsonl", max_tokens=128)
    assert len(records) == len(texts)
    # Each text alone in its own row, padded (segment id 0) to the longest: one compiled forward for all of them,
    # where a row of each text's own length compiled a program per length.
    encoded = [np.asarray([tokenizer.cls_id, *tokenizer.encode(text), tokenizer.sep_id], np.int32) for text in texts]
    width = max(map(len, encoded))
    ids = np.zeros((len(texts), width), np.int32)
    segments = np.zeros((len(texts), width), np.int32)
    for row, one in enumerate(encoded):
        ids[row, :len(one)], segments[row, :len(one)] = one, 1
    assert segments[:, -1].any() and not segments.all()  # the longest fills its row, the others are padded
    all_logits = np.asarray(jax.jit(lambda p, ids, seg: model.apply(
        {"params": p}, ids, segment_ids=seg, token_type_ids=jnp.zeros_like(ids)).logits)(params, ids, segments))
    for text, record, logits in zip(texts, records, all_logits.astype(np.float64)):
        probs = np.exp(logits - logits.max())
        probs /= probs.sum()
        assert record["label"] == ("neg", "neu", "pos")[int(probs.argmax())], text
        np.testing.assert_allclose([record["scores"][k] for k in ("neg", "neu", "pos")], probs, atol=1e-5)
