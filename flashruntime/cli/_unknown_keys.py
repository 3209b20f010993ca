"""Keys of a request file that its model does not have, for a warning (wire models ignore unknown fields:
wire models ignore unknown fields, so a misspelt key would otherwise change the result
without a word). Walks nested models, lists and dicts of models, honours aliases, and
never looks inside free-form dicts (``parameters``, ``labels``, ``env``). Pure.
"""

from __future__ import annotations

import collections.abc
import contextlib
import difflib
import sys
import types
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union

from pydantic import AliasChoices, AliasPath, BaseModel
from pydantic.fields import FieldInfo

__all__ = ["UnknownKey", "print_warnings", "unknown_keys", "warning_lines"]

_SEQUENCES = (list, tuple, set, frozenset, collections.abc.Sequence, collections.abc.Set)
_MAPPINGS = (dict, collections.abc.Mapping)


@dataclass(frozen=True)
class UnknownKey:
    path: str  # dotted from the top, list items as [i]: "workload.methd", "spec.items[2].nmae"
    suggestion: str | None  # the closest key the model accepts there, if any is close


def unknown_keys(model: type[BaseModel], data: Any) -> list[UnknownKey]:
    """Every key of ``data`` that ``model`` (recursively) ignores, in document order."""
    return list(_walk(model, data, ""))


def warning_lines(command: str, model: type[BaseModel], data: Any) -> list[str]:
    """One ``flashruntime <command>: warning: ...`` line per unknown key."""
    lines = []
    for unknown in unknown_keys(model, data):
        hint = f" (did you mean {unknown.suggestion!r}?)" if unknown.suggestion else ""
        lines.append(f"flashruntime {command}: warning: {unknown.path} is not a field of {model.__name__} "
                     f"and is ignored{hint}")
    return lines


def print_warnings(command: str, model: type[BaseModel], data: Any) -> None:
    """``warning_lines`` on stderr. Advice only: a stderr whose reader is gone stops nothing."""
    with contextlib.suppress(BrokenPipeError):
        for line in warning_lines(command, model, data):
            print(line, file=sys.stderr)


def _walk(model: type[BaseModel], data: Any, prefix: str) -> Iterator[UnknownKey]:
    if not isinstance(data, Mapping):
        return  # not an object: validation says so, not us
    accepted = _accepted_keys(model)
    warn = model.model_config.get("extra") != "allow"  # "allow" keeps unknown keys: not ignored
    for key, value in data.items():
        path = f"{prefix}{key}"
        field = accepted.get(key) if isinstance(key, str) else None
        if field is None:
            if warn:
                yield UnknownKey(path, _suggest(str(key), accepted))
            continue
        yield from _walk_value(field.annotation, field.discriminator, value, path)


def _walk_value(annotation: Any, discriminator: Any, value: Any, path: str) -> Iterator[UnknownKey]:
    """Recurse into ``value`` as far as ``annotation`` names models."""
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        inner, *metadata = typing.get_args(annotation)
        for item in metadata:
            if isinstance(item, FieldInfo) and item.discriminator is not None:
                discriminator = item.discriminator
        yield from _walk_value(inner, discriminator, value, path)
    elif origin is Union or origin is types.UnionType:
        arms = [arm for arm in typing.get_args(annotation) if arm is not type(None)]
        if len(arms) == 1:  # Optional[X]
            yield from _walk_value(arms[0], discriminator, value, path)
            return
        model = _union_arm(arms, discriminator, value)
        if model is not None:
            yield from _walk(model, value, path + ".")
    elif origin in _SEQUENCES:
        args = [arg for arg in typing.get_args(annotation) if arg is not Ellipsis]
        if len(args) == 1 and isinstance(value, (list, tuple)):
            for index, item in enumerate(value):
                yield from _walk_value(args[0], discriminator, item, f"{path}[{index}]")
    elif origin in _MAPPINGS:
        args = typing.get_args(annotation)
        if len(args) == 2 and isinstance(value, Mapping):
            for key, item in value.items():  # the keys are free; only model values are looked into
                yield from _walk_value(args[1], discriminator, item, f"{path}.{key}")
    elif isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield from _walk(annotation, value, path + ".")


def _union_arm(arms: list[Any], discriminator: Any, value: Any) -> type[BaseModel] | None:
    """The model arm ``value`` validates as: the only one, or the one its discriminator
    value selects. None when that cannot be told (then nothing below is warned about)."""
    models = [arm for arm in arms if isinstance(arm, type) and issubclass(arm, BaseModel)]
    if len(models) == 1:
        return models[0]
    if not isinstance(discriminator, str) or not isinstance(value, Mapping):
        return None
    tag = value.get(discriminator)
    for model in models:
        field = _accepted_keys(model).get(discriminator)
        if field is None or typing.get_origin(field.annotation) is not Literal:
            continue
        if tag in typing.get_args(field.annotation):
            return model
    return None


def _accepted_keys(model: type[BaseModel]) -> dict[str, FieldInfo]:
    """Each key pydantic reads for a field of ``model``: its alias(es), and its name when
    it has no alias or the model also validates by name."""
    config = model.model_config
    by_name = bool(config.get("validate_by_name") or config.get("populate_by_name"))
    by_alias = config.get("validate_by_alias", True)
    accepted: dict[str, FieldInfo] = {}
    for name, field in model.model_fields.items():
        aliases = _validation_aliases(field) if by_alias else []
        if not aliases or by_name:
            accepted[name] = field
        for alias in aliases:
            accepted[alias] = field
    return accepted


def _validation_aliases(field: FieldInfo) -> list[str]:
    alias = field.validation_alias if field.validation_alias is not None else field.alias
    choices = alias.choices if isinstance(alias, AliasChoices) else [alias]
    keys = []
    for choice in choices:
        if isinstance(choice, AliasPath):
            choice = choice.path[0] if choice.path else None
        if isinstance(choice, str):
            keys.append(choice)
    return keys


def _suggest(key: str, accepted: Mapping[str, Any]) -> str | None:
    """The accepted key closest to ``key``, ignoring case, '_' and '-' (max_steps ~ maxSteps)."""
    def squash(text: str) -> str:
        return text.lower().replace("_", "").replace("-", "")

    by_squashed = {squash(name): name for name in accepted}
    close = difflib.get_close_matches(squash(key), list(by_squashed), n=1, cutoff=0.6)
    return by_squashed[close[0]] if close else None
