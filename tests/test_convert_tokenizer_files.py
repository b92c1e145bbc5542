"""`convert --from-hf` copies the checkpoint's tokenizer files into its output, and nothing else of the disk: a
downloaded directory's symlink to some other file (a key, a config of the user's) is not followed into the output,
which the user then shares. A Hugging Face cache snapshot, whose files link into its repository's blobs/, copies."""

from __future__ import annotations

import os

from bertjax.commands.convert import copy_tokenizer_files


def test_links_out_of_the_checkpoint_are_not_copied(tmp_path, capsys):
    secret = tmp_path / "secret.txt"
    secret.write_text("PRIVATE\n")
    source, out = tmp_path / "download", tmp_path / "out"
    source.mkdir()
    out.mkdir()
    (source / "vocab.txt").write_text("[PAD]\n[UNK]\n")
    (source / "real.model").write_bytes(b"piece model")
    os.symlink(secret, source / "extra.model")
    os.symlink("../secret.txt", source / "special_tokens_map.json")
    os.symlink("real.model", source / "spiece.model")  # a link inside the checkpoint is its own file
    assert copy_tokenizer_files(str(source), str(out)) == ["vocab.txt", "real.model", "spiece.model"]
    assert sorted(p.name for p in out.iterdir()) == ["real.model", "spiece.model", "vocab.txt"]
    warnings = capsys.readouterr().err
    assert f"{source / 'extra.model'} links to {secret}, outside the checkpoint" in warnings
    assert "special_tokens_map.json links to" in warnings


def test_a_hugging_face_cache_snapshot_copies_its_blobs(tmp_path):
    repo = tmp_path / "hub" / "models--org--name"
    snapshot, blobs, out = repo / "snapshots" / "0123abc", repo / "blobs", tmp_path / "out"
    for directory in (snapshot, blobs, out):
        directory.mkdir(parents=True)
    (blobs / "f00d").write_text('{"version": "1.0"}')
    os.symlink("../../blobs/f00d", snapshot / "tokenizer.json")
    assert copy_tokenizer_files(str(snapshot), str(out)) == ["tokenizer.json"]
    assert (out / "tokenizer.json").read_text() == '{"version": "1.0"}'
