"""Registries name their implementations by import path ("module:function"), so a backend's module (Pallas TPU,
Pallas GPU) is imported only when something asks for it."""

from __future__ import annotations

import importlib
from typing import Callable


def load_function(path: str) -> Callable:
    """The function at "module:function"."""
    module_name, function_name = path.split(":")
    return getattr(importlib.import_module(module_name), function_name)
