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
        env = [os.environ.get(n) for n in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")]
        return {"faults": [faults], "env": [json.dumps(env)], "pid": [os.getpid()]}

    dataflow.init(num_cpus=1, inline_cold_start=False)
    ds = dataflow.range(4, override_num_blocks=1).map_batches(probe, batch_size=None)
    row = ds.take_all()[0]
    assert row["pid"] != os.getpid(), "the probe must run in a worker"
    print(json.dumps({"faults": row["faults"], "env": json.loads(row["env"])}))
""")


def _run_probe(env: dict[str, str]) -> dict:
    import json
    import os

    full = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    out = subprocess.run([sys.executable, "-c", _MALLOC_PROBE], capture_output=True, text=True, timeout=120,
                         env={**full, **env})
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_workers_keep_freed_scratch_memory_instead_of_faulting_it_in_again():
    """A worker's glibc allocator keeps a task's freed temporaries of a few MiB (the zygote sets
    it up): 0 page faults for the next ones, against ~1,500 a round with glibc's defaults. The
    variables themselves are not left in a worker's environment."""
    ours = _run_probe({})
    assert ours["faults"] < 200, ours
    assert ours["env"] == [None, None], ours


def test_a_user_choice_of_malloc_settings_is_left_alone():
    """Set in the driver's environment, glibc's defaults (here an empty ``GLIBC_TUNABLES``)
    hold in the workers too: the same temporaries fault in again every round."""
    theirs = _run_probe({"GLIBC_TUNABLES": ""})
    assert theirs["faults"] > 2_000, theirs
    mine = _run_probe({"MALLOC_TRIM_THRESHOLD_": str(1 << 20)})
    assert mine["env"] == [None, str(1 << 20)], mine


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
