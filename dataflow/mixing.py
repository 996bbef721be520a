"""``Dataset.mix``: weighted interleaving of datasets (Ray Data's names and defaults).

The arguments are checked here, when the plan is built; ``engine.operators.mix`` does the
interleaving.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence

from dataflow.plan import LogicalNode, Mix


class MixStoppingCondition(enum.Enum):
    """When a mixed dataset ends (``ray.data.MixStoppingCondition``).

    ``STOP_ON_SHORTEST``: when the first input runs out; the rest of the others is not read.
    ``STOP_ON_LONGEST_DROP`` (the default): when the last one does; an input that runs out drops
    out, and later blocks come from the inputs left.
    """

    STOP_ON_SHORTEST = "stop_on_shortest"
    STOP_ON_LONGEST_DROP = "stop_on_longest_drop"


def mix_node(children: Sequence[LogicalNode], weights: Sequence[float] | None,
             stopping_condition: MixStoppingCondition | str) -> Mix:
    """The plan node, or ``ValueError``/``TypeError`` naming what is wrong with the arguments."""
    if weights is None:
        weights = [1.0] * len(children)
    if isinstance(weights, (str, bytes)) or not isinstance(weights, Sequence):
        raise TypeError(f"weights must be a list of numbers, got {type(weights).__name__}")
    if len(weights) != len(children):
        raise ValueError(f"Number of datasets ({len(children)}) must match number of weights ({len(weights)}).")
    for weight in weights:
        if isinstance(weight, bool) or not isinstance(weight, (int, float)):
            raise TypeError(f"weights must be numbers, got {weight!r}")
        if not math.isfinite(weight) or weight <= 0:
            raise ValueError(f"Weights must be positive (and finite), got {list(weights)}")
    try:
        condition = MixStoppingCondition(stopping_condition)
    except ValueError:
        names = ", ".join(c.name for c in MixStoppingCondition)
        raise ValueError(f"stopping_condition must be a MixStoppingCondition ({names}), "
                         f"got {stopping_condition!r}") from None
    total = float(sum(weights))
    return Mix(tuple(children), tuple(w / total for w in weights),
               stop_on_shortest=condition is MixStoppingCondition.STOP_ON_SHORTEST)
