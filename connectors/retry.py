"""Retrying I/O: classify an error, back off with full jitter, and slow down under throttling.

Three kinds of error (``classify``):

* ``THROTTLED``: the store asks us to slow down (S3 ``503 SlowDown``, ``429``, "reduce your
  request rate"). Retried with backoff, and the process-wide ``AimdLimiter`` halves the number of
  requests allowed in flight, then lets it grow back by one per window of successes.
* ``TRANSIENT``: timeouts, connection resets, bodies cut short (``IncompleteRead``), 5xx.
  Retried with backoff.
* ``PERMANENT``: everything else, in particular missing keys or buckets, access denied and no
  credentials at all. Raised at once, with the path in the message (``PathNotFoundError``,
  ``AccessDeniedError``, ``MissingCredentialsError``, which also says how to configure them).

``call_with_retry`` wraps one call; ``iter_with_retry`` wraps a stream of items (row groups,
record batches) and, after a transient failure, reopens the stream and skips what was already
yielded, so a retry never duplicates or drops rows. The clock, the sleep and the random source
are arguments, so tests run without waiting.
"""

from __future__ import annotations

import enum
import errno
import random
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from typing import TypeVar

from connectors import io_stats
from connectors.errors import (
    S3_CREDENTIALS_HELP,
    AccessDeniedError,
    MissingCredentialsError,
    PathNotFoundError,
    RetriesExhaustedError,
)

T = TypeVar("T")


class ErrorKind(enum.Enum):
    """How to react to an I/O error."""

    THROTTLED = "throttled"
    TRANSIENT = "transient"
    PERMANENT = "permanent"


_THROTTLE_MARKERS = (
    "slowdown",
    "slow_down",
    "slow down",
    "reduce your request rate",
    "throttl",
    "toomanyrequests",
    "too many requests",
    "requestlimitexceeded",
    "http status 503",
    "(503)",
    "503 service unavailable",
    "serviceunavailable",
    "service_unavailable",
)
_TRANSIENT_TYPES = (
    "IncompleteRead",
    "ReadTimeoutError",
    "ConnectTimeoutError",
    "ClientPayloadError",
    "ServerDisconnectedError",
    "ResponseStreamingError",
    "EndpointConnectionError",
    "ConnectionClosedError",
    "HTTPClientError",
    "FSTimeoutError",
    "ResponseParserError",
    "ClientOSError",
    "ProtocolError",
)
_CREDENTIALS_TYPES = ("NoCredentialsError", "PartialCredentialsError")
"""botocore's errors for credentials that are missing or incomplete (matched by name: no import)."""
_TRANSIENT_MARKERS = (
    "connection reset",
    "connection aborted",
    "connection was closed",
    "broken pipe",
    "timed out",
    "timeout",
    "incompleteread",
    "incomplete read",
    "response payload is not completed",
    "internalerror",
    "internal server error",
    "http status 500",
    "http status 502",
    "http status 504",
    "network_connection",
    "request_timeout",
    "curlcode",
)


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:
        current = todo.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        for linked in (current.__cause__, current.__context__):
            if linked is not None:
                todo.append(linked)


def classify(exc: BaseException) -> ErrorKind:
    """Whether ``exc`` (or an error it was raised from) is worth retrying, and why."""
    chain = list(_chain(exc))
    if any(type(err).__name__ in _CREDENTIALS_TYPES for err in chain):
        return ErrorKind.PERMANENT  # before the markers: nothing in such a chain is worth a retry
    for err in chain:
        text = f"{type(err).__name__} {err}".lower()
        if any(marker in text for marker in _THROTTLE_MARKERS):
            return ErrorKind.THROTTLED
        if isinstance(err, OSError) and err.errno == errno.EBUSY:
            return ErrorKind.THROTTLED  # s3fs maps 503 SlowDown to EBUSY
    for err in chain:
        if isinstance(err, FileNotFoundError | PermissionError | IsADirectoryError | NotADirectoryError):
            return ErrorKind.PERMANENT
    for err in chain:
        if isinstance(err, TimeoutError | ConnectionError):
            return ErrorKind.TRANSIENT
        if any(type(err).__name__ == name for name in _TRANSIENT_TYPES):
            return ErrorKind.TRANSIENT
        text = str(err).lower()
        if any(marker in text for marker in _TRANSIENT_MARKERS):
            return ErrorKind.TRANSIENT
    return ErrorKind.PERMANENT


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently to retry transient errors (exponential backoff, full jitter).

    ``retried_messages``: an error whose message (or that of an error it was raised from)
    contains one of these is retried too, whatever ``classify`` says (Ray's
    ``DataContext.retried_io_errors`` and ``write_file_retry_on_errors``).
    """

    max_attempts: int = 10
    base_delay_s: float = 0.1
    max_delay_s: float = 10.0
    retried_messages: tuple[str, ...] = ()

    def kind(self, exc: BaseException, classified: ErrorKind) -> ErrorKind:
        """``classified``, or TRANSIENT for a permanent-looking error one of ``retried_messages`` names."""
        if classified is ErrorKind.PERMANENT and self.retried_messages:
            for err in _chain(exc):
                text = str(err)
                if any(message in text for message in self.retried_messages):
                    return ErrorKind.TRANSIENT
        return classified

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Seconds to wait before retry number ``attempt`` (1-based): uniform in [0, cap]."""
        cap = min(self.max_delay_s, self.base_delay_s * (2 ** (attempt - 1)))
        return (rng or random).uniform(0.0, cap)


