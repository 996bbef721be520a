"""``ray.data._internal.util.is_null`` and ``is_nan``, as Ray's aggregation guide imports them."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["is_nan", "is_null"]


def is_nan(value: Any) -> bool:
    """A float NaN (Python's or numpy's); False for anything else."""
    return isinstance(value, (float, np.floating)) and math.isnan(value)


def is_null(value: Any) -> bool:
    """None or NaN: what Ray's aggregations count as missing."""
    return value is None or is_nan(value)
