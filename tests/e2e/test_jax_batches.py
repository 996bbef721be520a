"""iter_jax_batches: its cases on both execution modes (in a child process, see below), the
sharding over several devices, the hosts' synchronization with real JAX processes on the CPU, and
``import dataflow`` without jax.

JAX starts threads once it makes its first array, and from then on warns at every ``os.fork()``
(a child forked while one of them holds a lock can deadlock); later tests of the suite fork this
process (DataLoader workers, forked sessions). So no test here makes an array in this process:
the cases on both modes (``jax_batches_cases.py``) run in one child pytest process, the device
and host tests in scripts of their own.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pytest

jax = pytest.importorskip("jax")  # importing jax starts no thread; making an array would

from dataflow.jax_batches import synchronized  # noqa: E402 (after the skip: it imports jax)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CASES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "jax_batches_cases.py")


def test_the_cases_on_both_modes_pass_in_a_child_process():
    done = subprocess.run([sys.executable, "-m", "pytest", CASES, "-q", "-p", "no:cacheprovider"],
                          capture_output=True, text=True, timeout=110, cwd=ROOT)
    assert done.returncode == 0, (done.stdout + done.stderr)[-12000:]
    assert " passed" in done.stdout and " failed" not in done.stdout


# ----- import, several devices, several hosts ----------------------------------------------


def test_import_dataflow_does_not_import_jax_and_missing_jax_says_which_extra():
    code = (
        "import sys, dataflow\n"
        "dataflow.range(3).take_all()\n"
        "assert 'jax' not in sys.modules\n"
        "sys.modules['jax'] = None\n"
        "try:\n"
        "    dataflow.range(4).iter_jax_batches(batch_size=2)\n"
        "except ImportError as err:\n"
        "    assert \"pip install 'dataflow[jax]'\" in str(err), err\n"
        "else:\n"
        "    raise AssertionError('no ImportError')\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120, cwd=ROOT)


def run_script(code: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, env={**os.environ, **(env or {})})
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_batches_are_sharded_over_every_local_device():
    out = run_script("""
        import numpy as np, jax, dataflow
        dataflow.DataContext.get_current().execution_mode = "local"
        assert jax.local_device_count() == 2
        ds = dataflow.range(11)
        batches = list(ds.iter_jax_batches(batch_size=4, paddings=-1))
        assert [len(b["id"]) for b in batches] == [4, 4, 4]
        for b in batches:
            arr = b["id"]
            assert arr.sharding.num_devices == 2 and len(arr.addressable_shards) == 2
            assert {s.device for s in arr.addressable_shards} == set(jax.devices())
            halves = [np.asarray(s.data).tolist() for s in sorted(arr.addressable_shards, key=lambda s: s.index[0].start)]
            assert halves[0] + halves[1] == np.asarray(arr).tolist() and len(halves[0]) == 2, halves
        assert np.asarray(batches[-1]["id"]).tolist() == [8, 9, 10, -1]
        assert [len(b["id"]) for b in ds.iter_jax_batches(batch_size=4, drop_last=True)] == [4, 4]
        for bad in (3, 5):
            try:
                ds.iter_jax_batches(batch_size=bad)
            except ValueError as err:
                assert "evenly divisible by the number of local JAX devices (2)" in str(err), err
            else:
                raise AssertionError("no error")
        try:  # the short last batch (3 rows) cannot be split over 2 devices
            list(ds.iter_jax_batches(batch_size=4))
        except ValueError as err:
            assert "The local batch size (3) must be evenly divisible" in str(err), err
        else:
            raise AssertionError("no error")
        print("ok")
    """, env={"XLA_FLAGS": "--xla_force_host_platform_device_count=2"})
    assert out.strip().endswith("ok")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


HOST = """
import sys, numpy as np, jax
jax.config.update("jax_cpu_collectives_implementation", "gloo")
rank, port, rows, options = int(sys.argv[1]), sys.argv[2], int(sys.argv[3 + int(sys.argv[1])]), eval(sys.argv[5])
jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=rank,
                           initialization_timeout=60)
import dataflow
dataflow.DataContext.get_current().execution_mode = "local"
try:
    for b in dataflow.range(rows).iter_jax_batches(batch_size=4, synchronize_batches=True, **options):
        assert b["id"].shape == (8,), b["id"].shape  # 4 rows from each host
        print("batch", np.asarray(b["id"].addressable_shards[0].data).tolist(), flush=True)
