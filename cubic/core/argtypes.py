"""argparse types for cubic's flags: a value is refused while the command line is read, in argparse's
one line ("argument --steps: must be <= 10,000,000, got ..."). Below every layer, so that the CLI and
the campaign worker (``python -m cubic.codesign.worker``) share one definition of each bound."""

from __future__ import annotations

import argparse
import math
from typing import Callable


def _int_at_least(text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
    return value


def positive_int(text: str) -> int:
    return _int_at_least(text, 1)


def int_at_most(high: int, low: int = 1) -> Callable[[str], int]:
    """An argparse type: an integer in [low, high] (a size beyond what any model holds is a typo)."""
    def parse(text: str) -> int:
        value = _int_at_least(text, low)
        if value > high:
            raise argparse.ArgumentTypeError(f"must be <= {high:,}, got {text}")
        return value
    return parse


def nonnegative_int(text: str) -> int:
    return _int_at_least(text, 0)


def finite_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value):  # nan passes every comparison's "not below", inf every bound's
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
    return value


def positive_float(text: str) -> float:
    value = finite_float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def positive_float_at_most(high: float) -> Callable[[str], float]:
    """An argparse type: a number in (0, high] (the bound of the field the flag fills, named as the flag)."""
    def parse(text: str) -> float:
        value = positive_float(text)
        if value > high:
            raise argparse.ArgumentTypeError(f"must be <= {high:,.0f}, got {text}" if high == int(high)
                                             else f"must be <= {high:,.2f}, got {text}")
        return value
    return parse


def int_list_at_most(high: int) -> Callable[[str], list[int]]:
    """An argparse type: comma-separated integers, each in [1, high]."""
    def parse(text: str) -> list[int]:
        try:
            vals = [int(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
        if not vals or any(v < 1 for v in vals):
            raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
        if any(v > high for v in vals):
            raise argparse.ArgumentTypeError(f"each must be <= {high:,}, got {text!r}")
        return vals
    return parse


def nonnegative_float(text: str) -> float:
    value = finite_float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def fraction(text: str) -> float:
    """An argparse type: a share in [0, 1)."""
    value = nonnegative_float(text)
    if value >= 1:
        raise argparse.ArgumentTypeError(f"must be below 1, got {text}")
    return value


def port(text: str) -> int:
    value = nonnegative_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"must be <= 65535, got {text}")
    return value
