"""Sentence embeddings against sentence-transformers itself (6.x, PyTorch, CPU) on tiny random-weight models.

One tiny BERT with a real WordPiece tokenizer is built once per module and wrapped in sentence-transformers' own
modules (Transformer, Pooling, Dense, Normalize); each test saves such a pipeline with `SentenceTransformer.save`,
loads it with `bertjax.embeddings.load_sentence_encoder` and compares float32 embeddings of the same texts through
the real tokenizer (empty text, truncated text, upper case included). Packed rows are checked against one text per
row for BERT and ModernBERT at the model level, with every pooling mode at once.
"""

from __future__ import annotations

import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.config import get_config
from bertjax.embeddings import (DenseConfig, EncoderForEmbedding, PoolingConfig, load_sentence_encoder,
                                save_sentence_encoder)
from bertjax.models import abstract_params
from bertjax.models.pooling import POOLING_MODES

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("sentence_transformers")
from sentence_transformers import SentenceTransformer  # noqa: E402
from sentence_transformers.sentence_transformer.modules import Dense, Normalize, Pooling, Transformer  # noqa: E402

ATOL = 1e-4  # float32, max abs difference
HIDDEN = 32
MAX_SEQ_LENGTH = 24
ALL_MODES = tuple(POOLING_MODES)  # cls, max, mean, mean_sqrt_len_tokens, weightedmean, lasttoken
WORDS = ("the a of and to in is it that for on with as was this cat dog sat mat hello world query document search "
         "passage quick brown fox jumps over lazy custom prefix").split()
TEXTS = ["hello world", "", "The quick brown fox jumps over the lazy dog " * 3, "a cat sat on the mat.",
         "Search THIS document", "dog"]
PROMPTS = {"query": "query: ", "document": "search_document: "}


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    """A random-weight BertModel (every parameter perturbed) and a cased WordPiece tokenizer, as transformers
    saves them."""
    directory = tmp_path_factory.mktemp("bert")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"abcdefghijklmnopqrstuvwxyz.,:!?'_",
             *("##" + c for c in "abcdefghijklmnopqrstuvwxyz"), *WORDS]
    tokenizer = transformers.BertTokenizerFast(vocab={token: i for i, token in enumerate(vocab)}, do_lower_case=False)
    config = transformers.BertConfig(vocab_size=len(vocab), hidden_size=HIDDEN, num_attention_heads=4,
                                     num_hidden_layers=2, intermediate_size=64, max_position_embeddings=64,
                                     attn_implementation="eager")
    torch.manual_seed(0)
    model = transformers.BertModel(config)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn(parameter.shape) * 0.02)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def transformer(hf_dir):
    return Transformer(str(hf_dir), max_seq_length=MAX_SEQ_LENGTH)


def saved(tmp_path, name: str, modules, **settings) -> tuple[SentenceTransformer, str]:
    model = SentenceTransformer(modules=modules, **settings)
    model.eval()
    path = str(tmp_path / name)
    model.save(path)
    return model, path


def assert_close(ours: np.ndarray, reference: np.ndarray, what: str) -> None:
    assert ours.shape == reference.shape, (what, ours.shape, reference.shape)
    error = np.abs(ours - reference).max()
    assert error <= ATOL, f"{what}: max abs difference {error:.2e}"


@pytest.mark.parametrize("include_prompt", [True, False])
def test_every_pooling_mode_equals_sentence_transformers(tmp_path, transformer, include_prompt):
    # Every mode concatenated in one Pooling module: one compiled model checks them all, and the order too.
    reference, path = saved(tmp_path, "st", [transformer, Pooling(HIDDEN, pooling_mode=ALL_MODES,
                                                                  include_prompt=include_prompt)], prompts=PROMPTS)
    encoder = load_sentence_encoder(path)
    assert encoder.pooling == PoolingConfig(modes=ALL_MODES, include_prompt=include_prompt)
    assert encoder.max_seq_length == MAX_SEQ_LENGTH and encoder.dim == len(ALL_MODES) * HIDDEN
    for prompt_name in (None, "query"):
        expected = reference.encode(TEXTS, prompt_name=prompt_name)
        ours = encoder.encode(TEXTS, prompt_name=prompt_name)
        for i, mode in enumerate(ALL_MODES):
            span = slice(i * HIDDEN, (i + 1) * HIDDEN)
            assert_close(ours[:, span], expected[:, span], f"{mode} (prompt {prompt_name})")


