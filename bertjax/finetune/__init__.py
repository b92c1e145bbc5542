"""Fine-tuning: `bertjax finetune`, `bertjax predict`, `bertjax glue`.

The path of a run, file by file:
    readers.py   data file (CSV, TSV, JSONL, Parquet) -> rows
    tasks/       rows -> label space and fixed-shape arrays; loss, metrics, prediction records (one file per task)
    encoding.py  [CLS] a [SEP] b [SEP] rows, truncation, word -> first sub-token alignment
    qa.py        question-answering windows (doc_stride), answer <-> token spans through offsets, best span
    packing.py   several short classification examples per row
    batches.py   shuffled fixed-size batches as a pure function of (seed, step): exact resume
    trainer.py   model directory -> task model -> jitted step -> evaluations, checkpoints, best/
    metrics.py   the metrics, in numpy;  report.py  metrics.jsonl, results.json, finetune.png
    config.py    the typed run config (configs/finetune/);  glue.py  the GLUE protocol;  demo_data.py  offline data
"""
