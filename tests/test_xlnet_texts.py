"""XLNet from text, against transformers: `bertjax predict` on its task heads (XLNet lays a text out as
`A <sep> <cls>`, its <cls> of token type 2, which the text path used to refuse), fill-mask through the query stream
(XLNetLMHeadModel with perm_mask and target_mapping, as transformers documents it), and question answering with the
context first and the empty answer at <cls>, as transformers' run_qa lays out a left-padding tokenizer's rows."""

from __future__ import annotations

import json

import numpy as np
import pytest

from test_tokenizer_checkpoint_formats import train_sentencepiece, write

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

TINY = {"d_model": 32, "n_layer": 2, "n_head": 4, "d_inner": 64, "pad_token_id": 5}
TEXTS = ["The loop ends when the iterator is exhausted.", "a b"]
PAIRS = ["It leaves the function.", "c"]
CONTEXT = "The return statement leaves the function with a value. A loop ends when the iterator is exhausted."


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("xlnet-texts")
    write(root / "tokenizer", {
        "spiece.model": train_sentencepiece(unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
                                            control_symbols=["<cls>", "<sep>", "<pad>", "<mask>", "<eod>", "<eop>"]),
        "tokenizer_config.json": {"tokenizer_class": "XLNetTokenizer", "do_lower_case": False, "padding_side": "left",
                                  "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "sep_token": "<sep>",
                                  "pad_token": "<pad>", "cls_token": "<cls>", "mask_token": "<mask>"}})
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(root / "tokenizer"))
    config = transformers.XLNetConfig(vocab_size=len(tokenizer), **TINY)
    torch.manual_seed(0)
    for name, cls in (("classifier", transformers.XLNetForSequenceClassification),
                      ("mlm", transformers.XLNetLMHeadModel),
                      ("qa", transformers.XLNetForQuestionAnsweringSimple)):
        cls(config).eval().save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
    return root, tokenizer


def _reference(model_dir, cls, **inputs):
    model = cls.from_pretrained(str(model_dir)).eval()
    with torch.no_grad():
        return model(**{k: torch.as_tensor(np.asarray(v)) for k, v in inputs.items()})


def test_predict_classifies_texts_and_pairs_as_transformers(checkpoints, tmp_path):
    from bertjax.finetune.prediction import predict

    root, tokenizer = checkpoints
    rows = [{"text": t} for t in TEXTS] + [{"text": t, "text_pair": p} for t, p in zip(TEXTS, PAIRS)]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    ours = [[r["scores"][label] for label in ("LABEL_0", "LABEL_1")] for r in predict(root / "classifier",
                                                                                    tmp_path / "rows.jsonl")]
    reference = []
    for row in rows:  # one at a time: no padding (token types must be asked for: transformers 5 omits them)
        encoded = tokenizer(row["text"], row.get("text_pair"), return_token_type_ids=True, return_tensors="np")
        logits = _reference(root / "classifier", transformers.XLNetForSequenceClassification, **encoded).logits
        reference.append(torch.softmax(logits, -1)[0].numpy())
    np.testing.assert_allclose(ours, reference, atol=1e-5)


def test_fill_mask_predicts_through_the_query_stream_as_transformers(checkpoints):
    from bertjax.inference.fill_mask import load_predictor

    root, tokenizer = checkpoints
    text = "The loop <mask> when the <mask> is exhausted."
    ours = load_predictor(root / "mlm")(text, 5)
    encoded = tokenizer(text, return_token_type_ids=True, return_tensors="np")
    ids = encoded["input_ids"][0]
    masks = np.flatnonzero(ids == tokenizer.mask_token_id)
    perm_mask = np.zeros((1, len(ids), len(ids)), np.float32)
    perm_mask[:, :, masks] = 1.0  # no token sees a mask's content
    target_mapping = np.zeros((1, len(masks), len(ids)), np.float32)
    target_mapping[0, np.arange(len(masks)), masks] = 1.0
    logits = _reference(root / "mlm", transformers.XLNetLMHeadModel, perm_mask=perm_mask,
                        target_mapping=target_mapping, **encoded).logits[0].numpy()
    logits[:, tokenizer.all_special_ids] = -np.inf
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    assert len(ours) == len(masks) == 2
    for predictions, expected in zip(ours, probs):
        for prediction in predictions:
            assert prediction.probability == pytest.approx(expected[prediction.token_id], abs=1e-6)
        kept = [p.token_id for p in predictions]  # the most likely, but pieces that decode to nothing
        best = [i for i in np.argsort(-expected, kind="stable") if tokenizer.decode([int(i)]).strip()][:5]
        assert kept == best