@pytest.fixture(scope="module")
def dense_pipeline(tmp_path_factory, transformer):
    """Pooling (mean, max) -> Dense tanh -> Dense GELU -> Normalize, with prompts and a default prompt."""
    torch.manual_seed(1)
    modules = [transformer, Pooling(HIDDEN, pooling_mode=("mean", "max")), Dense(2 * HIDDEN, 16),
               Dense(16, 12, activation_function=torch.nn.GELU()), Normalize()]
    reference, path = saved(tmp_path_factory.mktemp("dense"), "st", modules, prompts=PROMPTS,
                            default_prompt_name="query")
    return reference, load_sentence_encoder(path)


def test_dense_normalize_and_prompts_equal_sentence_transformers(dense_pipeline):
    reference, encoder = dense_pipeline
    assert encoder.dense == (DenseConfig(64, 16), DenseConfig(16, 12, activation="gelu"))
    assert encoder.pooling.normalize and encoder.default_prompt_name == "query"
    assert_close(encoder.encode(TEXTS), reference.encode(TEXTS), "default prompt")
    assert_close(encoder.encode(TEXTS, prompt_name="document"), reference.encode(TEXTS, prompt_name="document"),
                 "named prompt")
    assert_close(encoder.encode(TEXTS, prompt="custom prefix: "), reference.encode(TEXTS, prompt="custom prefix: "),
                 "explicit prompt")
    assert encoder.prompt_length("query: ") == 3  # [CLS] query :
    features = reference.preprocess(TEXTS, prompt="query: ")  # the transformers tokenizer, padded
    ours = encoder.tokenize(TEXTS, prompt="query: ")
    assert [ids.tolist() for ids in ours] == [row[mask == 1].tolist() for row, mask in
                                              zip(features["input_ids"].numpy(), features["attention_mask"].numpy())]
    assert features["prompt_length"] == 3 and max(map(len, ours)) == MAX_SEQ_LENGTH and 1 not in ours[0]
    with pytest.raises(ValueError, match="not one of the model's prompts"):
        encoder.encode(TEXTS, prompt_name="passage")
    vectors = reference.encode(TEXTS, normalize_embeddings=False) * np.arange(1, 13)  # not unit length
    for name in ("cosine", "dot", "euclidean", "manhattan"):
        reference.similarity_fn_name = name
        assert_close(np.asarray(encoder.replace(similarity_fn_name=name).similarity(vectors[:2], vectors[2:])),
                     reference.similarity(vectors[:2], vectors[2:]).numpy(), f"{name} similarity")
    reference.similarity_fn_name = "cosine"


def test_matryoshka_truncation_renormalises(dense_pipeline):
    reference, encoder = dense_pipeline
    truncated = encoder.replace(pooling=encoder.pooling.replace(truncate_dim=5))
    ours = truncated.encode(TEXTS)
    assert ours.shape == (len(TEXTS), 5)
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)
    assert_close(ours, reference.encode(TEXTS, truncate_dim=5, normalize_embeddings=True), "truncate_dim=5")
    with pytest.raises(ValueError, match="exceeds the embedding size"):
        encoder.replace(pooling=encoder.pooling.replace(truncate_dim=13))


def test_round_trip_through_sentence_transformers(tmp_path, dense_pipeline):
    _, encoder = dense_pipeline
    # Lower-casing changes the tokens here (the vocabulary is lower case, the tokenizer cased).
    encoder = encoder.replace(do_lower_case=True, similarity_fn_name="dot")
    save_sentence_encoder(encoder, tmp_path / "out")
    reloaded_st = SentenceTransformer(str(tmp_path / "out"))
    assert reloaded_st.similarity_fn_name == "dot"
    ours = encoder.encode(TEXTS)
    assert not np.allclose(ours, dense_pipeline[1].encode(TEXTS), atol=1e-3)  # do_lower_case did something
    assert_close(ours, reloaded_st.encode(TEXTS), "sentence-transformers loading bertjax's save")
    assert_close(encoder.encode(TEXTS, prompt_name="document"),
                 reloaded_st.encode(TEXTS, prompt_name="document"), "saved prompts")
    reloaded = load_sentence_encoder(tmp_path / "out")
    assert (reloaded.pooling, reloaded.dense, reloaded.max_seq_length, reloaded.do_lower_case, dict(reloaded.prompts),
            reloaded.default_prompt_name, reloaded.similarity_fn_name) == (
        encoder.pooling, encoder.dense, encoder.max_seq_length, True, PROMPTS, "query", "dot")
    assert_close(reloaded.encode(TEXTS), ours, "bertjax reloading its own save")


