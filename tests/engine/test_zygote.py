"""The zygote learns which heavy frameworks the UDFs import, so later actors start with them."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest


def test_actors_of_a_later_execution_start_with_torch_already_imported():
    pytest.importorskip("torch")
    script = textwrap.dedent("""
        import sys
        import dataflow

        class Model:
            def __init__(self):
                self.had_torch = "torch" in sys.modules  # before this actor imported it
                import torch
                self.torch = torch

            def __call__(self, batch):
                return {"had_torch": [self.had_torch] * len(batch["id"])}

        def run():
            ds = dataflow.range(64, override_num_blocks=4).map_batches(Model, concurrency=1, batch_size=16)
            return {row["had_torch"] for row in ds.take_all()}

        first = run()
        second = run()
        assert "torch" not in sys.modules, "the driver must not have imported torch for this test"
        print(first, second)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["{False}", "{True}"], out.stdout


_MALLOC_PROBE = textwrap.dedent("""
    import json, os, resource
    import numpy as np
    import dataflow

    def probe(batch):
        def temporaries():  # three 2 MiB arrays at once, freed together: a task's scratch
            a, b, c = np.ones(1 << 18), np.ones(1 << 18), np.ones(1 << 18)
            del a, b, c
        temporaries()
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(4):
            temporaries()
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
        env = [os.environ.get(n) for n in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")]
        return {"faults": [faults], "env": [json.dumps(env)], "pid": [os.getpid()]}

    dataflow.init(num_cpus=1, inline_cold_start=False)
    ds = dataflow.range(4, override_num_blocks=1).map_batches(probe, batch_size=None)
    row = ds.take_all()[0]
    assert row["pid"] != os.getpid(), "the probe must run in a worker"
    print(json.dumps({"faults": row["faults"], "env": json.loads(row["env"])}))
""")


def _run_probe(env: dict[str, str], script: str = _MALLOC_PROBE) -> dict:
    """``script``'s last line of output, as JSON; run without this environment's allocator
    variables, with ``env`` instead."""
    import json
    import os

    full = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         env={**full, **env})
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_workers_keep_freed_scratch_memory_instead_of_faulting_it_in_again():
    """A worker's glibc allocator keeps a task's freed temporaries of a few MiB (the zygote sets
    it up): 0 page faults for the next ones, against ~1,500 a round with glibc's defaults. The
    variables themselves are not left in a worker's environment."""
    ours = _run_probe({})
    assert ours["faults"] < 200, ours
    assert ours["env"] == [None, None, None], ours


def test_a_user_choice_of_malloc_settings_is_left_alone():
    """Set in the driver's environment, glibc's defaults (here an empty ``GLIBC_TUNABLES``)
    hold in the workers too: the same temporaries fault in again every round."""
    theirs = _run_probe({"GLIBC_TUNABLES": ""})
    assert theirs["faults"] > 2_000, theirs
    mine = _run_probe({"MALLOC_TRIM_THRESHOLD_": str(1 << 20)})
    assert mine["env"] == [None, str(1 << 20), None], mine


_ACTIVATIONS_PROBE = textwrap.dedent("""
    import json, os, resource
    import dataflow

    def probe(batch):
        import torch

        torch.set_num_threads(1)
        weight, x = torch.ones(256, 64), torch.ones(4096, 64)
        kept, faults = [], []
        with torch.inference_mode():
            for _ in range(40):
                before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                hidden = torch.nn.functional.linear(x, weight, torch.zeros(256))  # 4 MiB
                out = torch.relu(hidden)  # 4 MiB
                del hidden
                kept.append(out[:, :10].clone())  # 160 KiB, kept like a batch's output
                del out
                faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        env = [os.environ.get(n) for n in ("GLIBC_TUNABLES", "MALLOC_ARENA_MAX")]
        return {"faults": [json.dumps(faults[20:])], "env": [json.dumps(env)], "pid": [os.getpid()]}

    dataflow.init(num_cpus=1, inline_cold_start=False)
    row = dataflow.range(1, override_num_blocks=1).map_batches(probe, batch_size=None).take_all()[0]
    assert row["pid"] != os.getpid(), "the probe must run in a worker"
    print(json.dumps({"faults": json.loads(row["faults"]), "env": json.loads(row["env"])}))
""")


def test_a_model_s_aligned_activations_reuse_the_memory_freed_by_the_last_batch():
    """torch allocates with ``posix_memalign``. With glibc's per-thread cache of small chunks
    (its default), each such allocation left a cached sliver that kept the chunks freed around
    it apart: with a batch's small output kept (as a task keeps its outputs), every batch's
    4 MiB activations came from new memory, 1,024 page faults a batch. The zygote turns that
    cache off for its workers: the freed activations are used again."""
    pytest.importorskip("torch")
    got = _run_probe({}, _ACTIVATIONS_PROBE)
    assert sum(got["faults"]) / len(got["faults"]) < 256, got  # 1,024 a batch with the cache on (Zen 5)
    assert got["env"] == [None, None], got


