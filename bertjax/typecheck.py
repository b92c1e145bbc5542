"""Runtime check of a frozen dataclass's field values against its annotations.

Frozen dataclasses do not check their annotations, and a config that silently holds "32" for an int, or 1 for a
bool, fails much later and far from the cause. Configs call `check_field_types(self)` in `__post_init__`.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Literal


def check_field_types(instance) -> None:
    """Raise ValueError naming `Class.field` for the first field whose value does not match its annotation."""
    cls = type(instance)
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(instance):
        value, annotation = getattr(instance, field.name), hints[field.name]
        if not matches(value, annotation):
            what = ("a finite number" if isinstance(value, float) and not math.isfinite(value)
                    else describe(annotation))
            raise ValueError(f"{cls.__name__}.{field.name} must be {what}, got {value!r}")


def describe(annotation) -> str:
    """An annotation as a reader would write it: "int", "one of 'float32', 'bfloat16'", "float or None"."""
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return "one of " + ", ".join(repr(arg) for arg in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(describe(arg) for arg in typing.get_args(annotation))
    if annotation is type(None):
        return "None"
    if origin is tuple:
        return f"a tuple of {describe(typing.get_args(annotation)[0])}"
    return getattr(annotation, "__name__", str(annotation))


def matches(value, annotation) -> bool:
    """Whether `value` fits `annotation` (Literal, unions, None, tuple[X, ...] and plain classes; bool is not an int
    here)."""
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return value in typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(matches(value, arg) for arg in typing.get_args(annotation))
    if annotation is type(None):
        return value is None
    if origin is tuple:  # tuple[X, ...] only: a tuple (hashable, unlike a list) of X
        args = typing.get_args(annotation)
        if len(args) != 2 or args[1] is not Ellipsis:
            raise TypeError(f"check_field_types supports tuple[X, ...] only, got {annotation}")
        return isinstance(value, tuple) and all(matches(item, args[0]) for item in value)
    if annotation is float:  # NaN and infinities are never a meaningful setting, and poison whatever reads them
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, annotation)
