"""A Prometheus endpoint for this process's executions and engine (opt-in).

``dataflow.init(metrics_port=8080)`` (or ``DATAFLOW_METRICS_PORT=8080``, read on the first
execution) serves ``http://127.0.0.1:8080/metrics``; ``metrics_host="0.0.0.0"`` (or
``DATAFLOW_METRICS_HOST``) lets other machines scrape it. It needs ``prometheus_client``:
``pip install 'dataflow[metrics]'``; nothing imports it otherwise.

Each scrape reads the snapshots ``dataflow.progress`` keeps (the running executions, and the
last ones that ended) and the engine's statistics; nothing is counted for it in between.
Per operator, labelled ``dataset`` ("<name or dataset>_<execution id>") and ``operator``
("<name>_<index in the plan>"): rows, bytes and tasks out, tasks retried, tasks running and
queued, actors, bytes held, seconds held back by reason, and the reason it waits now. For the
engine: store used, peak and capacity, blocks and bytes spilled, workers, actors, and executions
running and ended (by how they ended).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from typing import Any

from dataflow.context import env_metrics_address
from engine.stats import ExecutionProgress

_lock = threading.Lock()
_server: Any = None
_address: tuple[str, int] | None = None

OPERATOR_COUNTERS = (
    ("operator_output_rows", "Rows an operator produced", "rows_out"),
    ("operator_output_bytes", "Bytes of the blocks an operator produced", "bytes_out"),
    ("operator_tasks_finished", "Tasks of an operator that finished", "tasks_done"),
    ("operator_tasks_retried", "Tasks of an operator run again after their worker died", "tasks_retried"),
)
OPERATOR_GAUGES = (
    ("operator_tasks_running", "Tasks of an operator running now", "tasks_running"),
    ("operator_tasks_queued", "Inputs of an operator waiting for a task (and tasks waiting for a retry)", "tasks_queued"),
    ("operator_actors", "Live actors of an operator's pool", "actors"),
    ("operator_held_bytes", "Bytes of an operator's live blocks (its share of the store)", "held_bytes"),
)
ENGINE_GAUGES = (
    ("store_used_bytes", "Bytes of blocks in the shared-memory store now", "store_used"),
    ("store_peak_bytes", "Most bytes the shared-memory store held at once", "store_peak"),
    ("store_capacity_bytes", "Bytes the store holds before blocks spill to disk", "store_capacity"),
    ("store_spare_bytes", "Bytes of freed block files kept for later blocks to be written over", "spare_bytes"),
    ("workers", "Task worker processes alive", "workers"),
    ("actors", "Actor worker processes alive", "actors"),
)
ENGINE_COUNTERS = (
    ("store_spilled_blocks", "Blocks written to disk because the store was full", "spilled_blocks"),
    ("store_spilled_bytes", "Bytes of the blocks written to disk because the store was full", "spilled_bytes"),
    ("store_spares_reused", "Blocks written over a freed block's file instead of a new one", "spares_reused"),
)


def families(
    executions: list[tuple[str | None, ExecutionProgress]],
    engine: Mapping[str, Any],
    ended: Mapping[str, int],
) -> Iterator[Any]:
    """The metric families for these snapshots (name, last snapshot of each execution), the
    engine's ``statistics()`` and the count of ended executions by how they ended."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    labels = ["dataset", "operator"]
    counters = {key: CounterMetricFamily(f"dataflow_{name}", text, labels=labels) for name, text, key in OPERATOR_COUNTERS}
    gauges = {key: GaugeMetricFamily(f"dataflow_{name}", text, labels=labels) for name, text, key in OPERATOR_GAUGES}
    waited = CounterMetricFamily(
        "dataflow_operator_wait_seconds", "Seconds an operator was held back, by reason", labels=[*labels, "reason"]
    )
    waiting = GaugeMetricFamily(
        "dataflow_operator_waiting", "1 for the reason an operator is held back now", labels=[*labels, "reason"]
    )
    share = GaugeMetricFamily("dataflow_execution_progress_ratio", "Estimated share of an execution done", labels=["dataset"])
    for name, p in executions:
        dataset = f"{name or 'dataset'}_{p.execution_id}"
        share.add_metric([dataset], p.fraction())
        for op in p.operators:
            values = [dataset, f"{op.name}_{op.index}"]
            for key, family in counters.items():
                family.add_metric(values, float(getattr(op, key)))
            for key, family in gauges.items():
                family.add_metric(values, float(getattr(op, key)))
            for reason, seconds in op.waits.items():
                waited.add_metric([*values, reason], seconds)
            if op.waiting:
                waiting.add_metric([*values, op.waiting], 1.0)
    yield from counters.values()
    yield from gauges.values()
    yield from (waited, waiting, share)
    for name, text, key in ENGINE_GAUGES:
        if key in engine:
            yield GaugeMetricFamily(f"dataflow_{name}", text, value=float(engine[key]))
    for name, text, key in ENGINE_COUNTERS:
        if key in engine:
            yield CounterMetricFamily(f"dataflow_{name}", text, value=float(engine[key]))
    running = sum(1 for _, p in executions if p.running)
    yield GaugeMetricFamily("dataflow_executions_running", "Executions running now", value=float(running))
    outcomes = CounterMetricFamily("dataflow_executions_ended", "Executions that ended, by how", labels=["outcome"])
    for outcome, count in sorted(ended.items()):
        outcomes.add_metric([outcome], float(count))
    yield outcomes


class _Collector:
    """Reads the snapshots at each scrape."""

    def collect(self) -> Iterator[Any]:
        from dataflow.progress import manager
        from engine import runner

        tracker = manager()
        backend = runner.current()
        engine = backend.statistics() if backend is not None else {}
        yield from families(tracker.snapshots(), engine, dict(tracker.outcomes))


def serve(port: int, host: str = "127.0.0.1") -> int:
    """Serve the metrics on ``host:port`` (0: a free port); the port. A second call with
    another address moves the endpoint there."""
    global _server, _address
    try:
        from prometheus_client import CollectorRegistry, start_http_server
    except ImportError as err:
        msg = "dataflow's metrics endpoint needs prometheus_client: pip install 'dataflow[metrics]'"
        raise ImportError(msg) from err
    with _lock:
        if _server is not None and _address is not None and (port in (0, _address[1]) and host == _address[0]):
            return _address[1]
        _stop()
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Collector())  # type: ignore[arg-type]
        _server, _thread = start_http_server(port, addr=host, registry=registry)
        _address = (host, int(_server.server_port))
        return _address[1]


def serve_from_env() -> None:
    """Serve on ``DATAFLOW_METRICS_PORT`` (and ``DATAFLOW_METRICS_HOST``) when set."""
    address = env_metrics_address()
    if address is not None:
        serve(address[1], address[0])


def address() -> tuple[str, int] | None:
    """(host, port) the endpoint serves on, or None."""
    return _address


def stop() -> None:
    """Stop serving (if it does)."""
    with _lock:
        _stop()


def _stop() -> None:
    global _server, _address
    if _server is not None:
        _server.shutdown()
        _server.server_close()
    _server = _address = None
