"""bench/embed_bench.py's --gpu path (the ModernBERT paper's Table 2 setting), run on CPU with tiny models so that a
mistake in it shows here rather than on a lent GPU's limited minutes. The numbers are not held to anything; the
structure is: every system and setting measured, real tokens counted, nothing compiled while timed, bertjax's
embeddings equal to transformers' in bfloat16, the table and the JSON complete."""

from __future__ import annotations

import argparse
import json
import sys

import pytest

transformers = pytest.importorskip("transformers")
pytest.importorskip("sentence_transformers")

from bench import embed_bench  # noqa: E402


def tiny_config(name: str, vocab_size: int):
    """The presets' families at test size: BERT with 64 positions, ModernBERT with 256 and a 16-token window."""
    if name.startswith("modernbert"):
        return transformers.ModernBertConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=48,
                                             num_hidden_layers=3, num_attention_heads=2, local_attention=16,
                                             max_position_embeddings=256, pad_token_id=0, cls_token_id=2,
                                             sep_token_id=3, bos_token_id=2, eos_token_id=3)
    return transformers.BertConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                   num_attention_heads=2, max_position_embeddings=64)


def test_gpu_table_runs_on_cpu_with_tiny_models(monkeypatch, tmp_path, capsys):
    """Lengths 48 (both models) and 200 (ModernBERT only: BERT has 64 positions), three systems, both settings."""
    monkeypatch.setattr(embed_bench, "hf_config", tiny_config)
    args = argparse.Namespace(gpu=True, dry_run=True, models=["bert-base", "modernbert-base"], lengths=[48, 200],
                              texts=12, long_texts=12, systems=["bertjax", "transformers", "st"], max_tokens=None,
                              hf_batch=None, repeats=1, attention="auto", json=str(tmp_path / "out.json"))
    vocab = [f"w{i}" for i in range(50)]
    embed_bench.run_accelerator(args, vocab, "cpu", "# header")
    rows = json.loads((tmp_path / "out.json").read_text())["rows"]
    expected = {(length, model, system, setting) for length, models in ((48, args.models), (200, args.models[1:]))
                for model in models for system in args.systems for setting in embed_bench.SETTINGS}
    assert {(r["length"], r["model"], r["system"], r["setting"]) for r in rows} == expected
    assert not [r for r in rows if "error" in r]
    for r in rows:
        texts = embed_bench.make_texts(12, r["length"], r["setting"] == "variable", vocab, seed=1)
        assert r["tokens"] == embed_bench.real_tokens(texts, r["length"])  # every system counts the same tokens
        assert r["tokens_per_s"] > 0
        if r["setting"] == "fixed":
            assert r["tokens"] == 12 * r["length"]
        if r["system"] == "bertjax":
            assert r["compiled_while_timed"] == 0  # warm_up(token_ids=) compiled what the job runs
            assert r["max_tokens"] == r["rows_per_batch"] * r["length"]
        if r["system"] != "transformers":
            assert r["difference_vs_transformers"] < 0.1, r  # bfloat16 both: about 2e-2 here; a wrong model ~1
    table = [line for line in capsys.readouterr().out.split("# header\n")[-1].splitlines() if line.startswith("| ")]
    assert [line.split(" | ")[0] for line in table[1:]] == ["| 48"] * 6 + ["| 200"] * 3
    assert all(line.count(" - |") == 1 for line in table[1:])  # every cell measured; no paper figure at these lengths


def test_gpu_mode_without_a_gpu_says_so(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["embed_bench", "--gpu"])
    with pytest.raises(SystemExit, match="JAX sees no GPU here"):
        embed_bench.main()
