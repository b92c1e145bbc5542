"""Tokenizers behind one interface: SentencePiece `.model`, Hugging Face `tokenizer.json`, WordPiece `vocab.txt`
(and a transformers checkpoint's `vocab.json` + `merges.txt`, through transformers' conversion).

Every tokenizer gives the pipeline what it needs and nothing more:
- `encode(text)` / `encode_batch(texts)`: token ids as int32 numpy arrays, *without* special tokens (the pipeline
  adds `[CLS]`/`[SEP]` itself when it lays out rows);
- `decode(ids)`;
- `encode_with_offsets(text)`: the ids and, per token, the [start, end) character span of `text` it covers
  (extractive question answering maps answers to tokens and back through these);
- the special ids `cls_id sep_id mask_id pad_id unk_id`, and `special_ids` (every id that must never be masked
  nor drawn as a random replacement), found as bertjax.data.special_tokens says (`unk_id` is None for a
  vocabulary without one);
- `word_start` (bool per vocabulary id): whether a token begins a word, for whole-word and span masking;
- `save(directory)`: copy the tokenizer into a run or a prepared-data directory; `fingerprint` identifies it.

`load_tokenizer(path)` picks the implementation from the files present (`TOKENIZER_FILES`).
"""

from __future__ import annotations

import abc
import dataclasses
import hashlib
import json
import logging
import pathlib
from collections.abc import Callable, Sequence

import numpy as np

from bertjax.data.special_template import bert_template, from_post_processor
from bertjax.data.special_tokens import (SPECIAL_TOKEN_KEYS, SPECIAL_TOKEN_NAMES, SpecialIds, declared_special_tokens,
                                         find_specials, layout_roles)
from bertjax.jsonl import loads

logger = logging.getLogger(__name__)


class InvalidTokenizerFile(ValueError):
    """A tokenizer file that cannot be read at all (truncated, empty, not UTF-8, another kind of file), as opposed
    to a readable tokenizer bertjax cannot use (special tokens it does not know)."""


