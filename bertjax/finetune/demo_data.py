"""A real labelled text dataset that needs no download: docstrings of the running interpreter's standard library,
labelled with the package they document.

    python -m bertjax.finetune.demo_data --out data/stdlib-packages
    -> train.jsonl, validation.jsonl: {"text": <first paragraph of a docstring>, "label": "asyncio" | ...}

The texts are human-written English about five different subjects (event loops, e-mail messages, logging, XML,
GUI widgets), read with `ast` from the sources so nothing is imported or run. Each package contributes at most
`PER_LABEL` docstrings (the first ones in sorted file order), so the classes are close to balanced. A docstring goes
to validation when the hash of its text falls below `VALIDATION_FRACTION`: stable across runs and machines.
The pretraining corpus (bertjax.data.default_corpus) holds these docstrings as unlabelled text; the package labels
are what fine-tuning learns.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import logging
import pathlib
import sysconfig

from bertjax.jsonl import write_json_objects

log = logging.getLogger(__name__)

PACKAGES = ("asyncio", "email", "logging", "xml", "tkinter")
PER_LABEL = 250
MIN_CHARACTERS = 40  # shorter docstrings ("Return self.") name no subject
VALIDATION_FRACTION = 0.2


def _first_paragraph(text: str) -> str:
    return " ".join(text.strip().split("\n\n")[0].split())


def _package_root(package: str) -> pathlib.Path:
    return pathlib.Path(sysconfig.get_paths()["stdlib"]) / package


def available_packages() -> list[str]:
    """The packages of PACKAGES whose sources this interpreter has (some Linux distributions package tkinter apart).
    Fewer than two make no classification task: an error naming what there is."""
    found = [package for package in PACKAGES if any(_package_root(package).glob("*.py"))]
    if len(found) < 2:
        raise RuntimeError(f"the standard library at {sysconfig.get_paths()['stdlib']} has the sources of {found} "
                           f"only: fewer than two of {list(PACKAGES)} to classify")
    return found


def package_docstrings(package: str) -> list[str]:
    """Class and function docstrings of one standard-library package, its own tests left out."""
    root = _package_root(package)
    texts: list[str] = []
    for path in sorted(root.rglob("*.py")):
        if any(part.startswith("test") for part in path.relative_to(root).parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                doc = ast.get_docstring(node)
                if doc and len(_first_paragraph(doc)) >= MIN_CHARACTERS:
                    texts.append(_first_paragraph(doc))
    return list(dict.fromkeys(texts))[:PER_LABEL]


def is_validation(text: str) -> bool:
    digest = int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big")
    return digest / 2 ** 64 < VALIDATION_FRACTION


def write_dataset(out: str | pathlib.Path) -> dict[str, int]:
    """Write train.jsonl and validation.jsonl under `out`; returns the number of examples per split."""
    packages = available_packages()
    if len(packages) < len(PACKAGES):
        log.warning("this interpreter's standard library lacks %s: the dataset has %d labels",
                    sorted(set(PACKAGES) - set(packages)), len(packages))
    splits: dict[str, list[dict]] = {"train": [], "validation": []}
    seen: set[str] = set()
    for package in packages:
        for text in package_docstrings(package):
            if text in seen:  # the same sentence in two packages would carry two labels
                continue
            seen.add(text)
            split = "validation" if is_validation(text) else "train"
            splits[split].append({"text": text, "label": package})
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for split, rows in splits.items():
        write_json_objects(out / f"{split}.jsonl", rows)
    return {split: len(rows) for split, rows in splits.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))  # the first paragraph
    parser.add_argument("--out", required=True, help="directory for train.jsonl and validation.jsonl")
    counts = write_dataset(parser.parse_args(argv).out)
    print(f"{counts['train']} training and {counts['validation']} validation docstrings, "
          f"labels {available_packages()}")


if __name__ == "__main__":
    main()
