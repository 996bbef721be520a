"""Ray Data's own docstring examples, run on Ray Data 2.60 and on dataflow with the import changed.

Every ``>>>`` example in the docstrings of Ray Data's public modules (``dataset.py``,
``read_api.py``, ``grouped_data.py``, ``iterator.py``, ``expressions.py``, ``context.py`` and the
preprocessors) runs twice, as Python's ``doctest`` runs it (``ELLIPSIS``,
``NORMALIZE_WHITESPACE``): once in Ray's venv with Ray itself (``benchmarks/.venvs/ray``, ``bash
benchmarks/setup_peers.sh``), once in this interpreter with a stand-in ``ray`` package whose
``ray.data`` is ``dataflow`` (``import ray; ray.data.range(...)``, ``from ray.data.aggregate
import Count`` find dataflow's). An example counts against dataflow when it passes on Ray and
fails here: it printed something else, raised, or never ran (a docstring's examples that run
past 90 s stop there). Examples marked ``+SKIP`` run on neither side and are not counted.
Examples that fail on Ray too (most read ``s3://anonymous@ray-example-data/...``, which this
machine cannot reach) say nothing either way.

Differences this project keeps on purpose (``KNOWN``: the APIs that hand out Ray object
references, which the README lists as not provided, and the text of ``print(expr)``), matched
on the example's source, are listed apart; any other makes the exit status 1.

    python benchmarks/ray_doctests.py                 # every module
    python benchmarks/ray_doctests.py dataset iterator
"""

from __future__ import annotations

import argparse
import ast
import doctest
import json
import os
import signal
import subprocess
import sys
import tempfile
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers

RESULT_TAG = "@@DOCTESTS@@"
MODULES = ["dataset", "read_api", "grouped_data", "iterator", "expressions", "context"] + [
    f"preprocessors/{m}" for m in ("chain", "concatenator", "discretizer", "encoder", "hasher", "imputer",
                                   "normalizer", "scaler", "tokenizer", "vectorizer")]
KNOWN = {
    "refs": "APIs that hand out or take Ray object references (to_pandas_refs, from_arrow_refs, "
            "get_internal_block_refs, iter_internal_ref_bundles, ray.put) are not provided (README: Ray Data "
            "APIs not provided); the examples after one that failed fail on its missing name",
    "ray.put(": "as refs",
    "ref_bundle": "as refs",
    "RangeDatasource": "the example imports Ray's internal RangeDatasource",
    "print(expr)": "print(expr) is the expression as written here, (col('x') + 5) * col('y'); Ray draws a tree",
}
"""Known differences: a text in the failing example's source -> why."""
DOCSTRING_TIMEOUT_S = 90

# The stand-in ``ray`` package for the dataflow side: ray.data and its submodules are dataflow's.
SHIM = '''
import importlib, pkgutil, sys
import dataflow as _df
data = _df
sys.modules["ray.data"] = _df
for _info in pkgutil.walk_packages(_df.__path__, "dataflow."):
    if "._" in _info.name:
        continue
    try:
        sys.modules["ray.data." + _info.name[len("dataflow."):]] = importlib.import_module(_info.name)
    except ImportError:
        pass
def init(*args, **kwargs): return None
def shutdown(*args, **kwargs): return None
def is_initialized(): return True
'''


# ----------------------------------------------------------------------------------- one side