def test_do_lower_case_lowercases_as_sentence_transformers_does(tmp_path, hf_dir):
    """sentence-transformers 6 lowercases with the tokenizers library, one character at a time; str.lower() would
    turn a word-final capital sigma into the final form, another token of a Greek vocabulary."""
    directory = tmp_path / "greek"
    shutil.copytree(hf_dir, directory)
    described = json.loads((directory / "tokenizer.json").read_text())
    vocab = described["model"]["vocab"]
    last = sorted(vocab, key=vocab.get)[-2:]  # two whole words become the two spellings
    for old, new in zip(last, ("σοφοσ", "σοφος")):
        vocab[new] = vocab.pop(old)
    (directory / "tokenizer.json").write_text(json.dumps(described))
    _, path = saved(tmp_path, "st", [Transformer(str(directory), max_seq_length=MAX_SEQ_LENGTH), Pooling(HIDDEN)])
    # As older releases save it: do_lower_case in sentence_bert_config.json, a tokenizer.json that keeps case.
    settings = json.loads((tmp_path / "st" / "sentence_bert_config.json").read_text())
    (tmp_path / "st" / "sentence_bert_config.json").write_text(json.dumps({**settings, "do_lower_case": True}))
    reference, encoder = SentenceTransformer(path), load_sentence_encoder(path)
    assert encoder.do_lower_case
    texts = ["ΣΟΦΟΣ", "the ΣΟΦΟΣ cat"]
    expected = reference.tokenize(texts)["input_ids"].numpy()
    for ours, theirs in zip(encoder.tokenize(texts), expected):
        assert ours.tolist() == theirs[theirs != 0].tolist()
    assert vocab["σοφοσ"] in encoder.tokenize(texts)[0]
    assert_close(encoder.encode(texts), reference.encode(texts), "Greek capitals lowercased")


def test_plain_transformers_and_bertjax_directories_use_mean_pooling(tmp_path, hf_dir):
    from bertjax.model_dirs import load_model_dir, save_model_dir

    reference = SentenceTransformer(str(hf_dir))  # sentence-transformers wraps it with mean pooling
    encoder = load_sentence_encoder(hf_dir)
    assert encoder.pooling == PoolingConfig() and encoder.max_seq_length == reference.max_seq_length == 64
    expected = reference.encode(TEXTS)
    assert_close(encoder.encode(TEXTS, batch_size=4), expected, "transformers directory")
    save_model_dir(tmp_path / "bertjax", *load_model_dir(hf_dir))
    assert_close(load_sentence_encoder(tmp_path / "bertjax").encode(TEXTS), expected, "bertjax model directory")
    # bfloat16 compute, float32 pooling and output: close to float32, not equal.
    fast = load_sentence_encoder(hf_dir, dtype="bfloat16")
    assert fast.config.dtype == "bfloat16" and fast.encode(TEXTS).dtype == np.float32
    np.testing.assert_allclose(fast.encode(TEXTS), expected, atol=5e-2)


def test_legacy_directory_layout(tmp_path, transformer):
    """The layout of older sentence-transformers releases still on the Hub: the Transformer in 0_Transformer/,
    max_seq_length and do_lower_case in sentence_bert_config.json, Pooling as pooling_mode_* booleans."""
    _, path = saved(tmp_path, "new", [transformer, Pooling(HIDDEN, pooling_mode=("cls", "mean"))])
    root = tmp_path / "new"
    (root / "0_Transformer").mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        shutil.move(root / name, root / "0_Transformer" / name)
    (root / "0_Transformer" / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": 16, "do_lower_case": True}))
    (root / "sentence_bert_config.json").unlink()
    modules = json.loads((root / "modules.json").read_text())
    modules[0].update(path="0_Transformer", type="sentence_transformers.models.Transformer")
    modules[1].update(type="sentence_transformers.models.Pooling")
    (root / "modules.json").write_text(json.dumps(modules))
    legacy_pooling = {key: key in ("pooling_mode_cls_token", "pooling_mode_mean_tokens")
                      for key in ("pooling_mode_cls_token", "pooling_mode_max_tokens", "pooling_mode_mean_tokens",
                                  "pooling_mode_mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens",
                                  "pooling_mode_lasttoken")}
    (root / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": HIDDEN,
                                                                **legacy_pooling}))
    encoder = load_sentence_encoder(path)
    assert (encoder.pooling.modes, encoder.max_seq_length, encoder.do_lower_case) == (("cls", "mean"), 16, True)
    assert_close(encoder.encode(TEXTS), SentenceTransformer(path).encode(TEXTS), "legacy layout")


