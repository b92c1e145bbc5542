"""The embedded default corpus: the English documentation that ships inside the running Python interpreter.

No download, present on every machine, and deterministic for one interpreter build. Documents, in this order:
1. every pydoc help topic (`pydoc_data.topics.topics`, sorted by topic name);
2. for every standard-library `.py` file (sorted by relative path; its own tests included, installed
   third-party packages left out): the module, class and function docstrings, one document each, read with `ast`
   from the source so that nothing is imported or executed;
3. for the same files: the prose of their full-line comment blocks, one document per file;
4. the docstrings of the modules compiled into the interpreter (`sys.builtin_module_names`: already linked in, so
   importing them runs no file and opens nothing) and of their public members.

Repeated texts are kept once. For CPython 3.11: about 12,700 documents, 5 MB, 1.2M tokens with an 8k vocabulary.
Parsing some 1,800 files takes 20-30 s on a small machine, so the corpus is cached as JSON under
`~/.cache/bertjax` (or `$BERTJAX_CACHE_DIR`) keyed by the interpreter build. A document belongs to the held-out
split when the hash of its text falls below `eval_fraction`: stable across runs and machines, independent of
document order.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib
import inspect
import json
import logging
import os
import pathlib
import sys
import sysconfig
import warnings

log = logging.getLogger(__name__)

# Bump when the extraction rules change, so stale caches are not reused.
CORPUS_VERSION = 1
DEFAULT_EVAL_FRACTION = 0.02
# Directories of the standard library's tree that hold third-party packages or bytecode, not documentation.
_SKIPPED_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__"})
# Docstrings shorter than this many words ("Docstring.", "XXX") are noise rather than documentation.
_MIN_WORDS = 3
# A comment block is kept when it is long enough and mostly letters (not commented-out code or ASCII art).
_MIN_COMMENT_CHARS = 40
_MIN_COMMENT_LETTER_FRACTION = 0.6


def default_corpus_documents(split: str = "all", eval_fraction: float = DEFAULT_EVAL_FRACTION) -> list[str]:
    """The default corpus as a list of documents; `split` is "train", "eval" or "all"."""
    documents = _all_documents()
    if split == "all":
        return list(documents)
    return [doc for doc in documents if in_split(doc, split, eval_fraction)]


def in_split(text: str | bytes, split: str, eval_fraction: float) -> bool:
    """Whether a document belongs to `split` ("train", "eval", "all") under a hash split of its text."""
    if split == "all":
        return True
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train', 'eval' or 'all', got {split!r}")
    if not 0.0 <= eval_fraction < 1.0:
        raise ValueError(f"eval_fraction must be in [0, 1), got {eval_fraction}")
    data = text.encode("utf-8") if isinstance(text, str) else text
    # The first 8 bytes of a SHA-256 are uniform: comparing them with a threshold samples the fraction exactly
    # in expectation and never depends on the order in which documents are seen.
    bucket = int.from_bytes(hashlib.sha256(data).digest()[:8], "big") / 2.0**64
    return (bucket < eval_fraction) == (split == "eval")


@functools.lru_cache(maxsize=1)
def _all_documents() -> tuple[str, ...]:
    cache_path = _cache_path()
    if cache_path is not None and cache_path.is_file():
        try:
            return tuple(json.loads(cache_path.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            log.warning("ignoring unreadable default-corpus cache %s", cache_path)
    documents = tuple(_build_documents())
    if cache_path is not None:
        _write_cache(cache_path, documents)
    return documents


def _cache_path() -> pathlib.Path | None:
    root = os.environ.get("BERTJAX_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "bertjax")
    build = f"{sys.implementation.name}-{sys.version}-{sysconfig.get_paths()['stdlib']}-v{CORPUS_VERSION}"
    key = hashlib.sha256(build.encode("utf-8")).hexdigest()[:16]
    return pathlib.Path(root) / f"default-corpus-{key}.json"


def _write_cache(path: pathlib.Path, documents: tuple[str, ...]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Write then rename: concurrent processes building the cache never read a half-written file.
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(list(documents)), encoding="utf-8")
        os.replace(tmp, path)
    except OSError as error:
        log.warning("could not cache the default corpus at %s: %s", path, error)


def _build_documents() -> list[str]:
    documents = _pydoc_topics()
    per_file = [_file_documents(path) for path in _stdlib_sources()]
    for docstrings, _ in per_file:
        documents.extend(docstrings)
    documents.extend(comments for _, comments in per_file if comments)
    documents.extend(_builtin_module_docstrings())
    # Many methods share one docstring ("Return self==value."): keep the first occurrence only.
    return list(dict.fromkeys(documents))


def _pydoc_topics() -> list[str]:
    try:
        from pydoc_data.topics import topics
    except ImportError:  # some distributions strip pydoc_data
        return []
    return [topics[name].strip() for name in sorted(topics) if topics[name].strip()]


def _stdlib_sources() -> list[pathlib.Path]:
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    paths = [p for p in root.rglob("*.py") if not _SKIPPED_DIRS.intersection(p.relative_to(root).parts[:-1])]
    return sorted(paths, key=lambda p: p.relative_to(root).as_posix())


def _file_documents(path: pathlib.Path) -> tuple[list[str], str]:
    """The docstrings of one source file and the prose of its comment blocks."""
    try:
        source = path.read_bytes()
        with warnings.catch_warnings():  # old test files hold invalid escapes ("\("): not our concern
            warnings.simplefilter("ignore")
            tree = ast.parse(source, filename=str(path))
    except (SyntaxError, ValueError, OSError):  # a few stdlib files are deliberately invalid (lib2to3 data)
        return [], ""
    return _docstrings(tree), _comment_prose(source.decode("utf-8", errors="replace"), tree)


def _docstrings(tree: ast.Module) -> list[str]:
    documents = []
    # ast.walk's breadth-first order is fixed by the source, so the document order is stable across runs;
    # it also reaches definitions nested in `if`/`try` blocks, common in the standard library.
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=True)
            if doc and len(doc.split()) >= _MIN_WORDS:
                documents.append(doc.strip())
    return documents


def _comment_prose(source: str, tree: ast.Module) -> str:
    # Lines inside multi-line strings can start with "#" too; the syntax tree says where strings are.
    # (Cheaper than the tokenize module, which would triple the build time.)
    in_string = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.end_lineno != node.lineno:
            in_string.update(range(node.lineno, node.end_lineno + 1))
    blocks, block = [], []
    for number, line in enumerate(source.splitlines(), start=1):
        stripped = line.strip()
        if stripped.startswith("#") and number not in in_string:
            text = stripped.lstrip("#").strip()
            if text and not text.startswith("!") and "-*-" not in text:
                block.append(text)
        elif block:
            blocks.append(" ".join(block))
            block = []
    if block:
        blocks.append(" ".join(block))
    prose = [b for b in blocks if len(b) >= _MIN_COMMENT_CHARS
             and sum(c.isalpha() or c.isspace() for c in b) >= _MIN_COMMENT_LETTER_FRACTION * len(b)]
    return "\n".join(prose)


def _builtin_module_docstrings() -> list[str]:
    documents = []
    for name in sorted(sys.builtin_module_names):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        for obj in [module] + [value for key, value in sorted(vars(module).items()) if not key.startswith("_")]:
            if not (inspect.ismodule(obj) or inspect.isclass(obj) or inspect.isroutine(obj)):
                continue
            if inspect.ismodule(obj) and obj is not module:
                continue
            # The object's own docstring only: inspect.getdoc would repeat inherited ones.
            doc = obj.__doc__ if isinstance(obj.__doc__, str) else ""
            doc = inspect.cleandoc(doc)
            if len(doc.split()) >= _MIN_WORDS:
                documents.append(doc.strip())
    return documents