def test_question_answering_rows_put_the_context_first_and_the_empty_answer_at_cls(checkpoints):
    from bertjax.data import load_tokenizer
    from bertjax.finetune.qa import Answer, make_windows

    root, tokenizer = checkpoints
    ours = load_tokenizer(root / "qa")
    question = "What ends a loop?"
    start = CONTEXT.index("the iterator")
    windows = make_windows(ours, question, CONTEXT, Answer("the iterator is exhausted", start), max_length=128,
                           doc_stride=16)
    expected = tokenizer(CONTEXT, question, return_token_type_ids=True, return_offsets_mapping=True)
    n = len(expected["input_ids"])
    assert windows.input_ids.shape[0] == 1 and int(windows.segment_ids[0].sum()) == n
    assert windows.input_ids[0, :n].tolist() == expected["input_ids"]
    assert windows.token_type_ids[0, :n].tolist() == expected["token_type_ids"]
    assert windows.cls_index.tolist() == [n - 1] and expected["input_ids"][n - 1] == tokenizer.cls_token_id
    begin, end = windows.start_positions[0], windows.end_positions[0]
    assert CONTEXT[windows.offsets[0, begin, 0]:windows.offsets[0, end, 1]] == "the iterator is exhausted"
    # A window without the answer (short rows) is labelled at its <cls>, the last token, as run_qa labels it.
    short = make_windows(ours, question, CONTEXT, Answer("the iterator is exhausted", start), max_length=24,
                         doc_stride=4)
    missing = [i for i in range(len(short.input_ids)) if short.start_positions[i] == short.cls_index[i]]
    assert missing and all(short.input_ids[i, short.cls_index[i]] == tokenizer.cls_token_id for i in missing)
    assert all(short.cls_index[i] == short.segment_ids[i].sum() - 1 for i in range(len(short.input_ids)))


def test_predict_answers_from_the_logits_transformers_gives(checkpoints, tmp_path):
    from bertjax.finetune.prediction import predict
    from bertjax.finetune.qa import best_span

    root, tokenizer = checkpoints
    question = "What ends a loop?"
    (tmp_path / "qa.jsonl").write_text(json.dumps({"question": question, "context": CONTEXT}) + "\n")
    ours = predict(root / "qa", tmp_path / "qa.jsonl")[0]
    encoded = tokenizer(CONTEXT, question, return_token_type_ids=True, return_offsets_mapping=True,
                        return_tensors="np")
    offsets = encoded.pop("offset_mapping")[0]
    sequence = np.asarray(encoded.sequence_ids(0))
    output = _reference(root / "qa", transformers.XLNetForQuestionAnsweringSimple, **encoded)
    context_offsets = np.where((sequence == 0)[:, None], offsets, -1).astype(np.int32)
    expected = best_span(output.start_logits.numpy(), output.end_logits.numpy(), context_offsets[None], CONTEXT,
                         n_best=20, max_answer_length=30, allow_empty=False)
    assert ours["answer"].strip() == expected.text.strip() and ours["answer"]
    assert ours["score"] == pytest.approx(expected.score, abs=1e-4)


def test_an_xlnet_trained_as_a_masked_lm_fills_masks_from_its_content_stream(checkpoints):
    """The `mlm` objective trains XLNet's content stream only: its workdir's fill-mask reads that stream, as
    XLNetLMHeadModel does without perm_mask and target_mapping."""
    from bertjax.inference.fill_mask import make_predictor
    from bertjax.model_dirs import load_model_dir

    root, tokenizer = checkpoints
    model, params, ours = load_model_dir(root / "mlm")
    text = "The loop <mask> when the iterator is exhausted."
    (predictions,) = make_predictor(model, params, ours, query_stream=False)(text, 3)
    encoded = tokenizer(text, return_token_type_ids=True, return_tensors="np")
    logits = _reference(root / "mlm", transformers.XLNetLMHeadModel, **encoded).logits[0].numpy()
    row = logits[int(np.flatnonzero(encoded["input_ids"][0] == tokenizer.mask_token_id)[0])]
    row[tokenizer.all_special_ids] = -np.inf
    expected = np.exp(row - row.max()) / np.exp(row - row.max()).sum()
    for prediction in predictions:
        assert prediction.probability == pytest.approx(expected[prediction.token_id], abs=1e-6)


def test_which_stream_a_workdir_predicts_through_is_its_objectives(tmp_path):
    from bertjax.model_dirs import trained_objective

    for objective, expected in ((None, "mlm"), ("permutation_lm", "permutation_lm")):
        workdir = tmp_path / str(objective)
        workdir.mkdir()
        (workdir / "model_config.json").write_text("{}")
        (workdir / "config.yaml").write_text("train: {steps: 2}\n" if objective is None else
                                             f"objective: {{name: {objective}}}\n")
        assert trained_objective(workdir) == expected
    assert trained_objective(tmp_path) is None  # not a workdir


def test_only_a_layout_ending_with_sep_then_cls_reads_its_last_token():
    """XLNet's `A <sep> <cls>` pads on the left and puts QA's context first; `A </s>` of a tokenizer that names no
    [CLS] (its last token is taken for one) keeps BERT's order."""
    from bertjax.data.special_template import TEXT, Item, SpecialTemplate

    xlnet = SpecialTemplate(single=(Item(TEXT, 0), Item(4, 0), Item(3, 2)), pair=None)
    eos_only = SpecialTemplate(single=(Item(TEXT, 0), Item(2, 0)), pair=None)
    assert xlnet.ends_with(3) and not xlnet.ends_with(4) and not eos_only.ends_with(2)
