"""The loop's wake-up pipe: one byte per pending wake, none lost across a drain."""

from __future__ import annotations

import os
import select
import threading

from engine.wakeup import WakeupPipe


def _readable(pipe: WakeupPipe) -> bool:
    return bool(select.select([pipe.fileno], [], [], 0)[0])


def _pipe_bytes(pipe: WakeupPipe) -> int:
    try:
        return len(os.read(pipe.fileno, 4096))
    except BlockingIOError:
        return 0


def test_wakes_before_a_drain_write_one_byte():
    pipe = WakeupPipe()
    try:
        for _ in range(1000):
            pipe.wake()
        assert _pipe_bytes(pipe) == 1
    finally:
        pipe.close()


def test_a_wake_after_a_drain_wakes_the_loop_again():
    pipe = WakeupPipe()
    try:
        pipe.wake()
        assert _readable(pipe)
        pipe.drain()
        assert not _readable(pipe)
        pipe.wake()
        assert _readable(pipe)
    finally:
        pipe.close()


def test_no_command_is_left_unseen_by_racing_wakers():
    """Threads queue a command and wake; the loop drains, then takes every queued command:
    every command is taken, and the loop never waits with one queued and no wake pending."""
    pipe = WakeupPipe()
    commands: list[int] = []
    taken = 0
    total = 4 * 2000

    def waker() -> None:
        for i in range(2000):
            commands.append(i)
            pipe.wake()

    threads = [threading.Thread(target=waker) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        while taken < total:
            ready = select.select([pipe.fileno], [], [], 5.0)[0]
            assert ready, f"a command was queued with no wake pending ({taken} of {total} taken)"
            pipe.drain()
            while commands:
                commands.pop()
                taken += 1
    finally:
        for t in threads:
            t.join()
        pipe.close()


def test_a_wake_after_close_is_a_no_op():
    pipe = WakeupPipe()
    pipe.close()
    pipe.wake()
