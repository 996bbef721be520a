"""retry: classification, backoff bounds, exactly-once resumption, and the AIMD limiter."""

from __future__ import annotations

import errno
import http.client
import pickle
import random

import pytest

from connectors import io_stats
from connectors.errors import AccessDeniedError, FileFormatError, PathNotFoundError, RetriesExhaustedError
from connectors.retry import LIMITER, AimdLimiter, ErrorKind, Retrier, RetryPolicy, classify, limiter_for


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (OSError(errno.EBUSY, "SlowDown"), ErrorKind.THROTTLED),
        (OSError("AWS Error SLOW_DOWN during GetObject operation"), ErrorKind.THROTTLED),
        (OSError("AWS Error UNKNOWN (HTTP status 503) during HeadObject operation"), ErrorKind.THROTTLED),
        (RuntimeError("Please reduce your request rate."), ErrorKind.THROTTLED),
        (TimeoutError("read timed out"), ErrorKind.TRANSIENT),
        (ConnectionResetError(104, "Connection reset by peer"), ErrorKind.TRANSIENT),
        (http.client.IncompleteRead(b"abc", 10), ErrorKind.TRANSIENT),
        (FileNotFoundError("NoSuchBucket"), ErrorKind.PERMANENT),
        (PermissionError("AccessDenied"), ErrorKind.PERMANENT),
        (ValueError("Parquet magic bytes not found in footer"), ErrorKind.PERMANENT),
        (KeyError("x"), ErrorKind.PERMANENT),
    ],
)
def test_classify(exc: BaseException, kind: ErrorKind) -> None:
    assert classify(exc) is kind


def test_classify_follows_the_cause_chain() -> None:
    try:
        try:
            raise ConnectionResetError("reset")
        except ConnectionResetError as inner:
            raise RuntimeError("wrapped") from inner
    except RuntimeError as outer:
        assert classify(outer) is ErrorKind.TRANSIENT


def test_backoff_is_full_jitter_and_capped() -> None:
    policy = RetryPolicy(base_delay_s=0.1, max_delay_s=1.0)
    rng = random.Random(0)
    for attempt in range(1, 12):
        cap = min(1.0, 0.1 * 2 ** (attempt - 1))
        delays = [policy.delay(attempt, rng) for _ in range(50)]
        assert all(0 <= d <= cap for d in delays)
        assert max(delays) > cap / 2  # spread over the whole range, not a fixed step


def _replaying(*outcomes: object):
    """A call that raises or returns ``outcomes`` one after the other."""
    calls = iter(outcomes)

    def call() -> object:
        item = next(calls)
        if isinstance(item, Exception):
            raise item
        return item

    return call


def _retrier(attempts: int = 5) -> tuple[Retrier, list[float]]:
    sleeps: list[float] = []
    retrier = Retrier(
        RetryPolicy(max_attempts=attempts, base_delay_s=0.1, max_delay_s=1.0),
        limiter=AimdLimiter(max_limit=8),
        sleep=sleeps.append,
        rng=random.Random(1),
    )
    return retrier, sleeps


def test_transient_errors_are_retried_then_succeed() -> None:
    retrier, sleeps = _retrier()
    flaky = _replaying(ConnectionResetError("reset"), TimeoutError("slow"), "ok")

    before = io_stats.snapshot()["retries"]
    assert retrier.call(flaky, path="s3://b/k") == "ok"
    assert len(sleeps) == 2
    assert io_stats.snapshot()["retries"] - before == 2


def test_permanent_errors_fail_at_once_naming_the_path() -> None:
    retrier, sleeps = _retrier()

    def missing() -> None:
        raise FileNotFoundError("The specified bucket does not exist")

    with pytest.raises(PathNotFoundError, match=r"s3://nope/k") as info:
        retrier.call(missing, path="s3://nope/k")
    assert sleeps == []
    assert isinstance(info.value, FileNotFoundError)

    def denied() -> None:
        raise PermissionError("Access Denied")

    with pytest.raises(AccessDeniedError, match=r"s3://b/secret"):
        retrier.call(denied, path="s3://b/secret")
    assert sleeps == []


def test_gives_up_after_max_attempts_naming_the_path() -> None:
    retrier, sleeps = _retrier(attempts=3)

    def always() -> None:
        raise TimeoutError("timed out")

    with pytest.raises(RetriesExhaustedError, match=r"s3://b/k.*3 attempts") as info:
        retrier.call(always, path="s3://b/k")
    assert len(sleeps) == 2
    assert isinstance(info.value, OSError)
    again = pickle.loads(pickle.dumps(info.value))
    assert again.path == "s3://b/k" and str(again) == str(info.value)


def test_iterate_resumes_without_duplicates() -> None:
    retrier, sleeps = _retrier()
    opens = 0

    def stream():  # fails after item 2 on the first open, after item 4 on the second
        nonlocal opens
        opens += 1
        fail_at = {1: 2, 2: 4}.get(opens)
        for i in range(6):
            if i == fail_at:
                raise ConnectionResetError("cut")
            yield i

    assert list(retrier.iterate(stream, path="f")) == [0, 1, 2, 3, 4, 5]
    assert opens == 3
    assert len(sleeps) == 2


