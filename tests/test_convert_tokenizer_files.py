"""`convert --from-hf` copies the checkpoint's tokenizer files into its output, and nothing else of the disk: a
downloaded directory's symlink to some other file (a key, a config of the user's) is refused before anything is
written, rather than carried into the output the user then shares. A Hugging Face cache snapshot, whose files link
into its repository's blobs/, converts."""

from __future__ import annotations

import os

import pytest

from bertjax.cli import main
from bertjax.commands.convert import copy_tokenizer_files, tokenizer_files


def test_a_link_out_of_the_checkpoint_is_refused_before_anything_is_written(tmp_path, capsys):
    from finetune_helpers import tiny_model_dir

    secret = tmp_path / "secret.txt"
    secret.write_text("PRIVATE\n")
    source = tiny_model_dir(tmp_path / "download")
    os.symlink(secret, source / "extra.model")
    out = tmp_path / "out"
    assert main(["convert", "--from-hf", str(source), "--out", str(out)]) == 2
    assert f"extra.model links to {secret}, outside the checkpoint" in capsys.readouterr().err
    assert not out.exists()


def test_links_inside_the_checkpoint_copy(tmp_path):
    source, out = tmp_path / "download", tmp_path / "out"
    source.mkdir()
    out.mkdir()
    (source / "vocab.txt").write_text("[PAD]\n[UNK]\n")
    (source / "real.model").write_bytes(b"piece model")
    os.symlink("real.model", source / "spiece.model")
    assert copy_tokenizer_files(tokenizer_files(str(source)), str(out)) == ["vocab.txt", "real.model", "spiece.model"]
    assert (out / "spiece.model").read_bytes() == b"piece model" and not (out / "spiece.model").is_symlink()
    os.symlink("../elsewhere.json", source / "special_tokens_map.json")
    (tmp_path / "elsewhere.json").write_text("{}")
    with pytest.raises(ValueError, match="special_tokens_map.json links to .*elsewhere.json, outside the checkpoint"):
        tokenizer_files(str(source))


def test_a_hugging_face_cache_snapshot_copies_its_blobs(tmp_path):
    repo = tmp_path / "hub" / "models--org--name"
    snapshot, blobs, out = repo / "snapshots" / "0123abc", repo / "blobs", tmp_path / "out"
    for directory in (snapshot, blobs, out):
        directory.mkdir(parents=True)
    (blobs / "f00d").write_text('{"version": "1.0"}')
    os.symlink("../../blobs/f00d", snapshot / "tokenizer.json")
    assert copy_tokenizer_files(tokenizer_files(str(snapshot)), str(out)) == ["tokenizer.json"]
    assert (out / "tokenizer.json").read_text() == '{"version": "1.0"}'
