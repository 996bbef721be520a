"""Soak: thousands of random plans (tests/engine/plan_fuzz.py) with blocks up to 256 MiB.

    python benchmarks/soak.py --cases 500 --seed 1000 --max-block-mib 256 [--mode streaming|local] [--store-mib 256]

Each case must end with the exact rows, within --case-timeout seconds, with nothing left in the
object store; the first failure stops the run and prints the case (rerun it with --seed N --cases 1).
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "engine"))

from plan_fuzz import make_case, run

import dataflow

LEAK_GRACE_S = 15.0
"""How long freed blocks may take to disappear after a case before they count as leaked."""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1000)
    parser.add_argument("--max-block-mib", type=int, default=256)
    parser.add_argument("--mode", choices=["streaming", "local"], default="streaming")
    parser.add_argument("--num-cpus", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--case-timeout", type=float, default=300.0)
    parser.add_argument("--store-mib", type=int, default=None, help="object store size (default: the engine's)")
    args = parser.parse_args()
    store = None if args.store_mib is None else args.store_mib << 20
    dataflow.init(execution_mode=args.mode, num_cpus=args.num_cpus, object_store_memory=store)
    started = time.perf_counter()
    kills = 0
    for seed in range(args.seed, args.seed + args.cases):
        case = make_case(seed, max_block_bytes=args.max_block_mib << 20, kills=args.mode == "streaming")
        error: list[BaseException] = []

        def one(case=case, error=error) -> None:
            try:
                with tempfile.TemporaryDirectory() as tmp, dataflow.options(
                    preserve_order=case.preserve_order, max_task_attempts=10
                ):
                    run(case, tmp)
            except BaseException as err:
                error.append(err)

        t0 = time.perf_counter()
        thread = threading.Thread(target=one, daemon=True)
        thread.start()
        thread.join(args.case_timeout)
        took = time.perf_counter() - t0
        if thread.is_alive():
            print(f"HUNG after {took:.0f} s: {case}")
            return 1
        if error:
            print(f"FAILED: {case}\n{error[0]!r}")
            return 1
        from engine import session as engine_session

        current = engine_session.current_session()
        if current is not None:
            current.executor.sync()
            left = glob.glob(os.path.join(current.shm_dir, "*.arrow")) + glob.glob(os.path.join(current.spill_dir, "*.arrow"))
            # the store unlinks freed blocks off the loop: after a case of tens of GiB (spilled
            # files on a busy disk) that takes 1-2 s, so wait for them, within a bound
            deadline = time.monotonic() + LEAK_GRACE_S
            while left and time.monotonic() < deadline:
                time.sleep(0.2)
                left = [p for p in left if os.path.exists(p)]
            if left:
                print(f"LEAKED {len(left)} blocks: {case}")
                return 1
            # freed files kept to be written over: each one on disk is in the pool
            spares = glob.glob(os.path.join(current.shm_dir, "spare-*"))
            stats = current.executor.statistics()
            if len(spares) > stats["spare_files"] + stats["spare_files_lent"]:
                print(f"LEAKED spare files ({len(spares)} on disk, {stats['spare_files']} kept, "
                      f"{stats['spare_files_lent']} lent to running tasks): {case}")
                return 1
        kills += case.kills
        print(f"ok {took:6.2f} s  {case}", flush=True)
    print(f"{args.cases} cases, {kills} worker kills, {time.perf_counter() - started:.0f} s, all exact")
    from engine import session as engine_session

    current = engine_session.current_session()
    if current is not None:
        stats = current.executor.statistics()
        print(f"freed block files written over: {stats['spares_reused']} (of {stats['spares_kept']} kept)")
    dataflow.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
