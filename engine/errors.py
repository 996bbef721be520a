"""Exceptions the engine raises, and how a UDF's exception keeps its identity across processes.

``UserCodeError`` wraps an exception raised by user code on a worker. The instance the caller
sees is also an instance of the original exception's class (``except ValueError`` works), names
the UDF, and carries the worker's traceback with engine frames trimmed. Failures that are our
fault are ``EngineError`` and say it is a bug.
"""

from __future__ import annotations

from typing import Any


class DataflowError(Exception):
    """Base class of every error dataflow raises on its own account."""


class UserCodeError(DataflowError):
    """A user function (UDF, class constructor, read task) raised; see ``__cause__``."""

    udf_name: str = "<unknown>"
    remote_traceback: str = ""

    def __str__(self) -> str:
        return self.args[0] if self.args else "user code failed"


class WorkerDiedError(DataflowError):
    """A worker process died while running a task, more times than allowed."""


class TaskTimeoutError(DataflowError, TimeoutError):
    """A task ran longer than ``task_timeout_s``; its worker was killed (a hung UDF)."""


class ObjectStoreFullError(DataflowError):
    """The object store and the spill folder are both out of space."""


class ResourceError(DataflowError, ValueError):
    """A task asks for resources no node can ever provide."""


class ColumnNotFoundError(DataflowError, KeyError, ValueError):
    """A step names a column the data does not have. Ray raises ``ValueError`` where a lookup
    would raise ``KeyError``: both ``except`` clauses catch this one."""

    def __str__(self) -> str:  # the message as written (KeyError's own quotes it)
        return str(self.args[0]) if self.args else ""


class UDFOutputError(DataflowError, TypeError, ValueError):
    """A UDF returned what cannot be a row or a batch (``map`` returning a list, ``map_batches``
    returning None). Ray raises ``ValueError``; the wrong type is a ``TypeError``: both
    ``except`` clauses catch this one."""


class SplitCoordinatorLostError(DataflowError):
    """A ``streaming_split`` iterator in another process lost its coordinator: the driver
    process that called ``streaming_split`` (which hosts the coordinator) died, shut down, or
    stopped answering for longer than the liveness window."""


class EngineError(DataflowError):
    """An internal failure: this is a bug in dataflow, please report it."""


_subclass_cache: dict[type, type] = {}


def _user_error_class(original: type[BaseException]) -> type[UserCodeError]:
    """A class that is both ``UserCodeError`` and ``original`` (cached), or UserCodeError."""
    if issubclass(original, UserCodeError) or not issubclass(original, Exception):
        return UserCodeError
    cls = _subclass_cache.get(original)
    if cls is None:
        try:
            cls = type(original.__name__, (UserCodeError, original), {"__str__": UserCodeError.__str__})
            cls.__module__ = original.__module__
            cls.__qualname__ = f"UserCodeError[{original.__qualname__}]"
        except TypeError:  # a class that refuses to be subclassed or combined
            cls = UserCodeError
        _subclass_cache[original] = cls
    return cls


def safe_str(err: BaseException) -> str:
    """``str(err)``, or a placeholder when the exception's own ``__str__`` raises (a message
    format that wants other arguments): reporting an error must not raise another."""
    try:
        return str(err)
    except Exception as inner:  # (whatever the user's __str__ raises)
        return f"<{type(err).__name__}.__str__ raised {type(inner).__name__}: {inner}>"


def make_user_error(
    udf_name: str,
    cause: BaseException | None,
    cause_type: str,
    remote_traceback: str,
    context: str = "",
    cause_text: str = "",
) -> UserCodeError:
    """Build the exception the caller sees for a failed UDF.

    ``cause`` is the unpickled original exception when it could cross the process boundary; the
    result is then an instance of its class too. ``cause_type`` and ``remote_traceback`` are
    always available as text, and ``cause_text`` the exception's message as the worker wrote it.
    """
    where = f" {context}" if context else ""
    message = (
        f"{cause_type} in {udf_name}{where}: {safe_str(cause) if cause is not None else cause_text}\n\n"
        f"Traceback from the worker (engine frames removed):\n{remote_traceback.rstrip()}"
    )
    if cause is not None and not isinstance(cause, Exception):
        # KeyboardInterrupt, SystemExit: the caller gets the exception itself (``except
        # KeyboardInterrupt`` must work); the UDF and the worker's traceback ride in a note
        cause.add_note(message)
        return cause  # type: ignore[return-value]
    cls = _user_error_class(type(cause)) if cause is not None else UserCodeError
    try:
        err: Any = cls.__new__(cls, message)
        err.args = (message,)
    except Exception:  # a class whose constructor wants other arguments (ExceptionGroup...)
        if cause is None:
            raise
        cause.add_note(message)
        return cause  # type: ignore[return-value]
    if cause is not None:  # its attributes (errno, an HTTP status, a code) on the error caught
        attrs = {attr: getattr(cause, attr) for attr in ("errno", "strerror", "filename", "code") if hasattr(cause, attr)}
        attrs.update(getattr(cause, "__dict__", {}))
        for attr, value in attrs.items():
            if attr in ("udf_name", "remote_traceback") or attr.startswith("__"):
                continue
            try:
                setattr(err, attr, value)
            except (AttributeError, TypeError):
                pass
    err.udf_name = udf_name
    err.remote_traceback = remote_traceback
    err.__cause__ = cause
    return err  # type: ignore[no-any-return]


def unpicklable_error(op_name: str, what: str, err: Exception) -> UserCodeError:
    """The error for a UDF or task input that cannot be pickled to reach a worker."""
    import traceback

    context = f"(pickling {what} of {op_name} to send it to a worker process; define it at module level or make it picklable)"
    return make_user_error(op_name, err, type(err).__name__, "".join(traceback.format_exception_only(err)), context)
