"""argparse ``type=`` functions that refuse a bad number where it is parsed, so argparse's
error names the flag (``argument --jobs: must be an int >= 1, got 0``). Standard library
only: these run while ``kvtier --help`` builds its parser."""

from __future__ import annotations

import argparse
import math


def int_at_least(minimum: int):
    """A type for whole numbers >= ``minimum``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an int >= {minimum}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be an int >= {minimum}, got {value}")
        return value

    parse.__name__ = f"int >= {minimum}"
    return parse


def positive_finite(text: str) -> float:
    """A finite number > 0 (``inf``, ``nan``, 0 and negatives refused)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value