_default_policy = RetryPolicy()


_retried_messages: Callable[[], tuple[str, ...]] = tuple
"""Where ``default_retry_policy`` finds the messages users ask to retry (set by ``dataflow.context``:
the current ``DataContext``'s lists)."""


def set_retried_messages_source(source: Callable[[], tuple[str, ...]]) -> None:
    """Have ``default_retry_policy`` take ``retried_messages`` from ``source()``."""
    global _retried_messages
    _retried_messages = source


def default_retry_policy() -> RetryPolicy:
    """The policy sources and sinks capture when they are constructed (on the driver), with the
    messages to retry that are in force then."""
    messages = tuple(_retried_messages())
    if messages == _default_policy.retried_messages:
        return _default_policy
    return replace(_default_policy, retried_messages=messages)


def set_default_retry_policy(policy: RetryPolicy) -> RetryPolicy:
    """Replace the default policy; returns the previous one so callers can restore it."""
    global _default_policy
    previous, _default_policy = _default_policy, policy
    return previous


@dataclass
class AimdLimiter:
    """A process-wide cap on concurrent storage requests: additive increase, multiplicative decrease.

    ``slot()`` waits until fewer than ``limit`` requests are in flight. ``on_throttle`` halves the
    limit (at most once per ``cooldown_s``, so one burst of 503s counts once); ``on_success`` adds
    ``1/limit``, i.e. about one more slot per ``limit`` successful requests.
    """

    max_limit: int = 64
    min_limit: int = 1
    cooldown_s: float = 0.2
    clock: Callable[[], float] = time.monotonic
    limit: float = field(init=False)
    in_flight: int = field(init=False, default=0)
    peak_in_flight: int = field(init=False, default=0)
    throttle_events: int = field(init=False, default=0)
    _last_cut: float = field(init=False, default=float("-inf"))
    _cond: threading.Condition = field(init=False, default_factory=threading.Condition)

    def __post_init__(self) -> None:
        self.limit = float(self.max_limit)

    @contextmanager
    def slot(self) -> Iterator[None]:
        """Hold one request slot for the duration of the block."""
        with self._cond:
            while self.in_flight >= max(self.min_limit, int(self.limit)):
                self._cond.wait()
            self.in_flight += 1
            self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            yield
        finally:
            with self._cond:
                self.in_flight -= 1
                self._cond.notify()

    def on_success(self) -> None:
        """A request succeeded: grow the limit a little."""
        with self._cond:
            if self.limit < self.max_limit:
                self.limit = min(float(self.max_limit), self.limit + 1.0 / self.limit)
                self._cond.notify()

    def on_throttle(self) -> None:
        """The store asked us to slow down: halve the limit (once per cooldown)."""
        with self._cond:
            now = self.clock()
            if now - self._last_cut >= self.cooldown_s:
                self._last_cut = now
                self.limit = max(float(self.min_limit), self.limit / 2)
                self.throttle_events += 1

    def statistics(self) -> dict[str, float]:
        """Current limit, requests in flight, their peak, and how many cuts happened."""
        with self._cond:
            return {
                "limit": self.limit,
                "in_flight": self.in_flight,
                "peak_in_flight": self.peak_in_flight,
                "throttle_events": self.throttle_events,
            }


LIMITER = AimdLimiter()
"""The limiter shared by every connector in this process."""

_NO_SLOT = nullcontext()


