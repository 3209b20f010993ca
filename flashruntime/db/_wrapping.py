"""What both error translations do to a store class: wrap each of its public methods (its
own and those it inherits) and ``__enter__``/``__exit__`` once, so a base class's methods
translate in every subclass that asks for it."""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable
from typing import Any, TypeVar

_C = TypeVar("_C", bound=type)
_DUNDERS = ("__enter__", "__exit__")
_MARK = "_flashruntime_translates"


def wrap_public_methods(cls: _C, kind: str, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> _C:
    """``cls`` with ``wrap(method)`` in place of each public plain method found on it (static
    and class methods and properties are left alone); a method that a translation of the same
    ``kind`` wrapped already (a decorated base class's) is not wrapped again."""
    for name in dir(cls):
        if name.startswith("_") and name not in _DUNDERS:
            continue
        value = inspect.getattr_static(cls, name)
        if not isinstance(value, types.FunctionType) or getattr(value, _MARK, None) == kind:
            continue
        wrapped = wrap(value)
        setattr(wrapped, _MARK, kind)
        setattr(cls, name, wrapped)
    return cls
