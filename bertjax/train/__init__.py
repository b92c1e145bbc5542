"""Pretraining: run config, optimizers and schedules, objectives, mesh and sharded state, the jitted step,
checkpoints, metrics and the loop. `bertjax pretrain` (bertjax/commands/pretrain.py) is the entry point.

Read in data-flow order: run_config -> mesh -> state -> objectives -> step -> checkpoints -> metrics -> loop.
"""

from __future__ import annotations

import importlib

# The Python entry points (notebooks, scripts), imported on first use so `import bertjax.train` stays light.
_EXPORTS = {
    "pretrain": "bertjax.train.loop",
    "PretrainResult": "bertjax.train.loop",
    "load_run_config": "bertjax.train.run_config",
    "run_config_from_dict": "bertjax.train.run_config",
    "read_metrics": "bertjax.train.metrics",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'bertjax.train' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
