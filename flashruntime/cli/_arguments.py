"""Option value types shared by the subcommands: a bad value is argparse's usage error
(exit 2) naming the option, before anything runs."""

from __future__ import annotations

import argparse
from collections.abc import Callable

__all__ = ["whole_number"]


def whole_number(option: str, minimum: int) -> Callable[[str], int]:
    """The type of an option that takes a whole number >= ``minimum``."""

    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{option} must be a whole number, got {value!r}") from None
        if number < minimum:
            raise argparse.ArgumentTypeError(f"{option} must be >= {minimum}, got {number}")
        return number

    return parse
