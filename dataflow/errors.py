"""The exceptions users catch. A failing UDF raises an instance of both ``UserCodeError`` and
the UDF's own exception class, so ``except ValueError`` still works."""

from __future__ import annotations

from engine.errors import (
    ColumnNotFoundError,
    DataflowError,
    EngineError,
    ObjectStoreFullError,
    ResourceError,
    SplitCoordinatorLostError,
    TaskTimeoutError,
    UDFOutputError,
    UserCodeError,
    WorkerDiedError,
)

__all__ = [
    "ColumnNotFoundError",
    "DataflowError",
    "EngineError",
    "ObjectStoreFullError",
    "ResourceError",
    "SplitCoordinatorLostError",
    "TaskTimeoutError",
    "UDFOutputError",
    "UserCodeError",
    "WorkerDiedError",
]
