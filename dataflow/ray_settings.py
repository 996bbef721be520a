"""Ray Data's ``DataContext`` settings that have no counterpart here, and what setting each does.

A Ray script that sets one of these still runs once its import is changed. Two kinds:

* ``WITHOUT_EFFECT``: tuning of Ray's own machinery (its shuffle implementations, its scheduler,
  its metrics, its progress bars' details) that changes neither what a job computes nor what it
  may use. Setting one is accepted, kept (reading it back gives what was set, or Ray's default),
  and logged once per process as a warning that says why it does nothing here.
* ``REFUSED``: settings whose intent this engine cannot carry out in the way a script expects
  (a different block type, a callback into Ray's executor, a timeout with another meaning).
  Setting one raises ``AttributeError`` with the reason and what to use instead.

Ray's defaults are those of Ray Data 2.60.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("dataflow")

_SHUFFLE = "Ray's shuffle machinery: dataflow's exchanges partition in map tasks and merge as partitions arrive"
_SCHEDULING = "Ray's task placement: dataflow places tasks itself (on the Ray runner too)"
_METRICS = "Ray's metrics and logs: dataflow's stats() and metrics are always on"
_BACKPRESSURE = "Ray's resource manager: dataflow's budgets come from the store's capacity and the CPUs"
_DEPRECATED = "deprecated in Ray, where it does nothing either"

WITHOUT_EFFECT: dict[str, tuple[Any, str]] = {
    # shuffles, sorts, aggregations, joins
    "shuffle_strategy": ("shuffle_v2", _SHUFFLE),
    "use_push_based_shuffle": (False, _SHUFFLE),
    "pipeline_push_based_shuffle_reduce_tasks": (True, _SHUFFLE),
    "default_hash_shuffle_parallelism": (200, _SHUFFLE + " (256 fine partitions, merged into the blocks asked for)"),
    "shuffle_compression": ("zstd", _SHUFFLE + " (partitions stay in shared memory, uncompressed)"),
    "hash_shuffle_reduce_batch_size": (16, _SHUFFLE),
    "hash_shuffle_reduce_get_timeout_s": (1800.0, _SHUFFLE),
    "shuffle_input_batch_bytes": (1 << 30, _SHUFFLE),
    "max_hash_shuffle_aggregators": (None, _SHUFFLE + " (no aggregator actors)"),
    "min_hash_shuffle_aggregator_wait_time_in_s": (300, _SHUFFLE + " (no aggregator actors)"),
    "hash_shuffle_aggregator_health_warning_interval_s": (30, _SHUFFLE + " (no aggregator actors)"),
    "max_hash_shuffle_finalization_batch_size": (None, _SHUFFLE),
    "join_operator_actor_num_cpus_override": (None, _SHUFFLE + " (no aggregator actors)"),
    "hash_shuffle_operator_actor_num_cpus_override": (None, _SHUFFLE + " (no aggregator actors)"),
    "hash_aggregate_operator_actor_num_cpus_override": (None, _SHUFFLE + " (no aggregator actors)"),
    "use_disk_based_hash_shuffle": (False, _SHUFFLE + " (partitions spill to disk past the store's capacity anyway)"),
    "gpu_shuffle_num_actors": (None, "Ray's GPU shuffle: dataflow shuffles on CPUs"),
    "gpu_shuffle_rmm_pool_size": (None, "Ray's GPU shuffle: dataflow shuffles on CPUs"),
    "gpu_shuffle_spill_memory_limit": ("auto", "Ray's GPU shuffle: dataflow shuffles on CPUs"),
    "gpu_shuffle_setup_timeout_s": (120.0, "Ray's GPU shuffle: dataflow shuffles on CPUs"),
    "use_polars": (False, "dataflow picks its kernels itself (polars where it is faster)"),
    "use_polars_sort": (False, "dataflow picks its kernels itself (polars where it is faster)"),
    # blocks, reads, tensors
    "target_min_block_size": (1 << 20, "small blocks are bundled into tasks of execution_options.min_task_input_bytes"),
    "read_op_min_num_blocks": (200, "reads split by file and row group; pass override_num_blocks to the read"),
    "min_parallelism": (200, _DEPRECATED + "; pass override_num_blocks to the read"),
    "streaming_read_buffer_size": (32 << 20, "readers stream through pyarrow's own buffers"),
    "decoding_size_estimation": (True, "block sizes are learned from the tasks that finished"),
    "use_datasource_v2": (True, "Ray's choice between two Parquet reader implementations"),
    "enable_pandas_block": (True, "blocks are always Arrow tables here (pandas batches are made for the UDF)"),
    "pandas_block_ignore_metadata": (False, "blocks are always Arrow tables here"),
    "batch_to_block_arrow_format": (True, "blocks are always Arrow tables here"),
    "enable_tensor_extension_casting": (True, "tensor columns are Arrow's own tensor types here, with nothing to cast"),
    "use_arrow_tensor_v2": (True, _DEPRECATED),
    "enforce_schemas": (False, "blocks of different schemas are unified where they meet (concatenation, union)"),
    # scheduling and resources
    "scheduling_strategy": ("SPREAD", _DEPRECATED + "; " + _SCHEDULING),
    "scheduling_strategy_large_args": ("DEFAULT", _DEPRECATED + "; " + _SCHEDULING),
    "large_args_threshold": (50 << 20, _DEPRECATED + "; " + _SCHEDULING),
    "isolate_read_workers": (False, _SCHEDULING + " (workers return freed Arrow memory after each task)"),
    "default_map_logical_memory_enabled": (False, _SCHEDULING + " (pass memory= to a map to reserve it)"),
    "op_resource_reservation_enabled": (True, _BACKPRESSURE),
    "op_resource_reservation_ratio": (0.5, _BACKPRESSURE),
    "object_store_reservation_overshoot_ratio": (None, _BACKPRESSURE),
    "object_store_memory_pressure_fraction": (None, _BACKPRESSURE),
    "output_backpressure_guard_release_interval_s": (None, _BACKPRESSURE),
    "downstream_capacity_backpressure_ratio": (2.0, _BACKPRESSURE),
    "enable_dynamic_output_queue_size_backpressure": (False, _BACKPRESSURE),
    "enable_lineage_reconstruction_resource_accounting": (True, _BACKPRESSURE),
    "actor_prefetcher_enabled": (False, "actors are sent their next task while they run one"),
    "max_tasks_in_flight_per_actor": (None, "actors are sent their next task while they run one"),
    "autoscaling_config": (None, "actor pools grow and shrink between their (min, max) as work waits"),
    "wait_for_min_actors_s": (-1, "an actor pool no node can hold fails at once (ResourceError), one whose "
                              "constructor raises with that error; execution_options.worker_start_timeout_s bounds a start"),
    "max_consecutive_actor_init_deaths": (0, "an actor whose process dies is replaced, and its task run again up to "
                                          "execution_options.max_task_attempts times"),
    # errors, stats, logs, progress
    "raise_original_map_exception": (False, "a UDF's error already reaches the caller as an instance of its own type "
                                     "(except ValueError catches it), with the original exception as its __cause__"),
    "log_internal_stack_trace": (False, "a UDF's error shows the UDF's own frames; engine frames are left out"),
    "verbose_stats_logs": (False, "Dataset.stats() always gives every operator's details"),
    "enable_auto_log_stats": (False, "each execution logs its summary line; Dataset.stats() gives the rest"),
    "accurate_map_phase_timing": (False, _METRICS),
    "per_stage_map_timing": (False, _METRICS),
    "trace_allocations": (False, _METRICS),
    "enable_get_object_locations_for_metrics": (False, _METRICS),
    "enable_per_node_metrics": (False, _METRICS),
    "enable_stats_summary_collection": (False, _METRICS),
    "memory_usage_poll_interval_s": (1, _METRICS + " (workers' memory is sampled while tasks run)"),
    "warn_on_driver_memory_usage_bytes": (2 << 30, _METRICS),
    "dataset_logger_id": (None, _METRICS),
    "issue_detectors_config": (None, _METRICS),
    "use_legacy_dataset_ids": (False, _METRICS),
    "use_ray_tqdm": (True, "progress is drawn by the driver (progress_mode)"),
    "enable_progress_bar_name_truncation": (True, "progress is drawn by the driver (progress_mode)"),
    "s3_try_create_dir": (False, "S3 has no directories to create; dataflow never makes them"),
}

REFUSED: dict[str, str] = {
    "execution_no_progress_timeout_s": "set execution_options.task_timeout_s to fail a task that runs too long "
    "(a hung UDF); every other wait in the engine is bounded",
    "actor_task_retry_on_errors": "Ray retries actor tasks without limit under it, which never ends on an error that "
    "repeats; pass retry_exceptions= and max_retries= to map_batches, or set retried_map_errors and max_map_retries",
    "arrow_fixed_shape_tensor_format": "tensor columns are Arrow's own fixed_shape_tensor type here (Ray's ARROW_NATIVE); "
    "Ray's V1 and V2 extension types are not made",
    "override_object_store_memory_limit_fraction": "set the store's size in bytes: dataflow.init(object_store_memory=...), "
    "or execution_options.resource_limits for one execution's share",
    "lance_config": "Ray's configuration object for its Lance connector; dataflow's connectors retry the errors in "
    "retried_io_errors and their own transient ones",
    "iceberg_config": "Ray's configuration object for its Iceberg connector; dataflow's connectors retry the errors in "
    "retried_io_errors and their own transient ones",
    "delta_config": "Ray's configuration object for its Delta connector; dataflow's connectors retry the errors in "
    "retried_io_errors and their own transient ones",
    "custom_execution_callback_classes": "callbacks into Ray's executor; dataflow's executor has no such hooks "
    "(Dataset.stats() and the metrics report what it did)",
}

_warned: set[str] = set()


def note_without_effect(name: str, value: Any) -> None:
    """Log, once per process and setting, that ``name`` was set and does nothing here."""
    if name in _warned:
        return
    _warned.add(name)
    log.warning("DataContext.%s = %r has no effect in dataflow: %s", name, value, WITHOUT_EFFECT[name][1])