class _Recorder(doctest.DocTestRunner):
    """Keeps the examples that passed, and what each failing one printed or raised, keyed by
    its source."""

    def __init__(self) -> None:
        super().__init__(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
        self.passed: set[str] = set()
        self.failed: dict[str, str] = {}

    def report_success(self, out, test, example, got) -> None:
        self.passed.add(example.source.strip())

    def report_failure(self, out, test, example, got) -> None:
        self.failed[example.source.strip()] = "printed: " + got[:600]

    def report_unexpected_exception(self, out, test, example, exc_info) -> None:
        self.failed[example.source.strip()] = "raised: " + "".join(traceback.format_exception_only(*exc_info[:2]))[-600:]


def _on_alarm(signum, frame):
    raise TimeoutError(f"a docstring's examples ran past {DOCSTRING_TIMEOUT_S} s")


def run_side(path: str) -> dict:
    """name:line -> {"examples": [sources], "failed": {source: what happened}} for one module.
    Examples marked ``+SKIP`` are left out; one that did not pass (it failed, or never ran after
    a timeout) is failed."""
    tree = ast.parse(open(path).read())
    parser = doctest.DocTestParser()
    signal.signal(signal.SIGALRM, _on_alarm)
    results = {}
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        doc = ast.get_docstring(node, clean=True)
        if not doc or ">>>" not in doc:
            continue
        test = parser.get_doctest(doc, {}, node.name, path, node.lineno)
        runner = _Recorder()
        stopped = "did not run"
        signal.alarm(DOCSTRING_TIMEOUT_S)
        try:
            runner.run(test, out=lambda text: None)
        except TimeoutError as err:
            stopped = f"did not run: {err}"
        finally:
            signal.alarm(0)
        examples = [e.source.strip() for e in test.examples if not e.options.get(doctest.SKIP)]
        failed = {e: runner.failed.get(e, stopped) for e in examples if e not in runner.passed}
        results[f"{node.name}:{node.lineno}"] = {"examples": examples, "failed": failed}
    return results


# ----------------------------------------------------------------------------------- compare


def _run(side: str, path: str, shim_dir: str) -> dict:
    python = peers.python_for(side)
    env = peers.side_env(side)
    if side == "dataflow":
        env["PYTHONPATH"] = os.pathsep.join([shim_dir, env["PYTHONPATH"]])
    with tempfile.TemporaryDirectory() as cwd:  # (examples write files where they run)
        proc = subprocess.run([python, os.path.abspath(__file__), "--side", path], capture_output=True, text=True,
                              env=env, cwd=cwd, timeout=1800)
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_TAG):
            return json.loads(line[len(RESULT_TAG):])
    raise SystemExit(f"the {side} side failed on {path}:\n{proc.stderr[-3000:]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("modules", nargs="*", default=MODULES, help="modules of ray/data (default: all of them)")
    parser.add_argument("--side", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        print(RESULT_TAG + json.dumps(run_side(args.side)))
        return 0
    ray_python = peers.python_for("ray")
    if ray_python is None:
        raise SystemExit("no ray venv: run `bash benchmarks/setup_peers.sh ray` first")
    root = subprocess.run([ray_python, "-c", "import ray.data, os; print(os.path.dirname(ray.data.__file__))"],
                          capture_output=True, text=True, env=peers.side_env("ray"), check=True).stdout.strip()
    shim = tempfile.TemporaryDirectory()
    os.makedirs(os.path.join(shim.name, "ray"))
    with open(os.path.join(shim.name, "ray", "__init__.py"), "w") as f:
        f.write(SHIM)
    unexpected, known, totals = 0, set(), [0, 0, 0]
    for module in args.modules:
        path = os.path.join(root, module + ".py")
        ray, ours = _run("ray", path, shim.name), _run("dataflow", path, shim.name)
        counts = [0, 0, 0]  # examples, failing on Ray, failing only here
        for key, theirs in ray.items():
            failed_here = ours[key]["failed"] if key in ours else dict.fromkeys(theirs["examples"], "no result")
            counts[0] += len(theirs["examples"])
            counts[1] += len(theirs["failed"])
            for source in theirs["examples"]:
                if source in theirs["failed"] or source not in failed_here:
                    continue
                counts[2] += 1
                reason = next((text for text in KNOWN if text in source), None)
                if reason is not None:
                    known.add(reason)
                    continue
                unexpected += 1
                print(f"{module}.py, {key}:\n  >>> {source}\n  dataflow {failed_here[source]}")
        totals = [a + b for a, b in zip(totals, counts, strict=True)]
        print(f"{module}.py: {counts[0]} examples, {counts[1]} fail on Ray itself, "
              f"{counts[0] - counts[1] - counts[2]} of the {counts[0] - counts[1]} that pass there pass here", flush=True)
    print(f"all: {totals[0]} examples, {totals[1]} fail on Ray itself, "
          f"{totals[0] - totals[1] - totals[2]} of the {totals[0] - totals[1]} that pass there pass here")
    for text in sorted(known):
        print(f"known difference, examples with {text!r}: {KNOWN[text]}")
    print("every other example that passes on Ray passes here" if not unexpected else f"{unexpected} unexpected failures")
    shim.cleanup()
    return 1 if unexpected else 0


if __name__ == "__main__":
    sys.exit(main())
