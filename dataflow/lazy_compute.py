"""``pyarrow.compute``, imported when a function of it is first used.

Importing ``pyarrow.compute`` builds a Python wrapper for each of Arrow's compute functions:
50-80 ms, as much as the rest of ``import dataflow``. The modules on the import path (sorting,
aggregation, expressions) reach it through ``pc`` below, so a script that only maps and reads
does not pay for it. Type checkers see the real module (``if TYPE_CHECKING`` at each import).
"""

from __future__ import annotations

from typing import Any


class _LazyCompute:
    def __getattr__(self, name: str) -> Any:
        import pyarrow.compute

        value = getattr(pyarrow.compute, name)
        # Later lookups find the function on this object and never reach __getattr__.
        setattr(self, name, value)
        return value

    def __repr__(self) -> str:
        return "<pyarrow.compute, imported at first use>"


pc: Any = _LazyCompute()
