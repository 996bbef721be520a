"""What a task takes from the DataContext: which errors ``retried_map_errors`` runs again, Ray's
backoff, and the configs its reads see on threads (no processes)."""

from __future__ import annotations

import pytest

from dataflow import DataContext
from engine.task import ErrorRetries, TaskError


def _error(exc_type: str, message: str, user_code: bool = True) -> TaskError:
    return TaskError("f", exc_type, message, "", None, user_code)


def test_patterns_match_the_type_or_the_message_as_substring_or_regex():
    retries = ErrorRetries(("RateLimitError", r"\b5\d\d\b", "[unclosed"), 2)
    assert retries.matches(_error("RateLimitError", "slow down"))
    assert retries.matches(_error("HTTPError", "server said 503"))
    assert not retries.matches(_error("HTTPError", "server said 5030"))
    assert retries.matches(_error("ValueError", "bad [unclosed bracket"))  # as a substring
    assert not retries.matches(_error("ValueError", "nothing here"))  # (an invalid regex matches nothing else)
    assert not retries.matches(_error("RateLimitError", "slow down", user_code=False))  # the engine's own
    assert ErrorRetries(None, 1).matches(_error("KeyError", "'x'"))


def test_backoff_is_rays_bounded_and_random():
    retries = ErrorRetries(None, 10)
    waits = [retries.backoff_s(attempt) for attempt in (1, 2, 3, 9) for _ in range(50)]
    assert all(w >= 0 for w in waits) and max(waits) <= ErrorRetries.MAX_BACKOFF_S
    assert max(retries.backoff_s(1) for _ in range(50)) <= 2.0
    assert len({round(w, 6) for w in waits}) > 100


@pytest.mark.parametrize(("errors", "count", "expected"), [
    (False, 3, None), (True, 0, None), ([], 3, None),
    (True, 2, ErrorRetries(None, 2)), (["429"], 1, ErrorRetries(("429",), 1)),
])
def test_the_context_settings_as_the_engine_takes_them(errors, count, expected):
    ctx = DataContext()
    ctx.retried_map_errors, ctx.max_map_retries = errors, count
    assert ctx.map_error_retries() == expected


def test_reads_on_threads_see_the_tasks_configs():
    """A task that reads several files at once (``ReadAll`` on threads) gives its read tasks
    the execution's ``DataContext`` configs too, as a read on the task's own thread gets."""
    import pyarrow as pa

    from engine.task import ReadAll, configs_of, task_configs
    from engine.transform import TaskTransform

    class Transform(TaskTransform):
        configs = {"k": 7}

    class Read:
        def __call__(self):
            yield pa.table({"k": [(task_configs() or {}).get("k")]})

    with configs_of(Transform()):
        for threads in (1, 2):
            tables = list(ReadAll([Read(), Read(), Read()], threads=threads)())
            assert [t["k"][0].as_py() for t in tables] == [7, 7, 7]
    assert task_configs() is None


def test_reads_on_threads_keep_their_threads_between_tasks():
    """``ReadAll``'s threads outlive the task: a 20 ms small sort spent about 1 ms starting a
    pool for each task. A wider task gets a wider pool; a failed read still names its files and
    leaves the pool serving the next task."""
    import threading

    import pyarrow as pa

    from engine.task import ReadAll
    from engine.transform import UDFFailure

    class Read:
        metadata = None

        def __init__(self, fail: bool = False, together: threading.Barrier | None = None) -> None:
            self.fail, self.together = fail, together

        def __call__(self):
            if self.fail:
                raise OSError("disk gone")
            if self.together is not None:  # two at once: the pool starts both its threads
                self.together.wait(timeout=10)
            yield pa.table({"tid": [threading.get_native_id()]})

    def threads_of(tables):
        return {t["tid"][0].as_py() for t in tables}

    pair = threading.Barrier(2)
    first = threads_of(ReadAll([Read(together=pair) for _ in range(6)], threads=2)())
    assert len(first) == 2
    second = threads_of(ReadAll([Read() for _ in range(6)], threads=2)())
    assert threading.get_native_id() not in first | second
    assert second <= first  # the same threads, not new ones

    with pytest.raises(UDFFailure, match="disk gone"):
        list(ReadAll([Read(), Read(fail=True), Read()], threads=2)())
    wider = threads_of(ReadAll([Read() for _ in range(9)], threads=3)())
    assert 1 <= len(wider) <= 3
    assert len(list(ReadAll([Read(), Read()], threads=2)())) == 2  # a narrower task: the wider pool serves it


def test_reads_on_threads_work_in_a_process_forked_after_them():
    """A process forked after ``ReadAll`` made its pool (a DataLoader worker of a local-mode
    job) reads on threads of its own: the inherited pool has none there and would never run."""
    import os

    import pyarrow as pa

    from engine.task import ReadAll

    class Read:
        metadata = None

        def __call__(self):
            yield pa.table({"pid": [os.getpid()]})

    assert len(list(ReadAll([Read(), Read()], threads=2)())) == 2  # the parent's pool exists now
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # the child: read on threads, report, and leave at once (no pytest teardown here)
        code = 1
        try:
            import threading

            done = threading.Event()
            pids: list[int] = []

            def read() -> None:
                pids.extend(t["pid"][0].as_py() for t in ReadAll([Read(), Read(), Read()], threads=2)())
                done.set()

            threading.Thread(target=read, daemon=True).start()
            code = 0 if done.wait(10) and pids == [os.getpid()] * 3 else 2
        finally:
            os.write(write_end, bytes([code]))
            os._exit(0)
    os.close(write_end)
    try:
        got = os.read(read_end, 1)
    finally:
        os.close(read_end)
        os.waitpid(child, 0)
    assert got == bytes([0]), "the forked child's reads did not finish (2) or failed (1)"
