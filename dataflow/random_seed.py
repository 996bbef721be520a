"""Seeds of the random steps of a plan (``random_shuffle``, ``randomize_block_order``,
``random_sample``): an int, None, or Ray's ``RandomSeedConfig``.

An int gives the same result in every execution; None a different one each time; a
``RandomSeedConfig(seed, reseed_after_execution=True)`` a different result in each execution of
the dataset that is still the same from one run of the program to the next: execution ``k``
(the ``k``-th time the dataset, or one made from it, runs: an epoch of a training loop) uses a
seed drawn from ``(seed, k)``, ``k`` the number of the execution in this process (any
dataset's), as Ray's ``DataContext`` numbers them: the same dataset built twice gives different
results, and a program that runs the same executions in the same order gets the same ones.
Executions are numbered as their plans are compiled, so one that fails still takes its number
(Ray counts only those that succeed).
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass

_EXECUTIONS = itertools.count()
"""Executions compiled in this process (Ray's ``DataContext._execution_idx``)."""
_COMPILING: ContextVar[int | None] = ContextVar("dataflow_compiling", default=None)


@dataclass
class RandomSeedConfig:
    """Ray's ``ray.data.RandomSeedConfig``: ``seed`` (None: a different result every time),
    ``reseed_after_execution`` (with a seed: True draws a new seed from ``(seed, execution
    number)`` for each execution, False uses ``seed`` in every one), ``use_timestamp_as_default``
    (accepted; a seedless step here draws its seed once per execution, so a retried task
    already repeats its own output, which is what Ray's timestamp seed is for)."""

    seed: int | None = None
    reseed_after_execution: bool = True
    use_timestamp_as_default: bool = False

    def __post_init__(self) -> None:
        if self.seed is not None and not isinstance(self.seed, int):
            msg = "Seed must be an integer or None."
            raise ValueError(msg)


@contextlib.contextmanager
def compiling() -> Iterator[None]:
    """The compilation of one execution's plan: it takes the next execution number, which every
    random step in it gets, however often it asks."""
    token = _COMPILING.set(next(_EXECUTIONS))
    try:
        yield
    finally:
        _COMPILING.reset(token)


class StepSeed:
    """The seed of one random step, shared by every dataset made from it."""

    def __init__(self, seed: int | RandomSeedConfig | None) -> None:
        if isinstance(seed, RandomSeedConfig):
            self.config = RandomSeedConfig(seed.seed, seed.reseed_after_execution, seed.use_timestamp_as_default)
        elif seed is None or (isinstance(seed, int) and not isinstance(seed, bool)):
            self.config = RandomSeedConfig(seed, reseed_after_execution=False)
        else:
            msg = f"Invalid seed type: {type(seed)}"
            raise ValueError(msg)

    @property
    def given(self) -> bool:
        """A seed was given: each execution's result is fixed (and the steps after it keep it)."""
        return self.config.seed is not None

    def for_execution(self) -> int | None:
        """The seed of the execution being compiled (None: draw one)."""
        seed = self.config.seed
        if seed is None or not self.config.reseed_after_execution:
            return seed
        return execution_seed(seed, execution_number())

    def __repr__(self) -> str:
        return repr(self.config.seed) if not self.config.reseed_after_execution else repr(self.config)


def execution_number() -> int:
    """The number of the execution being compiled (outside a compilation: a new one)."""
    number = _COMPILING.get()
    return next(_EXECUTIONS) if number is None else number


def execution_seed(seed: int, execution: int) -> int:
    """A 63-bit seed drawn from ``(seed, execution)``, the same in every process and run."""
    digest = hashlib.blake2b(f"{seed}:{execution}".encode(), digest_size=8).digest()
    return int.from_bytes(digest) >> 1
