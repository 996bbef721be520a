"""The one module that pickles and unpickles: cloudpickle for code and task specs.

Blocks never pass through here: they travel as Arrow IPC files in the object store.
Only frames from authenticated peers reach ``loads`` (ipc sockets live in a 0700 folder;
tcp sockets use CurveZMQ), see ``transport``.
"""

from __future__ import annotations

import collections
import functools
import hashlib
import io
import pickle
import types
from typing import Any


def dumps(obj: Any) -> bytes:
    """Serialize anything, closures and classes included.

    Code pickled by value (a function or class defined in ``__main__`` or a notebook cell)
    keeps its file name: a traceback from a worker then names the user's file and line, where
    cloudpickle alone writes ``<dynamic-code>``.
    """
    buffer = io.BytesIO()
    _pickler_class()(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buffer.getvalue()


@functools.cache
def _pickler_class() -> type:
    """cloudpickle's pickler, with code objects reduced with their ``co_filename``."""
    import cloudpickle
    from cloudpickle import cloudpickle as internals

    def reduce_code(code: types.CodeType) -> tuple[Any, tuple[Any, ...]]:
        constructor, args = internals._code_reduce(code)
        named = [i for i, arg in enumerate(args[:-1]) if arg == "<dynamic-code>" and args[i + 1] == code.co_name]
        if named:  # cloudpickle's placeholder, followed by co_name as in every CodeType signature
            args = (*args[: named[0]], code.co_filename, *args[named[0] + 1 :])
        return constructor, args

    table = collections.ChainMap({types.CodeType: reduce_code}, cloudpickle.Pickler.dispatch_table)
    return type("FilenameKeepingPickler", (cloudpickle.Pickler,), {"dispatch_table": table})


def dumps_data(obj: Any) -> bytes:
    """Serialize plain data (specs over blocks, results): the C pickler, ~5x faster than
    cloudpickle per task; cloudpickle when something in it needs pickling by value.

    Only for objects whose classes the receiver imports by name (engine types, or, from a
    worker to the driver, anything: the driver has every module its workers have). A spec
    carrying user objects (read tasks, a sink, possibly defined in ``__main__``) uses ``dumps``.
    """
    try:
        return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, AttributeError, TypeError):
        return dumps(obj)


def dumps_for_worker(obj: Any) -> bytes:
    """Serialize a task spec for a worker: the C pickler (a third of cloudpickle's cost) when
    everything in ``obj`` is referenced by a name the worker imports, else ``dumps``.

    The C pickler writes every class and function as a module and a name. It fails on what has
    no such name (a lambda, a local class); a name in ``__main__`` (a script's or a notebook's
    own datasource or sink) pickles but would not resolve in a worker, so any ``__main__`` in
    the output means cloudpickle, which sends those by value. So do modules registered with
    ``cloudpickle.register_pickle_by_value``.
    """
    if _by_value_registry():
        return dumps(obj)
    try:
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # cloudpickle tries again, and raises its own error if it fails too
        return dumps(obj)
    return dumps(obj) if b"__main__" in data else data


@functools.cache
def _by_value_registry() -> set[str] | frozenset[str]:
    """cloudpickle's set of modules registered to go by value (changed in place when one is)."""
    from cloudpickle import cloudpickle as internals

    return getattr(internals, "_PICKLE_BY_VALUE_MODULES", frozenset())


def loads(data: bytes | memoryview) -> Any:
    """Deserialize what ``dumps`` produced."""
    return pickle.loads(data)


def digest(data: bytes) -> str:
    """A short content hash, used to cache UDFs once per worker."""
    return hashlib.blake2b(data, digest_size=12).hexdigest()


def dumps_exception(exc: BaseException, *, by_state: bool = True) -> bytes | None:
    """Pickle an exception if it survives a round trip, else None (its text is sent anyway).

    An exception pickles as ``cls(*args)``, which fails for a class whose constructor takes
    other arguments than its ``args`` (``HTTPError(status, url)`` that passes a message up):
    such an exception goes as its class, ``args`` and attributes instead, rebuilt without
    calling the constructor, so the caller still catches it by its class (with its
    attributes when they pickle). ``by_state=False``: only as itself (for a caller that sends
    the exception object, not these bytes)."""
    candidates = (exc, _ByState(exc, with_attrs=True), _ByState(exc, with_attrs=False)) if by_state else (exc,)
    for candidate in candidates:
        try:
            data = dumps(candidate)
            pickle.loads(data)
        except Exception:  # (anything a user's class does while pickled)
            continue
        return data
    return None


class _ByState:
    """Pickles ``exc`` as its class, ``args`` and (``with_attrs``) ``__dict__``."""

    def __init__(self, exc: BaseException, with_attrs: bool) -> None:
        self.exc, self.with_attrs = exc, with_attrs

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        attrs = dict(getattr(self.exc, "__dict__", {})) if self.with_attrs else {}
        return (_exception_from_state, (type(self.exc), self.exc.args, attrs))


def _exception_from_state(cls: type[BaseException], args: tuple[Any, ...], attrs: dict[str, Any]) -> BaseException:
    err = cls.__new__(cls, *args)
    err.args = args
    err.__dict__.update(attrs)
    return err
