#!/usr/bin/env bash
# Semantic search over the embedded default corpus (Python's own documentation), end to end:
#   1. write the corpus as one paragraph per line (runs/search/docs.txt),
#   2. `bertjax embed` it into runs/search/docs.npy (+ docs.json: model, fingerprint, input),
#   3. `bertjax search` a few queries against it.
#
#   bash launch/search_demo.sh [MODEL_DIR] [PARAGRAPHS]
#
# MODEL_DIR: any embedding model bertjax reads: a sentence-transformers directory, a transformers checkpoint, or
# a pretraining workdir (default runs/tiny, the README's main job; mean pooling then). A workdir of
# `bertjax train-embedder` gives far better hits than a model pretrained for MLM alone.
# PARAGRAPHS: how many paragraphs to embed (default 5000; the corpus has some 17,600 of 8 words or more).
set -euo pipefail
MODEL=${1:-runs/tiny}
COUNT=${2:-5000}
OUT=runs/search
mkdir -p "$OUT"

python3 - "$OUT/docs.txt" "$COUNT" <<'EOF'
import sys
from bertjax.data import default_corpus_documents

path, count = sys.argv[1], int(sys.argv[2])
paragraphs = []
for document in default_corpus_documents("all"):
    for paragraph in document.split("\n\n"):
        text = " ".join(paragraph.split())  # one line per text: newlines inside a paragraph become spaces
        if len(text.split()) >= 8:
            paragraphs.append(text)
with open(path, "w", encoding="utf-8") as f:
    f.writelines(p + "\n" for p in paragraphs[:count])
print(f"{min(count, len(paragraphs))} of {len(paragraphs)} paragraphs -> {path}")
EOF

bertjax embed --model "$MODEL" --input "$OUT/docs.txt" --output "$OUT/docs.npy"
bertjax search --model "$MODEL" --corpus "$OUT/docs.npy" -k 5 \
    --query "How do I read a file line by line?" \
    --query "sort a list of dictionaries by a key" \
    --query "run a subprocess and capture its output"
