"""dataflow's execution engine. It never imports ``dataflow``; it knows connectors only through
``connectors.base`` (ReadTask, Datasink).

The data path, in order:

* ``runner``          the one entry point ``dataflow`` uses: the backend for an execution mode
                      (start, current, shutdown), execute(operators) -> ExecutionHandle, and how
                      a streaming_split iterator reaches its coordinator
* ``backend``         the backend interface: execute, get, free, capacity, busy_cpus, split
                      coordinators (with their transport), shutdown; ExecutionHandle (iterate
                      refs, get blocks, release). Implemented by ``session`` (multi-process),
                      ``local`` (in-process) and ``ray_backend``; ``dataflow`` imports none
* ``session``         the multi-process backend: /dev/shm folder, executor, workers; cleanup
* ``ray_backend``     the same executions on a Ray cluster (Ray tasks with streaming returns,
                      Ray actors, blocks as driver-owned objects); with ``ray_split`` (a
                      streaming_split coordinator in an actor, for ranks on any node) the only
                      modules importing ray
* ``executor``        the one event-driven scheduling loop (thread in the driver)
* ``execution``       one running plan: operators wired together, the consumer's buffer, and
                      the one table of which blocks it produced (only it frees blocks)
* ``scheduler``       pure: which runnable operator goes next
* ``backpressure``    pure: each operator's byte budget (from the store's capacity, its
                      parallelism and its learned output size) and whether it may start a task
* ``operators/``      input, map (tasks and actor pools, exact batch slicing), limit, union,
                      exchange (the partition and reduce sides of an all-to-all step; a
                      sort's partition side fused into its read after a key-only sampling
                      read), source (a listing pulled on its own thread, never the loop's)
* ``exchange``        what an all-to-all step's tasks run: group rows by partition into one
                      block per task, and hand a reducer one range of partitions (or, for a
                      small exchange over a read, every row in the task that reads)
* ``units``           which read task ("input unit") a block came from, for resumable writes:
                      tasks never mix units and a resumable write takes each one whole
* ``split``           streaming_split: the dealing policy (pure) and the per-epoch coordinator;
                      no transport of its own (the backend hands it one)
* ``split_server``    the multi-process backend's split transport: iterators in other
                      processes talk to the coordinator over ipc
* ``resources``       GPUs: detection and the ledger behind CUDA_VISIBLE_DEVICES
* ``transform``       the fused chain of row/batch functions a task runs
* ``row_errors``      rows an ``on_error="skip"`` stage drops: counts, and records for the error sink
* ``block_format``    blocks <-> numpy / pandas / pyarrow / polars batches and rows
* ``task``            TaskSpec / TaskResult, and run_task (same code in workers and inline)
* ``tracebacks``      a UDF's frames without the engine's, rendered by the driver with source lines
* ``protocol``        typed, versioned messages; ``transport``: the sockets (Unix streams for
                      local workers, pyzmq with CurveZMQ over tcp)
* ``wakeup``          the pipe other threads use to rouse the executor's and split server's loops
* ``serialization``   the only module that pickles
* ``worker_pool``     the driver's handles on worker processes (pidfds)
* ``forkserver``      the zygote that forks workers with pyarrow already imported; torch once the
                      driver or an actor has imported it; glibc malloc set to keep a task's
                      freed scratch memory; it tells how a dead worker ended, and cleans up the
                      session's folders if the driver dies
* ``worker``          a worker process's loop
* ``object_store``    Arrow IPC files in /dev/shm, zero-copy reads, spill to disk; blocks of at most
                      64 KiB travel in their ref instead
* ``local``           the synchronous in-process mode (the in-process backend)
* ``stats``           per-operator statistics and why each operator waited; the live snapshot
                      progress bars and metrics read (``ExecutionHandle.progress()``)
* ``options``, ``errors``

Departures from the design notes, and why:

* Actor pools are dedicated worker processes per operator, forked on demand next to the task
  workers (as Ray's actors are), rather than task workers adopted by the pool: a pool's model
  stays out of the task workers' memory and a pool can never starve the tasks feeding it.
* Until the first worker process is ready, tasks run in a thread of the driver (the "inline
  slot"), so a small job's first row does not wait ~0.3 s for processes. Once a worker is
  ready this never happens again in the session. A UDF that kills its own process during those
  first moments kills the driver (as in local mode); actor pools never run inline.
* Spilling is decided when a block is written (the store is over capacity: the block goes to
  disk), not by moving blocks out of shared memory later. Readers do not see the difference.
* An actor pool whose UDF takes ``batch_size=n`` is not fused with the steps before it: its
  input is sliced into multiples of n rows so every call but the last gets exactly n rows.
* Budgets reserve half the object store for operators (split evenly, each capped to two waves
  of its tasks' output) and leave the other half as shared headroom, instead of a reservation
  and a shared pool managed per operator as in Ray Data: one rule, a pure function, and enough
  with streaming operators. An operator whose downstream is starved for rows is admitted over
  its budget (rows past the store's capacity spill), which is what makes every shape finish.
* Local workers talk to the driver over Unix stream sockets in the session's 0700 folder (one
  connection per worker, length-prefixed frames, no I/O thread), not zmq ``ipc://``; tcp keeps
  pyzmq with CurveZMQ. A zmq round trip through both sides' I/O threads costs ~3.5x the CPU of
  a stream's (123 against 33 µs per round trip, both processes together, on 2 cores), and with
  tasks of ~200 µs that was the difference between 4,200 and 5,300 tasks/s. Who may connect is
  unchanged (the folder's permissions); a stream additionally tells a worker at once that its
  driver is gone (end of file).
* Task specs over blocks and task results are pickled with the standard C pickler (cloudpickle
  only when something in them needs pickling by value): ~5x less driver CPU per task.
* Blocks are written into /dev/shm with write(2), not reserved with ``posix_fallocate`` and
  written through a mapping. The invariant the design asks for holds either way (a full store
  is an ``ENOSPC`` error we answer by spilling, never a SIGBUS), and write(2) does not zero
  every page first: half the CPU per block (20 ms against 40 ms per 32 MiB).
* Blocks of at most 64 KiB of Arrow data have no file: the task's reply carries their bytes
  (an Arrow IPC stream) in the ``BlockRef``, and so does the spec of the next task that reads
  them, as Ray returns small objects in the reply and keeps them in the owner's memory. A file
  costs its writer an open, a write and a close, its reader an open, a stat, a read and a
  close, and the driver an unlink. The driver counts those bytes against the store's capacity
  as it does files, and a reader gets a private copy (as writable as a mapping). An exchange's
  map outputs are always files: every reducer reads a slice of each, and a slice of a block
  held in its ref would carry the whole block to every reducer. Draining
  2,000 blocks of 8 KiB through ``map_batches(identity)``, alternating with the previous
  version: 1,812-2,095 against 954-1,808 tasks/s with ``iter_batches``, 2,849-3,290 against
  2,020-3,175 with ``count()``.
* Block files of at most 64 KiB (spilled ones: smaller blocks have no file) are read into
  private memory with read(2) instead of mapped:
  mapping one costs its page faults and, when it is unmapped in a process with other threads
  (the driver always has some), a TLB shootdown on the CPUs they run on. With a second thread
  busy, an 8 KiB block took 32 µs read against 52 µs mapped, and a consumer draining 8 KiB
  blocks spent 67-72 instead of 86-93 µs of its thread's CPU per block. The copy is as
  private and as writable as the copy-on-write mapping; bigger blocks are still mapped
  zero-copy (from 1 MiB up the two cost the same, and only a mapping avoids a second copy).
* All-to-all steps are map operators with a barrier, not operators of their own kind: a map
  side writes one block per task with its partitions' row counts on the ref (no M x P small
  objects), and the reduce side plans contiguous ranges of 256 fine partitions from the bytes
  that arrived. Budgets, retries and ownership are the map operator's, and the barrier admits
  what feeds it, so exchanges run out of core through the store's spilling.
"""

from engine.options import ExecutionOptions

__all__ = ["ExecutionOptions"]