except ValueError as err:
    print("error", err, flush=True)
jax.distributed.shutdown()
"""


def run_hosts(rows: tuple[int, int], **options) -> list[list[str]]:
    """Two JAX processes on this machine (CPU, gloo collectives), each iterating range(rows[rank])."""
    port = str(_free_port())
    procs = [subprocess.Popen([sys.executable, "-c", HOST, str(rank), port, str(rows[0]), str(rows[1]), repr(options)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
             for rank in (0, 1)]
    try:
        outs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
    return [[line for line in out.splitlines() if line.startswith(("batch", "error"))] for out, _ in outs]


def test_synchronized_hosts_with_uneven_shards():
    # host 0 has 10 rows (3 batches), host 1 has 14 (4 batches)
    padded = run_hosts((10, 14), paddings=-1)
    assert padded[0] == ["batch [0, 1, 2, 3]", "batch [4, 5, 6, 7]", "batch [8, 9, -1, -1]", "batch [-1, -1, -1, -1]"]
    assert padded[1] == ["batch [0, 1, 2, 3]", "batch [4, 5, 6, 7]", "batch [8, 9, 10, 11]", "batch [12, 13, -1, -1]"]
    dropped = run_hosts((10, 14), drop_last=True)  # both stop where the first runs out
    assert dropped[0] == dropped[1] == ["batch [0, 1, 2, 3]", "batch [4, 5, 6, 7]"]
    failed = run_hosts((10, 14))  # sizes 2 and 4 in the third round: both hosts fail, neither hangs
    for lines in failed:
        assert lines[:2] == ["batch [0, 1, 2, 3]", "batch [4, 5, 6, 7]"]
        assert lines[2].startswith("error Uneven batch sizes detected across JAX workers. Host batch sizes range from 2 to 4")


# ----- the synchronization rules, with a simulated second host -----------------------------


def fake_hosts(*others):
    """An allgather for this host and others whose windows are given as (has, rows) lists per round."""
    rounds = [iter(o) for o in others]

    def allgather(infos):
        rows = [infos]
        for r in rounds:
            window = next(r, [])
            other = np.zeros_like(infos).reshape(-1, 2)
            if window:
                other[: len(window)] = window
            rows.append(other.reshape(-1))
        return np.stack(rows)

    return allgather


def local(*sizes):
    return iter([({"x": np.arange(n)}, n) for n in sizes])


def test_synchronized_rules():
    def sync(batches, allgather, **kw):
        options = {"lookahead": 2, "drop_last": False, "batch_size": 4, "paddings": None, "devices": 1} | kw
        return [(b["x"].tolist(), rows) for b, rows in synchronized(batches, allgather, **options)]

    # the other host has one batch more: padding gives this one a batch of padding (0 rows read)
    other = [[(1, 4), (1, 4)], [(1, 4)]]
    assert sync(local(4, 4), fake_hosts(other), paddings=-1) == [
        ([0, 1, 2, 3], 4), ([0, 1, 2, 3], 4), ([-1, -1, -1, -1], 0)]
    assert sync(local(4, 4), fake_hosts(other), drop_last=True) == [([0, 1, 2, 3], 4), ([0, 1, 2, 3], 4)]
    with pytest.raises(ValueError, match="Uneven number of batches detected across JAX workers"):
        sync(local(4, 4), fake_hosts(other))
    # this host has more than the other: with drop_last it stops with it
    assert sync(local(4, 4, 4), fake_hosts([[(1, 4), (1, 4)], []]), drop_last=True) == [
        ([0, 1, 2, 3], 4), ([0, 1, 2, 3], 4)]
    with pytest.raises(ValueError, match="Host batch sizes range from 2 to 4"):
        sync(local(4, 2), fake_hosts([[(1, 4), (1, 4)]]))
    with pytest.raises(ValueError, match=r"The globally minimum batch size \(3\) must be evenly divisible"):
        sync(local(3), fake_hosts([[(1, 3)]]), devices=2)
    with pytest.raises(ValueError, match="Cannot create dummy batches for synchronization"):
        sync(local(), fake_hosts([[(1, 4)]]), paddings=0)
