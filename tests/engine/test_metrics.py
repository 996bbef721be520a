"""The Prometheus endpoint, scraped over HTTP while and after pipelines run; and the engine's log
lines for retries, worker deaths and actor restarts."""

from __future__ import annotations

import logging
import os
import signal
import socket
import time
import urllib.request

import pytest

import dataflow
from dataflow import metrics, progress
from engine import session as engine_session
from engine.stats import ExecutionProgress, OpProgress

pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families


@pytest.fixture(autouse=True)
def workers_ready(streaming):
    """Until the first worker is ready tasks run in the driver (cold start): wait for them."""
    assert engine_session.current_session().executor.wait_for_workers()


@pytest.fixture
def endpoint():
    dataflow.init(metrics_port=0)
    host, port = metrics.address()
    yield f"http://{host}:{port}/metrics"
    metrics.stop()


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def values(samples, name: str, **labels: str) -> list[float]:
    return [v for (n, ls), v in samples.items() if n == name and all((k, x) in ls for k, x in labels.items())]


def _wait_until_ended(timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while progress.manager().tracked() and time.monotonic() < deadline:
        time.sleep(0.05)


def test_operator_and_store_metrics_are_scraped(endpoint):
    ds = dataflow.range(3000, override_num_blocks=6).map_batches(lambda b: b, batch_size=500)
    ds.set_name("numbers")
    assert ds.count() == 3000
    _wait_until_ended()
    samples = scrape(endpoint)
    execution = progress.manager().recent[-1][1].execution_id
    dataset = f"numbers_{execution}"
    rows = values(samples, "dataflow_operator_output_rows_total", dataset=dataset)
    assert rows == [3000.0]
    assert values(samples, "dataflow_operator_tasks_finished_total", dataset=dataset)[0] >= 1
    assert values(samples, "dataflow_operator_tasks_running", dataset=dataset) == [0.0]
    assert values(samples, "dataflow_execution_progress_ratio", dataset=dataset) == [1.0]
    assert values(samples, "dataflow_executions_ended_total", outcome="finished")[0] >= 1
    assert values(samples, "dataflow_store_capacity_bytes")[0] > 0
    assert values(samples, "dataflow_workers") == [2.0]
    for name in ("dataflow_store_used_bytes", "dataflow_store_peak_bytes", "dataflow_store_spilled_bytes_total",
                 "dataflow_store_spilled_blocks_total", "dataflow_store_spare_bytes", "dataflow_store_spares_reused_total",
                 "dataflow_actors", "dataflow_executions_running"):
        assert values(samples, name), name


def test_a_running_execution_shows_tasks_and_waits(endpoint):
    def slow(batch):
        time.sleep(0.2)
        return batch

    it = iter(dataflow.range(4000, override_num_blocks=20).map_batches(slow, batch_size=200).iter_batches(batch_size=200))
    next(it)
    time.sleep(0.5)
    samples = scrape(endpoint)
    assert values(samples, "dataflow_executions_running")[0] >= 1
    running = values(samples, "dataflow_operator_tasks_running")
    assert running and max(running) >= 1
    waited = [ls for (n, ls), _ in samples.items() if n == "dataflow_operator_wait_seconds_total"]
    assert all(dict(ls)["reason"] for ls in waited)
    it.close()  # stops the execution
    _wait_until_ended()
    assert values(scrape(endpoint), "dataflow_executions_ended_total", outcome="cancelled")


def test_the_port_from_the_environment(monkeypatch):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("DATAFLOW_METRICS_PORT", str(port))
    metrics.serve_from_env()
    try:
        assert metrics.address() == ("127.0.0.1", port)
        assert dataflow.range(10).count() == 10
        _wait_until_ended()
        assert values(scrape(f"http://127.0.0.1:{port}/metrics"), "dataflow_executions_ended_total")
    finally:
        metrics.stop()
    assert metrics.address() is None


def test_families_from_plain_snapshots():
    op = OpProgress(0, "Map(f)", (), True, 10, 80, 1, 2, 3, 1, 40, "no free worker", True, False,
                    waits={"no free worker": 1.5})
    families = {f.name: f for f in metrics.families([("x", ExecutionProgress(4, 1.0, "running", (op,)))], {}, {"failed": 2})}
    assert families["dataflow_operator_tasks_queued"].samples[0].value == 3
    assert families["dataflow_operator_tasks_queued"].samples[0].labels == {"dataset": "x_4", "operator": "Map(f)_0"}
    assert families["dataflow_operator_wait_seconds"].samples[0].value == 1.5
    assert families["dataflow_operator_waiting"].samples[0].labels["reason"] == "no free worker"
    assert families["dataflow_executions_running"].samples[0].value == 1
    assert families["dataflow_executions_ended"].samples[0].labels == {"outcome": "failed"}
    assert "dataflow_store_used_bytes" not in families  # no engine statistics: no store metrics


def test_retries_worker_deaths_and_actor_restarts_are_logged(tmp_path, caplog):
    driver = os.getpid()
    task_marker, actor_marker = str(tmp_path / "task"), str(tmp_path / "actor")

    def die_once(batch):
        if os.getpid() != driver and not os.path.exists(task_marker):
            open(task_marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        return batch

    class Model:
        def __call__(self, batch):
            if os.getpid() != driver and not os.path.exists(actor_marker):
                open(actor_marker, "w").close()
                os.kill(os.getpid(), signal.SIGKILL)
            return batch

    with caplog.at_level(logging.INFO, logger="dataflow"):
        assert dataflow.range(2000, override_num_blocks=4).map_batches(die_once).count() == 2000
        assert dataflow.range(400, override_num_blocks=4).map_batches(Model, concurrency=1, batch_size=100).count() == 400
        _wait_until_ended()
    by_logger = {}
    for record in caplog.records:
        by_logger.setdefault(record.name, []).append(record.getMessage())
    execution = "\n".join(by_logger["dataflow.execution"])
    worker = "\n".join(by_logger["dataflow.worker"])
    assert "will run again (attempt 2): its worker died" in execution
    assert "started: ReadRange->MapBatches(" in execution and "die_once)" in execution and "finished in" in execution
    assert "was killed by SIGKILL" in worker
    assert "died; restarting it" in worker


def test_spilling_is_logged_and_counted(fresh_engine, caplog):
    import numpy as np

    dataflow.init(num_cpus=2, object_store_memory=8 << 20, metrics_port=0)
    host, port = metrics.address()
    try:
        with caplog.at_level(logging.INFO, logger="dataflow.engine"):
            wide = dataflow.range(200, override_num_blocks=20).map_batches(
                lambda b: {"x": np.zeros((len(b["id"]), 100_000), dtype=np.uint8)}
            )
            kept = wide.materialize()  # 19 MiB: more than the store holds
            assert kept.count() == 200
            samples = scrape(f"http://{host}:{port}/metrics")
            del kept
    finally:
        metrics.stop()
    assert values(samples, "dataflow_store_spilled_blocks_total")[0] >= 1
    assert values(samples, "dataflow_store_spilled_bytes_total")[0] > 0
    spills = [r.getMessage() for r in caplog.records if "spill to" in r.getMessage()]
    assert len(spills) == 1 and "blocks spill to" in spills[0]  # once, then at most every 10 s