# ---------------------------------------------------------------------------------------------------------------
# Packed rows.

# 3 layers: local-window layers (window 8) between global ones, and RoPE positions restarting per text.
TINY_MODERNBERT = dict(vocab_size=97, hidden_size=HIDDEN, num_layers=3, num_heads=4, intermediate_size=48,
                       max_position_embeddings=128, local_window=8, pad_token_id=0)
LENGTHS = (5, 1, 9, 3, 12, 2)
PROMPT_LENGTHS = (2, 0, 3, 1, 2, 2)  # the last text is all prompt: nothing left to pool but its fallback
PACKING = ((0, 1, 2), (3, 4), (5,))  # texts per packed row (15, 15 and 2 tokens)
ROWS, SEQ, SLOTS = len(LENGTHS), 16, 4


def one_per_row_and_packed(seed: int):
    rng = np.random.default_rng(seed)
    texts = [rng.integers(5, 97, n).astype(np.int32) for n in LENGTHS]
    layouts = []
    for groups in ([(i,) for i in range(len(texts))], PACKING):
        ids = np.zeros((ROWS, SEQ), np.int32)
        segments = np.zeros((ROWS, SEQ), np.int32)
        prompts = np.zeros((ROWS, SLOTS), np.int32)
        where = {}
        for row, group in enumerate(groups):
            start = 0
            for slot, i in enumerate(group):
                ids[row, start:start + LENGTHS[i]] = texts[i]
                segments[row, start:start + LENGTHS[i]] = slot + 1
                prompts[row, slot] = PROMPT_LENGTHS[i]
                where[i] = (row, slot)
                start += LENGTHS[i]
        layouts.append((ids, segments, prompts, where))
    return layouts


def packed_model(family: str, hf_dir):
    """(model, params, embed function) with every pooling mode, prompts excluded, normalised: BERT through the
    public SentenceEncoder.embed_rows of the shared checkpoint, ModernBERT as a freshly initialised model with a
    Dense layer."""
    pooling = PoolingConfig(modes=ALL_MODES, include_prompt=False, normalize=True)
    if family == "bert":
        encoder = load_sentence_encoder(hf_dir).replace(pooling=pooling)
        return encoder.params, jax.jit(encoder.embed_rows, static_argnames="max_segments")
    model = EncoderForEmbedding(get_config("modernbert-base", **TINY_MODERNBERT), pooling=pooling,
                                dense=(DenseConfig(len(ALL_MODES) * HIDDEN, 16),))
    embed = jax.jit(lambda p, ids, seg, max_segments, prompts: model.apply({"params": p}, ids, seg, max_segments,
                                                                            prompts), static_argnums=3)
    # Random values of the parameters' shapes: tracing shapes is far cheaper than running `init` op by op.
    rng = np.random.default_rng(0)
    params = jax.tree.map(lambda spec: jnp.asarray(rng.normal(0.0, 0.2, spec.shape), spec.dtype),
                          abstract_params(model))
    return params, embed


@pytest.mark.parametrize("family", ["bert", "modernbert"])
def test_packed_rows_equal_one_text_per_row(family, hf_dir):
    params, embed = packed_model(family, hf_dir)
    outputs = []
    for ids, segments, prompts, where in one_per_row_and_packed(seed=1):
        out = np.asarray(embed(params, jnp.asarray(ids), jnp.asarray(segments), SLOTS, jnp.asarray(prompts)))
        used = set(where.values())
        empty = [(r, s) for r in range(ROWS) for s in range(SLOTS) if (r, s) not in used]
        assert all(not out[r, s].any() for r, s in empty), "empty slots hold zeros"
        outputs.append(np.stack([out[where[i]] for i in range(len(LENGTHS))]))
    single, packed = outputs
    assert np.isfinite(single).all()
    np.testing.assert_allclose(np.linalg.norm(single, axis=-1), 1.0, atol=1e-5)
    np.testing.assert_allclose(packed, single, atol=ATOL)


