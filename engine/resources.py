"""GPUs as a resource: how many this machine has, and which ones each worker may use.

``GpuLedger`` hands out GPU ids to actor workers (``CUDA_VISIBLE_DEVICES`` is set from the
grant before the worker starts). Whole requests (``num_gpus=2``) get GPUs nobody uses;
fractional ones (``num_gpus=0.25``) are packed onto the GPU with the least room that still
fits, so four such actors share one device. Pure bookkeeping: no CUDA calls.
"""

from __future__ import annotations

import math
import os


def visible_gpu_ids() -> list[str]:
    """The ids of the GPUs this process may use, as ``CUDA_VISIBLE_DEVICES`` names them.

    Without that variable: one per GPU the driver lists in ``/proc/driver/nvidia/gpus``, or, where a
    container hides that folder, one per ``/dev/nvidiaN`` device node. No torch import, no CUDA init.
    """
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        ids = [d.strip() for d in visible.split(",")]
        if "-1" in ids:  # CUDA stops at the first invalid id
            ids = ids[: ids.index("-1")]
        return [d for d in ids if d]
    try:
        return [str(i) for i in range(len(os.listdir("/proc/driver/nvidia/gpus")))]
    except OSError:
        pass
    nodes = [name for name in _dev_entries() if name.startswith("nvidia") and name[6:].isdigit()]
    return [str(i) for i in range(len(nodes))]


def _dev_entries() -> list[str]:
    try:
        return os.listdir("/dev")
    except OSError:
        return []


def detect_gpus() -> int:
    """GPUs visible to this process, without importing torch or initializing CUDA."""
    return len(visible_gpu_ids())


class GpuLedger:
    """Free capacity (1.0 per device) of each GPU."""

    def __init__(self, num_gpus: int) -> None:
        self.free = [1.0] * num_gpus

    def acquire(self, amount: float) -> tuple[int, ...] | None:
        """GPU ids for a worker needing ``amount`` GPUs, or None if they are not free now."""
        if amount <= 0:
            return ()
        eps = 1e-9
        if amount < 1:
            fits = [i for i, f in enumerate(self.free) if f + eps >= amount]
            if not fits:
                return None
            best = min(fits, key=lambda i: self.free[i])
            self.free[best] -= amount
            return (best,)
        whole = math.ceil(amount - eps)
        idle = [i for i, f in enumerate(self.free) if f >= 1 - eps]
        if len(idle) < whole:
            return None
        for i in idle[:whole]:
            self.free[i] = 0.0
        return tuple(idle[:whole])

    def release(self, ids: tuple[int, ...], amount: float) -> None:
        share = amount if amount < 1 else 1.0
        for i in ids:
            self.free[i] = min(1.0, self.free[i] + share)

    def how_many(self, amount: float) -> int:
        """How many more workers needing ``amount`` GPUs would fit now."""
        if amount <= 0:
            return 1 << 30
        if amount < 1:
            return sum(int((f + 1e-9) // amount) for f in self.free)
        return sum(1 for f in self.free if f >= 1 - 1e-9) // math.ceil(amount - 1e-9)


class ResourceLedger:
    """CPUs and custom resources in use by running tasks: a task starts only where its share is free.

    Actors count while they run a task, not while idle, so an idle pool never starves the tasks
    that feed it; nothing running means anything that fits the machine may start.
    """

    def __init__(self, cpus: float, custom: dict[str, float]) -> None:
        self.cpus = float(cpus)
        self.custom = dict(custom)
        self.used_cpus = 0.0
        self.used_custom: dict[str, float] = {}

    def fits(self, num_cpus: float, custom: tuple[tuple[str, float], ...] = ()) -> bool:
        eps = 1e-9
        if self.used_cpus + num_cpus > self.cpus + eps and self.used_cpus > eps:
            return False
        return all(self.used_custom.get(name, 0.0) + amount <= self.custom.get(name, 0.0) + eps for name, amount in custom)

    def take(self, num_cpus: float, custom: tuple[tuple[str, float], ...] = ()) -> None:
        self.used_cpus += num_cpus
        for name, amount in custom:
            self.used_custom[name] = self.used_custom.get(name, 0.0) + amount

    def give(self, num_cpus: float, custom: tuple[tuple[str, float], ...] = ()) -> None:
        self.used_cpus = max(0.0, self.used_cpus - num_cpus)
        for name, amount in custom:
            self.used_custom[name] = max(0.0, self.used_custom.get(name, 0.0) - amount)
