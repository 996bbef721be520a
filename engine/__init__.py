"""dataflow's execution engine. It never imports ``dataflow``; it knows connectors only through
``connectors.base`` (ReadTask, Datasink).

The data path, in order:

* ``runner``          execute(operators) -> ExecutionHandle (iterate refs, get blocks, release)
* ``session``         this process's session: /dev/shm folder, executor, workers; cleanup
* ``executor``        the one event-driven scheduling loop (thread in the driver)
* ``execution``       one running plan: operators wired together, the consumer's buffer
* ``scheduler``       pure: which runnable operator goes next
* ``backpressure``    pure: may an operator start a task, and if not, why
* ``operators/``      map (tasks and actor pools), limit, union
* ``transform``       the fused chain of row/batch functions a task runs
* ``block_format``    blocks <-> numpy / pandas / pyarrow / polars batches and rows
* ``task``            TaskSpec / TaskResult, and run_task (same code in workers and inline)
* ``protocol``        typed, versioned messages; ``transport``: pyzmq sockets only
* ``serialization``   the only module that pickles
* ``worker_pool``     the driver's handles on worker processes (pidfds)
* ``forkserver``      the zygote that forks workers with pyarrow already imported
* ``worker``          a worker process's loop
* ``object_store``    Arrow IPC files in /dev/shm, zero-copy reads, spill to disk
* ``local``           the synchronous in-process mode
* ``stats``           per-operator statistics and why each operator waited
* ``options``, ``errors``

Departure from the design notes: actor pools are dedicated worker processes per operator,
forked on demand next to the task workers (as Ray's actors are), rather than task workers
adopted by the pool; this keeps a pool's model out of the task workers' memory.
"""

from engine.options import ExecutionOptions

__all__ = ["ExecutionOptions"]