def test_pool_sentences_modes_on_a_hand_computed_row():
    """One packed row, two texts, against plain numpy: each mode's definition, prompt exclusion included."""
    from bertjax.models.pooling import pool_sentences

    x = np.arange(7 * 2, dtype=np.float32).reshape(1, 7, 2) % 5 - 2.0
    segments = np.array([[1, 1, 1, 2, 2, 2, 0]], np.int32)
    prompts = np.array([[1, 0]], np.int32)  # text 1's first token is a prompt token
    pool = jax.jit(pool_sentences, static_argnums=(2, 3))
    out = np.asarray(pool(jnp.asarray(x), jnp.asarray(segments), 2, ALL_MODES, jnp.asarray(prompts)))
    for slot, (tokens, weights) in enumerate((([1, 2], [2, 3]), ([3, 4, 5], [1, 2, 3]))):
        rows = x[0, tokens]
        expected = {"cls": rows[0], "max": rows.max(0), "mean": rows.mean(0),
                    "mean_sqrt_len_tokens": rows.sum(0) / np.sqrt(len(tokens)),
                    "weightedmean": (rows * np.array(weights)[:, None]).sum(0) / sum(weights), "lasttoken": rows[-1]}
        for i, mode in enumerate(ALL_MODES):
            np.testing.assert_allclose(out[0, slot, 2 * i:2 * i + 2], expected[mode], atol=1e-6, err_msg=mode)


# ---------------------------------------------------------------------------------------------------------------
# Bad input.

def test_configs_reject_bad_values():
    with pytest.raises(ValueError, match="unknown \\['median'\\]"):
        PoolingConfig(modes=("median",))
    with pytest.raises(ValueError, match="truncate_dim must be positive"):
        PoolingConfig(truncate_dim=0)
    with pytest.raises(ValueError, match="DenseConfig.activation"):
        DenseConfig(4, 4, activation="swish")


def corrupt(source: str, target, path: str, value) -> str:
    shutil.copytree(source, target)
    file = target / path
    file.write_text(value if isinstance(value, str) else json.dumps(value))
    return str(target)


def test_processing_kwargs_max_length_cuts_texts_as_sentence_transformers_does(tmp_path, hf_dir, caplog):
    """sentence-transformers 6 reads a text's length from processing_kwargs over max_seq_length; query_length
    applies only in its encode_query, which bertjax does not have: said on load."""
    module = Transformer(str(hf_dir), max_seq_length=MAX_SEQ_LENGTH, processing_kwargs={"text": {"max_length": 8}},
                         query_length=6)
    reference, path = saved(tmp_path, "st", [module, Pooling(HIDDEN)])
    with caplog.at_level("WARNING", logger="bertjax.embeddings.sentence_transformers_dir"):
        encoder = load_sentence_encoder(path)
    assert encoder.max_seq_length == 8 and "query_length 6 applies in sentence-transformers' encode_query" \
        in caplog.text
    assert_close(encoder.encode(TEXTS), reference.encode(TEXTS), "processing_kwargs max_length 8")