def limiter_for(filesystem: object) -> AimdLimiter | None:
    """The process limiter for a store that can throttle; None for local files, which never
    answer "slow down" (and whose reads are one per task thread): their three slots per file
    cost ~12 us of a 1,000-row Parquet file's ~300."""
    import pyarrow.fs as pafs

    return None if isinstance(filesystem, pafs.LocalFileSystem) else LIMITER


def _missing_credentials(exc: BaseException) -> BaseException | None:
    """The error in ``exc``'s chain saying that there are no (or partial) credentials, if any."""
    for err in _chain(exc):
        if type(err).__name__ in _CREDENTIALS_TYPES:
            return err
    return None


def permanent_error(exc: BaseException, path: str, action: str) -> BaseException:
    """``exc`` restated so that its message names ``path``; same builtin family as before."""
    if isinstance(exc, PathNotFoundError | AccessDeniedError):
        return exc
    credentials = _missing_credentials(exc)
    if credentials is not None:
        msg = (
            f"no credentials to sign S3 requests with while trying to {action} "
            f"({type(credentials).__name__}: {credentials}); {S3_CREDENTIALS_HELP}"
        )
        return MissingCredentialsError(msg, path=path)
    if isinstance(exc, FileNotFoundError):
        return PathNotFoundError(f"not found while trying to {action} ({exc})", path=path)
    if isinstance(exc, PermissionError):
        return AccessDeniedError(f"access denied while trying to {action} ({exc})", path=path)
    return exc


@dataclass
class Retrier:
    """Runs storage calls under a ``RetryPolicy`` and the process ``AimdLimiter`` (``limiter``
    None: no cap on requests in flight, for local files)."""

    policy: RetryPolicy = field(default_factory=default_retry_policy)
    limiter: AimdLimiter | None = field(default_factory=lambda: LIMITER)
    sleep: Callable[[float], None] = time.sleep
    rng: random.Random | None = None
    classify: Callable[[BaseException], ErrorKind] = classify

    def call(self, fn: Callable[[], T], *, path: str, action: str = "read") -> T:
        """``fn()``, retried on transient errors; permanent ones raised at once naming ``path``."""
        attempt = 0
        while True:
            attempt += 1
            try:
                with self._slot():
                    result = fn()
            except Exception as exc:  # classified right below
                self._after_failure(exc, attempt, path, action)
                continue
            self._on_success()
            return result

    def iterate(self, open_stream: Callable[[], Iterator[T]], *, path: str, action: str = "read") -> Iterator[T]:
        """Items of ``open_stream()``; after a transient error, reopen and skip those already yielded.

        The stream must be deterministic (the same items in the same order on every open), as a
        file's row groups or a parser's batches are.
        """
        done = 0
        failures = 0
        while True:
            position = 0
            stream: Iterator[T] | None = None
            try:
                with self._slot():
                    stream = open_stream()
                while True:
                    with self._slot():
                        item = next(stream, _END)
                    if item is _END:
                        self._on_success()
                        return
                    position += 1
                    if position > done:
                        done = position
                        failures = 0
                        self._on_success()
                        yield item  # type: ignore[misc]
            except Exception as exc:  # classified right below
                failures += 1
                self._after_failure(exc, failures, path, action)
            finally:
                close = getattr(stream, "close", None)
                if close is not None:
                    close()

    def _slot(self) -> AbstractContextManager[None]:
        return _NO_SLOT if self.limiter is None else self.limiter.slot()

    def _on_success(self) -> None:
        if self.limiter is not None:
            self.limiter.on_success()

    def _after_failure(self, exc: Exception, attempt: int, path: str, action: str) -> None:
        kind = self.policy.kind(exc, self.classify(exc))
        if kind is ErrorKind.PERMANENT:
            raise permanent_error(exc, path, action) from exc
        if kind is ErrorKind.THROTTLED:
            if self.limiter is not None:
                self.limiter.on_throttle()
            io_stats.record(throttled=1)
        if attempt >= self.policy.max_attempts:
            msg = (
                f"gave up trying to {action} after {attempt} attempts; last error "
                f"({kind.value}): {type(exc).__name__}: {exc}"
            )
            raise RetriesExhaustedError(msg, path=path) from exc
        io_stats.record(retries=1)
        self.sleep(self.policy.delay(attempt, self.rng))


_END = object()


def call_with_retry(fn: Callable[[], T], *, path: str, action: str = "read", policy: RetryPolicy | None = None) -> T:
    """Shorthand for ``Retrier(policy).call(fn, path=path)`` with the process limiter."""
    return Retrier(policy or default_retry_policy()).call(fn, path=path, action=action)