class Tokenizer(abc.ABC):
    """The interface the data pipeline uses. Subclasses fill `_specials`, `_word_start` and `_special_ids`."""

    kind: str  # registry key, stored in prepared-data metadata
    _specials: SpecialIds
    _word_start: np.ndarray
    _special_ids: np.ndarray

    @property
    @abc.abstractmethod
    def vocab_size(self) -> int: ...

    @abc.abstractmethod
    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]: ...

    @abc.abstractmethod
    def decode(self, ids: Sequence[int] | np.ndarray) -> str: ...

    @abc.abstractmethod
    def encode_with_offsets(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        """(ids as `encode` gives them, int32 [tokens, 2] character spans [start, end) of `text`)."""

    @abc.abstractmethod
    def _files(self) -> dict[str, bytes]:
        """The files that make up this tokenizer: name -> content (what `save` writes)."""

    def encode(self, text: str) -> np.ndarray:
        return self.encode_batch([text])[0]

    @property
    def cls_id(self) -> int:
        return self._specials.cls

    @property
    def sep_id(self) -> int:
        return self._specials.sep

    @property
    def mask_id(self) -> int:
        return self._specials.mask

    @property
    def pad_id(self) -> int:
        return self._specials.pad

    @property
    def unk_id(self) -> int | None:
        return self._specials.unk

    @property
    def mask_takes_space_before(self) -> bool:
        """Whether a text's space before its mask token belongs to the mask ("The [MASK]": the mask's `lstrip`)
        rather than to the text before it. True unless a tokenizer.json's added mask token says otherwise."""
        return True

    @property
    def special_ids(self) -> np.ndarray:
        """Sorted int32 ids never masked and never used as random replacements."""
        return self._special_ids

    @property
    def word_start(self) -> np.ndarray:
        """bool [vocab_size]: True where a token begins a new word."""
        return self._word_start

    @property
    def special_template(self):
        """Where [CLS]/[SEP] (or <s>/</s>) go around one text or a pair (bertjax.data.special_template)."""
        return bert_template(self.cls_id, self.sep_id)

    @property
    def fingerprint(self) -> str:
        digest = hashlib.sha256(self.kind.encode())
        for name, content in sorted(self._files().items()):
            digest.update(name.encode())
            digest.update(hashlib.sha256(content).digest())
        return digest.hexdigest()[:16]

    def save(self, directory: str | pathlib.Path) -> pathlib.Path:
        """Write this tokenizer's files into `directory` (created); `load_tokenizer(directory)` reads them back."""
        directory = pathlib.Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        for name, content in {**self._files(), **self._settings_files()}.items():
            (directory / name).write_bytes(content)
        return directory

    def _settings_files(self) -> dict[str, bytes]:
        """Files saved beside `_files` that do not change how bertjax encodes text (so not in the fingerprint)."""
        return {}

    def _finish(self, specials: SpecialIds, word_start: np.ndarray, extra_special_ids: Sequence[int]) -> None:
        self._specials = specials
        ids = set(extra_special_ids) | {specials.cls, specials.sep, specials.mask, specials.pad, specials.unk}
        ids.discard(None)
        self._special_ids = np.array(sorted(ids), np.int32)
        # Specials start words, so that a word never spans a [SEP]/[CLS] boundary.
        word_start = np.asarray(word_start, bool).copy()
        word_start[self._special_ids] = True
        self._word_start = word_start


def _trim_spans(text: str, spans) -> np.ndarray:
    """int32 [tokens, 2] character spans without the whitespace a word-initial piece carries (an answer span
    starts at its first visible character)."""
    out = np.zeros((len(spans), 2), np.int32)
    for i, (start, end) in enumerate(spans):
        start, end = int(start), int(end)
        while start < end and text[start].isspace():
            start += 1
        out[i] = start, end
    return out


class SentencePieceTokenizer(Tokenizer):
    """A SentencePiece `.model`: the ones bertjax trains, and those of converted checkpoints (ALBERT, ...)."""

    kind = "sentencepiece"
    FILE_NAME = "tokenizer.model"

    def __init__(self, model_proto: bytes, source: str = "<memory>"):
        import sentencepiece

        self._proto = bytes(model_proto)
        self._source = source
        try:
            self._sp = sentencepiece.SentencePieceProcessor(model_proto=self._proto)
        except Exception as error:  # RuntimeError from the C++ parser: truncated, empty or another kind of file
            raise InvalidTokenizerFile(f"{source} is not a valid tokenizer: not a SentencePiece model "
                             f"({_first_line(error)})") from None
        size = self._sp.get_piece_size()
        if size == 0:
            raise InvalidTokenizerFile(f"{source} is not a valid tokenizer: a SentencePiece model without pieces")

        def lookup(piece: str) -> int | None:
            i = self._sp.piece_to_id(piece)
            # piece_to_id answers unk_id for unknown pieces; only a piece that really is `piece` counts.
            return i if self._sp.id_to_piece(i) == piece else None

        pieces = [self._sp.id_to_piece(i) for i in range(size)]
        special = [i for i in range(size) if self._sp.is_control(i) or self._sp.is_unknown(i) or self._sp.is_unused(i)]
        self._finish(find_specials(lookup, source, {}),
                     np.array([p.startswith("\u2581") for p in pieces], bool), special)

    @classmethod
    def from_file(cls, path: str | pathlib.Path) -> "SentencePieceTokenizer":
        path = pathlib.Path(path)
        return cls(path.read_bytes(), source=str(path))

    def __getstate__(self):  # the C++ processor does not pickle; rebuild it from the proto in worker processes
        return {"model_proto": self._proto, "source": self._source}

    def __setstate__(self, state):
        self.__init__(state["model_proto"], state["source"])

    @property
    def vocab_size(self) -> int:
        return self._sp.get_piece_size()

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        return [np.asarray(ids, np.int32) for ids in self._sp.encode(list(texts), out_type=int)]

    def decode(self, ids) -> str:
        return self._sp.decode([int(i) for i in ids])

    def encode_with_offsets(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        # SentencePiece reports byte offsets into the UTF-8 input (byte-fallback pieces of one character share
        # them); map them onto character offsets.
        pieces = self._sp.EncodeAsProto(text).pieces
        byte_lengths = [len(c.encode("utf-8")) for c in text]
        char_of_byte = np.append(np.repeat(np.arange(len(text)), byte_lengths), len(text))
        spans = [(char_of_byte[p.begin], char_of_byte[p.end]) for p in pieces]
        return np.asarray([p.id for p in pieces], np.int32), _trim_spans(text, spans)

    def _files(self) -> dict[str, bytes]:
        return {self.FILE_NAME: self._proto}


# Markers of word boundaries in the vocabularies of the `tokenizers` library: (marker, marks_start).
# "##" (WordPiece) marks a continuation; "Ġ" (byte-level BPE) and "▁" (SentencePiece-style) mark a word start.
_WORD_MARKERS: tuple[tuple[str, bool], ...] = (("##", False), ("\u0120", True), ("\u2581", True))


class HuggingFaceTokenizer(Tokenizer):
    """A `tokenizer.json` of a Hugging Face checkpoint, through the `tokenizers` library."""

    kind = "huggingface"
    FILE_NAME = "tokenizer.json"

    def __init__(self, tokenizer_json: str, source: str = "<memory>", transformers_config: dict | None = None):
        from tokenizers import Tokenizer as HfTokenizer

        self._json = tokenizer_json
        self._source = source
        # The checkpoint's tokenizer_config.json settings that decide how transformers builds its tokenizer around
        # this tokenizer.json (see TRANSFORMERS_CONFIG_KEYS): kept so that a model bertjax saves loads in
        # transformers as the checkpoint's tokenizer did.
        self.transformers_config = dict(transformers_config or {})
        try:
            self._tok = HfTokenizer.from_str(tokenizer_json)
        except Exception as error:  # the `tokenizers` library raises a bare Exception naming no file
            raise InvalidTokenizerFile(f"{source} is not a valid tokenizer: not a Hugging Face tokenizer.json "
                             f"({_first_line(error)})") from None
        # A tokenizer.json saved after use can carry padding and truncation settings (sentence-transformers saves
        # them); they would pad or cut every encoding here, where callers lay out rows themselves.
        self._tok.no_padding()
        self._tok.no_truncation()
        vocab = self._tok.get_vocab(with_added_tokens=True)
        if not vocab:
            raise InvalidTokenizerFile(f"{source} is not a valid tokenizer: its vocabulary is empty")
        size = _id_range(vocab, source)
        pieces = [""] * size
        for piece, i in vocab.items():
            pieces[i] = piece
        added = [i for i, token in self._tok.get_added_tokens_decoder().items() if token.special]
        try:
            self._laid_out, self._layout_error = from_post_processor(self._tok), None
        except ValueError as error:  # a layout bertjax cannot follow: an error for those who lay out rows with it
            self._laid_out, self._layout_error = None, ValueError(f"{source}: {error}")
        if self._laid_out is not None and self._laid_out.pair is None:  # its error names the file too
            self._laid_out = dataclasses.replace(self._laid_out, pair_error=f"{source}: {self._laid_out.pair_error}")
        self._finish(find_specials(vocab.get, source, declared_special_tokens(self.transformers_config),
                                    layout_roles(self._laid_out)), _word_starts(self._tok, pieces), added)
        self._size = size
        disagreements = class_options_over_json(tokenizer_json, self.transformers_config)
        if disagreements:
            logger.warning("%s: tokenizer_config.json and tokenizer.json disagree (%s); bertjax runs tokenizer.json "
                           "as written, where transformers 5's %s rebuilds the tokenizer from tokenizer_config.json, "
                           "so the two give other ids to some texts", source, "; ".join(disagreements),
                           self.transformers_config.get("tokenizer_class"))

    @classmethod
    def from_file(cls, path: str | pathlib.Path) -> "HuggingFaceTokenizer":
        path = pathlib.Path(path)
        return cls(_read_text(path), source=str(path), transformers_config=_transformers_config(path.parent))

    @classmethod
    def from_transformers_files(cls, directory: str | pathlib.Path) -> "HuggingFaceTokenizer":
        """A checkpoint's tokenizer saved without tokenizer.json (spiece.model / spm.model with its
        tokenizer_config.json, special_tokens_map.json, added_tokens.json), built as transformers builds it.

        Each family's class lays its SentencePiece model out differently (ALBERT lowercases and strips accents,
        XLNet ends texts with `<sep> <cls>`, DeBERTa-v3 adds [MASK] after the vocabulary), so transformers' own
        conversion makes the tokenizer.json, which bertjax then runs and saves like any other."""
        directory = pathlib.Path(directory)
        try:
            from transformers import AutoTokenizer
        except ImportError:
            raise ValueError(
                f"{directory} holds a transformers checkpoint's tokenizer without a tokenizer.json; bertjax reads "
                f"those through transformers' own conversion: pip install 'bertjax[hf]' (transformers, no torch "
                f"needed), or write its tokenizer.json once where transformers is installed: "
                f"AutoTokenizer.from_pretrained(DIR).save_pretrained(DIR)") from None
        try:
            # trust_remote_code=False: an auto_map naming a module in the directory is refused at once; by default
            # transformers asks on stdin and, given "y" (a pipe, a script), imports and runs it
            reference = AutoTokenizer.from_pretrained(str(directory), local_files_only=True, trust_remote_code=False)
        except Exception as error:  # transformers raises OSError, ValueError, KeyError... naming no single cause
            raise InvalidTokenizerFile(f"{directory}: transformers cannot build the checkpoint's tokenizer from "
                                       f"its files ({type(error).__name__}: {_first_line(error)})") from None
        backend = getattr(reference, "backend_tokenizer", None)
        if backend is None:
            raise InvalidTokenizerFile(f"{directory}: transformers reads it with {type(reference).__name__}, which "
                                       "has no `tokenizers` form for bertjax to run")
        config = _transformers_config(directory)
        # What AutoTokenizer chose (the class from config.json's model_type where tokenizer_config.json names
        # none, its special tokens and padding side): kept, so that copies and exports load as the checkpoint did.
        config.setdefault("tokenizer_class", type(reference).__name__)
        config.setdefault("padding_side", reference.padding_side)
        for key in {key for keys in SPECIAL_TOKEN_KEYS.values() for key in keys}:
            if getattr(reference, key, None) is not None:
                config.setdefault(key, str(getattr(reference, key)))
        return cls(backend.to_str(), source=f"{directory} (converted by transformers)", transformers_config=config)

    def __getstate__(self):
        return {"tokenizer_json": self._json, "source": self._source, "transformers_config": self.transformers_config}

    def __setstate__(self, state):
        self.__init__(state["tokenizer_json"], state["source"], state.get("transformers_config"))

    @property
    def vocab_size(self) -> int:
        return self._size

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        encodings = self._tok.encode_batch_fast(list(texts), add_special_tokens=False)
        return [np.asarray(e.ids, np.int32) for e in encodings]

    def decode(self, ids) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=True)

    def encode_with_offsets(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        encoding = self._tok.encode(text, add_special_tokens=False)
        return np.asarray(encoding.ids, np.int32), _trim_spans(text, encoding.offsets)

    @property
    def mask_takes_space_before(self) -> bool:
        added = self._tok.get_added_tokens_decoder().get(self.mask_id)
        return True if added is None else bool(added.lstrip)

    @property
    def special_template(self):
        """The layout of the tokenizer.json's own post-processor (RoBERTa's `<s> A </s></s> B </s>`, ...)."""
        if self._layout_error is not None:
            raise self._layout_error
        return self._laid_out or super().special_template

    def _files(self) -> dict[str, bytes]:
        return {self.FILE_NAME: self._json.encode("utf-8")}

    def _settings_files(self) -> dict[str, bytes]:
        if not self.transformers_config:
            return {}
        return {TOKENIZER_CONFIG: json.dumps(self.transformers_config, indent=1).encode("utf-8")}


# The options transformers 5's tokenizer classes rebuild a tokenizer.json's pipeline from (tokenizer_config.json
# key, the component of tokenizer.json, its field, the class default), by class: its BertTokenizer (also DistilBERT's
# and ELECTRA's) makes a BertNormalizer, its RobertaTokenizer (also Longformer's) a ByteLevel pre-tokenizer.
_BERT_OPTIONS = (("do_lower_case", "normalizer", "BertNormalizer", "lowercase", True),
                 ("strip_accents", "normalizer", "BertNormalizer", "strip_accents", None),
                 ("tokenize_chinese_chars", "normalizer", "BertNormalizer", "handle_chinese_chars", True))
_ROBERTA_OPTIONS = (("add_prefix_space", "pre_tokenizer", "ByteLevel", "add_prefix_space", False),)
CLASS_OPTIONS = {"BertTokenizer": _BERT_OPTIONS, "DistilBertTokenizer": _BERT_OPTIONS,
                 "ElectraTokenizer": _BERT_OPTIONS, "RobertaTokenizer": _ROBERTA_OPTIONS,
                 "LongformerTokenizer": _ROBERTA_OPTIONS}


def _components(described, kind: str) -> list[dict]:
    """The components of type `kind` in a tokenizer.json normalizer or pre-tokenizer (inside a Sequence too)."""
    if not isinstance(described, dict):
        return []
    if described.get("type") == "Sequence":
        parts = described.get("normalizers") or described.get("pretokenizers") or []
        return [c for part in parts for c in _components(part, kind)]
    return [described] if described.get("type") == kind else []


def class_options_over_json(tokenizer_json: str, config: dict) -> list[str]:
    """Where tokenizer_config.json's class options say otherwise than tokenizer.json's components: transformers 5
    builds its tokenizer from the former, the `tokenizers` library (and bertjax) runs the latter. Files transformers
    saved agree; an edited tokenizer_config.json may not."""
    name = str(config.get("tokenizer_class", "")).removesuffix("Fast")
    if name not in CLASS_OPTIONS:  # the JSON (megabytes for a large vocabulary) is parsed only when it matters
        return []
    described, found = json.loads(tokenizer_json), []
    for key, where, kind, field, default in CLASS_OPTIONS[name]:
        wanted = config.get(key, default)
        for component in _components(described.get(where), kind):
            if field in component and component[field] != wanted:
                found.append(f"{key}={json.dumps(wanted)} against the {kind}'s {field}={json.dumps(component[field])}")
    return found


# Ids a vocabulary may skip: real tokenizers number their tokens 0..n-1, give or take a few reserved or removed ids.
_MAX_ID_HOLES = 1024


def _id_range(vocab: dict[str, int], source: str) -> int:
    """Largest id + 1, the length of every per-id table the tokenizer builds, refused when far beyond the number of
    tokens: a few bytes naming id 2000000000 would otherwise ask for gigabytes before the model is compared."""
    size = max(vocab.values()) + 1
    if size > 2 * len(vocab) + _MAX_ID_HOLES:
        raise InvalidTokenizerFile(f"{source} is not a valid tokenizer: its largest token id is {size - 1}, but it "
                                   f"has {len(vocab)} tokens (ids should run 0..{len(vocab) - 1}, give or take a "
                                   "few)")
    return size


def _word_starts(tok, pieces: list[str]) -> np.ndarray:
    model = tok.model
    prefix = getattr(model, "continuing_subword_prefix", None)
    if type(model).__name__ == "WordPiece" and prefix:
        return np.array([not p.startswith(prefix) for p in pieces], bool)
    counts = {marker: sum(p.startswith(marker) for p in pieces) for marker, _ in _WORD_MARKERS}
    marker = max(counts, key=counts.get)
    if counts[marker] == 0:
        # No marker: every token counts as a word (whole-word masking degrades to token masking).
        return np.ones(len(pieces), bool)
    marks_start = dict(_WORD_MARKERS)[marker]
    return np.array([p.startswith(marker) == marks_start for p in pieces], bool)


class WordPieceTokenizer(HuggingFaceTokenizer):
    """A BERT `vocab.txt` (one token per line), run by the `tokenizers` library's WordPiece with BERT's rules, as
    transformers' BertTokenizer runs it: the special tokens kept whole in text (and dropped by `decode`), the
    tokenizer_config.json options `strip_accents` and `tokenize_chinese_chars` (`WORDPIECE_OPTIONS`), and the
    tokens added after the vocabulary (`added_tokens.json`, {token: id})."""

    kind = "wordpiece"
    FILE_NAME = "vocab.txt"
    ADDED_TOKENS = "added_tokens.json"

    def __init__(self, vocab_text: str, lowercase: bool | None = None, source: str = "<memory>", *,
                 options: dict | None = None, added_tokens: dict[str, int] | None = None):
        from tokenizers import AddedToken, Tokenizer as HfTokenizer, decoders, models, normalizers, pre_tokenizers

        tokens = vocab_text.splitlines()
        if not tokens:  # a file emptied (truncated to nothing): damaged, not a tokenizer bertjax cannot use
            raise InvalidTokenizerFile(f"{source} is not a valid tokenizer: its WordPiece vocabulary is empty")
        vocab = {token: i for i, token in enumerate(tokens)}
        if lowercase is None:
            # An uncased vocabulary holds no capital letters outside its [BRACKETED] specials.
            lowercase = not any(c.isupper() for t in tokens if not t.startswith("[") for c in t)
        self._vocab_text = vocab_text
        self._lowercase = lowercase
        # Only what differs from BertTokenizer's defaults, so the files (and fingerprint) of a default one stay.
        self._options = {key: value for key, value in (options or {}).items()
                         if key in WORDPIECE_OPTIONS and value != WORDPIECE_OPTIONS[key][1]}
        self._added_tokens = dict(added_tokens or {})
        unk = next((name for name in SPECIAL_TOKEN_NAMES["unk"] if name in vocab), None)
        if unk is None:
            raise ValueError(f"WordPiece vocabulary {source} has no [UNK] token")
        tok = HfTokenizer(models.WordPiece(vocab, unk_token=unk))
        tok.normalizer = normalizers.BertNormalizer(
            lowercase=lowercase, strip_accents=self._options.get("strip_accents"),
            handle_chinese_chars=self._options.get("tokenize_chinese_chars", True))
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece()
        specials = [next(name for name in names if name in vocab) for names in SPECIAL_TOKEN_NAMES.values()
                    if any(name in vocab for name in names)]
        tok.add_special_tokens([AddedToken(name, special=True, normalized=False) for name in specials])
        added = sorted(self._added_tokens.items(), key=lambda item: item[1])
        if [i for _, i in added] != list(range(len(tokens), len(tokens) + len(added))):
            raise ValueError(f"{source}: the ids of {self.ADDED_TOKENS} ({', '.join(str(i) for _, i in added)}) must "
                             f"follow the vocabulary's {len(tokens)} tokens one by one")
        tok.add_tokens([AddedToken(token, normalized=True) for token, _ in added])
        super().__init__(tok.to_str(), source=source)

    @classmethod
    def from_file(cls, path: str | pathlib.Path) -> Tokenizer:
        """The vocab.txt at `path` with the settings of the tokenizer_config.json beside it. Special tokens that
        config names beyond BERT's own ([MASK] as `<mask>`, `additional_special_tokens`, tokens only its
        `added_tokens_decoder` lists) are read as transformers reads them, through its own conversion."""
        path = pathlib.Path(path)
        config = _read_tokenizer_config(path.parent)
        lowercase = config.get("do_lower_case")
        options = {key: config[key] for key, (kinds, _) in WORDPIECE_OPTIONS.items()
                   if key in config and isinstance(config[key], kinds)}
        added = _read_json_object(path.parent / cls.ADDED_TOKENS)
        if not all(isinstance(token, str) and type(i) is int for token, i in added.items()):
            raise InvalidTokenizerFile(f"{path.parent / cls.ADDED_TOKENS}: expected {{token: id}}")
        vocab_text = _read_text(path)
        beyond = _specials_beyond_bert(path.parent, vocab_text.splitlines(), added)
        if beyond is not None:
            logger.info("%s: tokenizer_config.json names %s; building the tokenizer as transformers does", path,
                        beyond)
            return HuggingFaceTokenizer.from_transformers_files(path.parent)
        tokenizer = cls(vocab_text, lowercase=lowercase if isinstance(lowercase, bool) else None, source=str(path),
                        options=options, added_tokens=added)
        if not isinstance(lowercase, bool) and not tokenizer._lowercase:
            logger.warning("%s: no tokenizer_config.json sets do_lower_case and the vocabulary has capital letters, "
                           "so bertjax keeps case; transformers' BertTokenizer would lowercase such a vocabulary "
                           "(write do_lower_case into tokenizer_config.json to make the two agree)", path)
        return tokenizer

    def __getstate__(self):
        return {"vocab_text": self._vocab_text, "lowercase": self._lowercase, "source": self._source,
                "options": self._options, "added_tokens": self._added_tokens}

    def __setstate__(self, state):
        self.__init__(state["vocab_text"], state["lowercase"], state["source"], options=state.get("options"),
                      added_tokens=state.get("added_tokens"))

    def _files(self) -> dict[str, bytes]:
        files = {self.FILE_NAME: self._vocab_text.encode("utf-8")}
        files[TOKENIZER_CONFIG] = json.dumps({"do_lower_case": self._lowercase, **self._options}).encode("utf-8")
        if self._added_tokens:
            files[self.ADDED_TOKENS] = json.dumps(self._added_tokens).encode("utf-8")
        return files


def _specials_beyond_bert(directory: pathlib.Path, tokens: list[str], added: dict[str, int]) -> str | None:
    """What a vocab.txt checkpoint's tokenizer_config.json (or special_tokens_map.json) names that
    `WordPieceTokenizer` does not build (it keeps BERT's [CLS] [SEP] [MASK] [PAD] [UNK] whole, and the tokens of
    added_tokens.json): a role given to another token, extra special tokens, tokens only `added_tokens_decoder`
    lists; None when there is none."""
    described = _described_settings(directory)
    vocab = set(tokens)
    own = {role: next((name for name in names if name in vocab), None) for role, names in SPECIAL_TOKEN_NAMES.items()}
    declared = declared_special_tokens(described)
    for role, keys in SPECIAL_TOKEN_KEYS.items():
        key = next((key for key in keys if key in declared), None)
        if key is not None and declared[key] != own[role]:
            return f"{key} {declared[key]!r}"
    for key in ("additional_special_tokens", "extra_special_tokens"):
        if described.get(key):
            return key
    entries = described.get("added_tokens_decoder")
    known = {name for name in own.values() if name} | set(added)
    for entry in entries.values() if isinstance(entries, dict) else ():
        content = entry.get("content") if isinstance(entry, dict) else None
        if isinstance(content, str) and content not in known:
            return f"the added token {content!r}"
    return None


# BertTokenizer's options in tokenizer_config.json that change how a vocab.txt tokenizes: (types, default).
# strip_accents None strips accents when lowercasing.
WORDPIECE_OPTIONS: dict[str, tuple[tuple[type, ...], object]] = {
    "strip_accents": ((bool, type(None)), None), "tokenize_chinese_chars": ((bool,), True)}


TOKENIZER_CONFIG = "tokenizer_config.json"
# The settings of a checkpoint's tokenizer_config.json that transformers builds its tokenizer from, beside
# tokenizer.json: the class (RobertaTokenizer rebuilds its byte-level pre-tokenizer for add_prefix_space, as
# run_ner passes it; the generic class ignores it), its options, its special tokens (which also tell bertjax its
# cls/sep/mask/pad/unk, `SPECIAL_TOKEN_KEYS`) and the padding side (XLNet's left). Lengths and input names are
# written from the model.
TRANSFORMERS_CONFIG_KEYS = ("tokenizer_class", "add_prefix_space", "trim_offsets", "bos_token", "eos_token",
                            "cls_token", "sep_token", "mask_token", "pad_token", "unk_token",
                            "do_lower_case", "strip_accents", "tokenize_chinese_chars", "padding_side",
                            "truncation_side")
SPECIAL_TOKENS_MAP = "special_tokens_map.json"


def _read_tokenizer_config(directory: pathlib.Path) -> dict:
    return _read_json_object(directory / TOKENIZER_CONFIG)


def _read_json_object(path: pathlib.Path) -> dict:
    if not path.is_file():
        return {}
    try:
        described = loads(_read_text(path))
    except json.JSONDecodeError as error:
        raise InvalidTokenizerFile(f"{path} is not a valid tokenizer config: invalid JSON ({error})") from None
    return described if isinstance(described, dict) else {}


def _described_settings(directory: pathlib.Path) -> dict:
    """A checkpoint's tokenizer_config.json, with an older checkpoint's special_tokens_map.json over it, as
    transformers reads them (it ignores the map once the config lists its added tokens)."""
    described = _read_tokenizer_config(directory)
    if "added_tokens_decoder" not in described:
        described = {**described, **_read_json_object(directory / SPECIAL_TOKENS_MAP)}
    return described


def _transformers_config(directory: pathlib.Path) -> dict:
    described = _described_settings(directory)
    kept = {key: described[key] for key in TRANSFORMERS_CONFIG_KEYS if key in described}
    if "auto_map" in described:  # a class of the checkpoint's own code, which a saved copy would not carry
        kept.pop("tokenizer_class", None)
    return kept


def _read_text(path: pathlib.Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise InvalidTokenizerFile(f"{path} is not a valid tokenizer: not UTF-8 text ({error})") from None


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0][:300] if text else type(error).__name__


# Files a transformers tokenizer saves beside its SentencePiece model: with any of them the model is one family's
# tokenizer (`HuggingFaceTokenizer.from_transformers_files`). So is a model under a family's own name (spiece.model,
# spm.model) beside a checkpoint's config.json, which then names the family. A model bertjax trained
# (tokenizer.model) may sit beside a config.json bertjax wrote: that one is bertjax's to run.
TRANSFORMERS_CHECKPOINT_FILES = (TOKENIZER_CONFIG, SPECIAL_TOKENS_MAP, "added_tokens.json")


def _load_sentencepiece(path: pathlib.Path) -> Tokenizer:
    directory = path.parent
    if any((directory / name).is_file() for name in TRANSFORMERS_CHECKPOINT_FILES) or (
            path.name != SentencePieceTokenizer.FILE_NAME and (directory / "config.json").is_file()):
        return HuggingFaceTokenizer.from_transformers_files(directory)
    return SentencePieceTokenizer.from_file(path)


def _load_byte_level_bpe(path: pathlib.Path) -> Tokenizer:
    """A checkpoint's byte-level BPE saved without tokenizer.json (vocab.json + merges.txt, as many RoBERTa,
    Longformer and DeBERTa v1 checkpoints are): built by transformers' own conversion, as for a .model."""
    if not (path.parent / "merges.txt").is_file():
        raise InvalidTokenizerFile(f"{path} has no merges.txt beside it: a byte-level BPE tokenizer needs both")
    return HuggingFaceTokenizer.from_transformers_files(path.parent)


# What `load_tokenizer` looks for in a directory, in order of preference: tokenizer.json describes a Hugging Face
# tokenizer completely (offsets, added tokens), so it wins over a bare .model or vocab.txt next to it.
TOKENIZER_FILES: tuple[tuple[str, Callable[[pathlib.Path], Tokenizer]], ...] = (
    ("tokenizer.json", HuggingFaceTokenizer.from_file),
    ("*.model", _load_sentencepiece),
    ("vocab.txt", WordPieceTokenizer.from_file),
    ("vocab.json", _load_byte_level_bpe),
)
# A single file is loaded by its suffix.
TOKENIZER_SUFFIXES: dict[str, Callable[[pathlib.Path], Tokenizer]] = {
    ".json": HuggingFaceTokenizer.from_file,
    ".model": _load_sentencepiece,
    ".txt": WordPieceTokenizer.from_file,
}


def load_tokenizer(path: str | pathlib.Path) -> Tokenizer:
    """Load the tokenizer in `path`: a file (by suffix) or a directory (by the files present)."""
    path = pathlib.Path(path)
    if path.is_file():
        loader = TOKENIZER_SUFFIXES.get(path.suffix)
        if loader is None:
            raise ValueError(f"unknown tokenizer file type {str(path)!r}; expected one of "
                             f"{', '.join(TOKENIZER_SUFFIXES)}")
        return loader(path)
    if path.is_dir():
        for pattern, loader in TOKENIZER_FILES:
            matches = sorted(path.glob(pattern))
            if matches:
                return loader(matches[0])
        raise FileNotFoundError(f"no tokenizer in directory {str(path)!r}; expected one of "
                                f"{', '.join(p for p, _ in TOKENIZER_FILES)}")
    raise FileNotFoundError(f"tokenizer path {str(path)!r} does not exist")