def test_iterate_counts_only_failures_without_progress() -> None:
    retrier, _ = _retrier(attempts=2)
    opens = 0

    def stream():  # every open gets one item further, then fails: progress each time
        nonlocal opens
        opens += 1
        for i in range(4):
            if i == opens:
                raise TimeoutError("slow")
            yield i

    assert list(retrier.iterate(stream, path="f")) == [0, 1, 2, 3]


def test_format_errors_are_not_retried() -> None:
    retrier, sleeps = _retrier()

    def bad():
        raise FileFormatError("garbage", path="f")
        yield  # pragma: no cover

    with pytest.raises(FileFormatError):
        list(retrier.iterate(bad, path="f"))
    assert sleeps == []


def test_aimd_halves_on_throttle_and_grows_back() -> None:
    now = [0.0]
    limiter = AimdLimiter(max_limit=16, cooldown_s=1.0, clock=lambda: now[0])
    limiter.on_throttle()
    limiter.on_throttle()  # same burst: counted once
    assert limiter.limit == 8
    now[0] = 2.0
    limiter.on_throttle()
    assert limiter.limit == 4
    for _ in range(4):
        limiter.on_success()
    assert 4.9 < limiter.limit < 5.1  # about one slot per `limit` successes
    for _ in range(1000):
        limiter.on_success()
    assert limiter.limit == 16
    assert limiter.statistics()["throttle_events"] == 2


def test_throttling_lowers_the_limit_through_the_retrier() -> None:
    limiter = AimdLimiter(max_limit=32, cooldown_s=0.0)
    retrier = Retrier(RetryPolicy(max_attempts=5), limiter=limiter, sleep=lambda s: None)
    throttled = _replaying(*[OSError(errno.EBUSY, "SlowDown")] * 3, "ok")

    assert retrier.call(throttled, path="k") == "ok"
    assert limiter.limit < 5
    assert limiter.in_flight == 0


def test_local_files_are_read_without_the_limiter_and_still_retried() -> None:
    """Local files never throttle: their retrier holds no request slots (each costs a lock
    round trip per file and row group), and transient and throttled errors are still retried
    and reopened where the stream left off."""
    import fsspec.implementations.local
    import pyarrow.fs as pafs

    assert limiter_for(pafs.LocalFileSystem()) is None
    assert limiter_for(pafs.PyFileSystem(pafs.FSSpecHandler(fsspec.implementations.local.LocalFileSystem()))) is LIMITER
    sleeps: list[float] = []
    retrier = Retrier(RetryPolicy(max_attempts=5, base_delay_s=0.01), limiter=None, sleep=sleeps.append)
    flaky = _replaying(OSError(errno.EBUSY, "SlowDown"), ConnectionResetError("reset"), "ok")

    assert retrier.call(flaky, path="/data/a") == "ok"
    assert len(sleeps) == 2
    opened = []

    def stream():
        opened.append(1)
        yield 1
        if len(opened) == 1:
            raise TimeoutError("slow disk")
        yield 2

    assert list(retrier.iterate(stream, path="/data/b")) == [1, 2]
    assert len(opened) == 2


def test_retried_io_errors_from_the_data_context(tmp_path) -> None:
    """Ray's ``DataContext.retried_io_errors``: a message added there makes an error that is
    otherwise permanent a retried one, for the reads of datasets made after it is set."""
    import fsspec.implementations.local
    import pyarrow as pa
    import pyarrow.parquet as pq

    import dataflow
    from connectors.retry import default_retry_policy

    pq.write_table(pa.table({"id": list(range(10))}), tmp_path / "a.parquet")

    class Glitchy(fsspec.implementations.local.LocalFileSystem):
        failures = 0

        def _open(self, path, mode="rb", **kwargs):
            if Glitchy.failures < 2:
                Glitchy.failures += 1
                raise RuntimeError("backend said: GLITCH-42, try again")
            return super()._open(path, mode=mode, **kwargs)

    ctx = dataflow.DataContext.get_current()
    assert "AWS Error SLOW_DOWN" in ctx.retried_io_errors  # Ray's defaults are there
    saved = list(ctx.retried_io_errors)
    with dataflow.options(execution_mode="local"):
        fs = Glitchy(skip_instance_cache=True)
        with pytest.raises(Exception, match="GLITCH-42"):  # not retried: permanent by default
            dataflow.read_parquet(str(tmp_path), filesystem=fs).take_all()
        Glitchy.failures = 0
        try:
            ctx.retried_io_errors.append("GLITCH-42")
            assert "GLITCH-42" in default_retry_policy().retried_messages
            assert sorted(r["id"] for r in dataflow.read_parquet(str(tmp_path), filesystem=fs).take_all()) == list(range(10))
            assert Glitchy.failures == 2  # failed twice, retried, then read
        finally:
            ctx.retried_io_errors[:] = saved
    assert "GLITCH-42" not in default_retry_policy().retried_messages
    with pytest.raises(AttributeError, match="no setting"):
        ctx.retried_io_error = ["typo"]  # a misspelt setting is refused, not kept and ignored
