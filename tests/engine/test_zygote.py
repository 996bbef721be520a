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
