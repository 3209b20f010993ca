"""Shared building blocks of the wire models: the base model, UTC datetimes, str enums.

Wire models keep pydantic's defaults (unknown fields ignored, ordinary coercion) so
older peers accept newer messages; they defer schema building so importing the
protocol stays cheap until a model is first used.
"""

from __future__ import annotations

import enum
import sys
from datetime import datetime, timezone
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict


def utcnow() -> datetime:
    """The current time as a timezone-aware UTC datetime."""
    return datetime.now(timezone.utc)


def as_utc(value: datetime) -> datetime:
    """Naive datetimes are read as UTC; aware ones are converted to UTC."""
    if value.tzinfo is None:
        return value.replace(tzinfo=timezone.utc)
    return value.astimezone(timezone.utc)


UtcDatetime = Annotated[datetime, AfterValidator(as_utc)]


class WireModel(BaseModel):
    model_config = ConfigDict(defer_build=True)


if sys.version_info >= (3, 11):
    StrEnum = enum.StrEnum
else:  # pragma: no cover - exercised on 3.10 only

    class StrEnum(str, enum.Enum):
        """A str enum whose str() and format() give the value, as 3.11's StrEnum."""

        def __str__(self) -> str:
            return str(self.value)

        def __format__(self, format_spec: str) -> str:
            return format(str(self.value), format_spec)