def test_a_container_s_arena_limit_keeps_the_other_allocator_settings():
    """``MALLOC_ARENA_MAX`` (set by many container images) replaces none of the zygote's
    settings: the activations are still reused, and the variable reaches the workers as set.
    An empty ``GLIBC_TUNABLES`` is the user taking all of them: it reaches the workers as it is,
    with none of the zygote's settings added. (How many page faults glibc's own defaults cost
    here depends on the CPU: torch's kernels differ in their small allocations, and on some
    machines the activations are reused with the cache on too, 40 faults a batch; the cost of
    the defaults is pinned by ``test_a_user_choice_of_malloc_settings_is_left_alone``.)"""
    pytest.importorskip("torch")
    got = _run_probe({"MALLOC_ARENA_MAX": "2"}, _ACTIVATIONS_PROBE)
    assert sum(got["faults"]) / len(got["faults"]) < 256, got
    assert got["env"] == [None, "2"], got
    theirs = _run_probe({"GLIBC_TUNABLES": ""}, _ACTIVATIONS_PROBE)
    assert theirs["env"] == ["", None], theirs


def test_zygote_malloc_env_leaves_out_what_the_user_set():
    from engine.forkserver import MALLOC_TUNABLES, zygote_malloc_env

    every = ":".join(f"{k}={v}" for k, v in MALLOC_TUNABLES.items())
    purge = {"MIMALLOC_PURGE_DELAY": "10000"}
    assert zygote_malloc_env({}) == {"GLIBC_TUNABLES": every, **purge}
    assert zygote_malloc_env({"MALLOC_ARENA_MAX": "2"}) == {"GLIBC_TUNABLES": every, **purge}
    assert zygote_malloc_env({"GLIBC_TUNABLES": ""}) == purge
    assert zygote_malloc_env({"GLIBC_TUNABLES": "", "MIMALLOC_PURGE_DELAY": "0"}) == {}
    trimmed = zygote_malloc_env({"MALLOC_TRIM_THRESHOLD_": "1"})["GLIBC_TUNABLES"]
    assert "trim_threshold" not in trimmed and "tcache_count=0" in trimmed and "mmap_threshold" in trimmed


_ARROW_MEMORY_PROBE = textwrap.dedent("""
    import json, os, resource, time
    import numpy as np
    import pyarrow as pa
    import dataflow

    def arrow_scratch():  # four 4 MiB buffers, written and freed: a task's Arrow temporaries
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        buffers = [pa.allocate_buffer(4 << 20) for _ in range(4)]
        for buffer in buffers:
            np.frombuffer(buffer, dtype=np.uint8)[:] = 1
        del buffers, buffer
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

    def probe(batch):
        arrow_scratch()
        time.sleep(1.5)  # idle past mimalloc's default purge delay (1 s)
        return {"faults": [arrow_scratch()], "env": [os.environ.get("MIMALLOC_PURGE_DELAY")], "pid": [os.getpid()]}

    dataflow.init(num_cpus=1, inline_cold_start=False)
    row = dataflow.range(1, override_num_blocks=1).map_batches(probe, batch_size=None).take_all()[0]
    assert row["pid"] != os.getpid(), "the probe must run in a worker"
    print(json.dumps({"faults": row["faults"], "env": row["env"]}))
""")


def test_a_worker_keeps_arrow_memory_it_freed_for_a_while():
    """Arrow's allocator in a worker keeps memory freed a few seconds ago (``MIMALLOC_ENV``): the
    next task after a pause reuses it instead of faulting it in again (with mimalloc's default,
    600-700 page faults for these 16 MiB after 1.5 s idle). The variable itself is not left in
    the worker's environment; a user's own value is, and holds."""
    got = _run_probe({}, _ARROW_MEMORY_PROBE)
    assert got["faults"] < 64, got
    assert got["env"] is None, got
    theirs = _run_probe({"MIMALLOC_PURGE_DELAY": "0"}, _ARROW_MEMORY_PROBE)
    assert theirs["faults"] > 256, theirs
    assert theirs["env"] == "0", theirs


def test_the_zygote_imports_torch_at_start_when_the_driver_has():
    """A driver that imported torch: the zygote imports it once the task workers are forked,
    with no job asking, so the first actors fork with it instead of waiting for the import."""
    pytest.importorskip("torch")
    script = textwrap.dedent("""
        import time
        import torch
        import dataflow
        from engine import session

        dataflow.init(num_cpus=1)
        pool = session.current_session().executor.pool
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            zygote = pool.forkserver
            if zygote is not None:
                with open(f"/proc/{zygote.proc.pid}/maps") as maps:
                    if "libtorch" in maps.read():
                        print("zygote has torch")
                        break
            time.sleep(0.1)
        dataflow.shutdown()
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "zygote has torch", out.stdout


def test_workers_collect_their_own_objects_not_the_zygotes():
    """The zygote imports with Python's cycle collector off and freezes what it holds before it
    forks: a worker starts with the collector on, the zygote's objects frozen (its collections
    skip them), and its own cyclic garbage still collected."""
    script = textwrap.dedent("""
        import gc, json, os, weakref
        import dataflow

        class Cycle:
            pass

        def probe(batch):
            c = Cycle()
            c.me = c  # cyclic garbage of the worker's own, once deleted
            alive = weakref.ref(c)
            del c
            gc.collect()
            return {"enabled": [gc.isenabled()], "frozen": [gc.get_freeze_count()],
                    "collected": [alive() is None], "pid": [os.getpid()]}

        dataflow.init(num_cpus=1, inline_cold_start=False)
        row = dataflow.range(4, override_num_blocks=1).map_batches(probe, batch_size=None).take_all()[0]
        assert row["pid"] != os.getpid(), "the probe must run in a worker"
        print(json.dumps({k: row[k] for k in ("enabled", "frozen", "collected")}))
    """)
    row = _run_probe({}, script)
    assert row["enabled"] is True, row
    assert row["frozen"] > 20_000, row  # pyarrow, numpy and the engine, imported by the zygote
    assert row["collected"] is True, row