def test_bad_directories_give_clear_errors(tmp_path, transformer):
    _, good = saved(tmp_path, "good", [transformer, Pooling(HIDDEN), Dense(HIDDEN, 8)])
    modules = json.loads((tmp_path / "good" / "modules.json").read_text())
    with pytest.raises(FileNotFoundError, match="no such directory"):
        load_sentence_encoder(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="not a pretraining workdir"):
        load_sentence_encoder(tmp_path / "empty")
    with pytest.raises(ValueError, match="modules.json: invalid JSON"):
        load_sentence_encoder(corrupt(good, tmp_path / "a", "modules.json", "[{"))
    unknown = [*modules[:1], {**modules[1], "type": "sentence_transformers.models.WordWeights"}, *modules[2:]]
    with pytest.raises(ValueError, match="'sentence_transformers.models.WordWeights'; bertjax reads"):
        load_sentence_encoder(corrupt(good, tmp_path / "b", "modules.json", unknown))
    with pytest.raises(ValueError, match="a Pooling module must follow the Transformer"):
        load_sentence_encoder(corrupt(good, tmp_path / "c", "modules.json", [modules[0], modules[2], modules[1]]))
    with pytest.raises(ValueError, match="unknown \\['median'\\]"):
        load_sentence_encoder(corrupt(good, tmp_path / "d", "1_Pooling/config.json",
                                      {"embedding_dimension": HIDDEN, "pooling_mode": "median"}))
    with pytest.raises(ValueError, match="activation_function 'mypackage.Swish' is not one of"):
        load_sentence_encoder(corrupt(good, tmp_path / "e", "2_Dense/config.json",
                                      {"in_features": HIDDEN, "out_features": 8, "activation_function":
                                       "mypackage.Swish"}))
    with pytest.raises(ValueError, match="activation_function 'mypackage.layers.ReLU' is not one of"):
        # a torch name in another package: sentence-transformers would not import it (Tanh instead)
        load_sentence_encoder(corrupt(good, tmp_path / "e2", "2_Dense/config.json",
                                      {"in_features": HIDDEN, "out_features": 8, "activation_function":
                                       "mypackage.layers.ReLU"}))
    settings = json.loads((tmp_path / "good" / "sentence_bert_config.json").read_text())
    with pytest.raises(ValueError, match=r"processing_kwargs.text sets \['add_special_tokens'\], which bertjax"):
        load_sentence_encoder(corrupt(good, tmp_path / "e3", "sentence_bert_config.json",
                                      {**settings, "processing_kwargs": {"text": {"add_special_tokens": False}}}))
    with pytest.raises(ValueError, match="query_expansion is ColBERT-style"):
        load_sentence_encoder(corrupt(good, tmp_path / "e4", "sentence_bert_config.json",
                                      {**settings, "query_expansion": {"length": 32}}))
    with pytest.raises(ValueError, match="linear.weight has shape \\(8, 32\\), config.json says \\(9, 32\\)"):
        load_sentence_encoder(corrupt(good, tmp_path / "f", "2_Dense/config.json",
                                      {"in_features": HIDDEN, "out_features": 9}))
    with pytest.raises(ValueError, match="default_prompt_name 'query' is not one of the prompts"):
        load_sentence_encoder(corrupt(good, tmp_path / "g", "config_sentence_transformers.json",
                                      {"prompts": {"document": "doc: "}, "default_prompt_name": "query"}))
    shutil.copytree(good, tmp_path / "h")
    (tmp_path / "h" / "2_Dense" / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="no weights found"):
        load_sentence_encoder(tmp_path / "h")


def test_a_tokenizer_that_lays_texts_out_otherwise_is_refused_not_embedded_wrongly():
    """XLNet's tokenizer builds `text <sep> <cls>` with <cls> of token type 2, where the embedding path builds
    [CLS] text [SEP] of type 0: the embeddings would differ from sentence-transformers' without a sign (1.2 to 3.9
    in an audit), so such a tokenizer is refused by name. The same vocabulary with BERT's layout is accepted."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    from bertjax.data.tokenizers import HuggingFaceTokenizer
    from bertjax.embeddings import SentenceEncoder

    specials = ["<pad>", "<unk>", "<s>", "</s>", "<mask>", "<sep>", "<cls>"]
    vocab = {token: i for i, token in enumerate(specials + list(WORDS))}
    model = EncoderForEmbedding(get_config("bert-tiny", vocab_size=len(vocab), pad_token_id=0,
                                           max_position_embeddings=32), pooling=PoolingConfig(modes=("mean",)))
    params = jax.tree.map(lambda spec: jnp.zeros(spec.shape, spec.dtype), abstract_params(model))

    def tokenizer(post_processor):
        hf = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
        hf.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        hf.post_processor = post_processor
        return HuggingFaceTokenizer(hf.to_str())

    xlnet = tokenizer(processors.TemplateProcessing(
        single="$A:0 <sep>:0 <cls>:2", pair="$A:0 <sep>:0 $B:1 <sep>:1 <cls>:2",
        special_tokens=[("<sep>", vocab["<sep>"]), ("<cls>", vocab["<cls>"])]))
    with pytest.raises(ValueError, match=r"SentenceEncoder: the tokenizer lays a text out as `text id 5 id 6` "
                                         r"\(token types \[0, 0, 2\]\).*XLNet"):
        SentenceEncoder(model, params, xlnet, max_seq_length=16)
    bert_like = tokenizer(processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> $B:1 </s>:1",
        special_tokens=[("<s>", vocab["<s>"]), ("</s>", vocab["</s>"])]))
    assert SentenceEncoder(model, params, bert_like, max_seq_length=16).tokenize(["a cat"])[0].tolist() == [
        vocab["<s>"], vocab["a"], vocab["cat"], vocab["</s>"]]
