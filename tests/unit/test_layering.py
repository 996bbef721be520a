"""Layering: ``dataflow`` reaches the engine only through its entry point and pure modules.

``dataflow`` must run on any backend (``engine.backend``), so it may never import the parts of
one backend: the multi-process session, its split transport, its store, executor or workers,
the in-process mode, nor a private name of the engine. The imports are read from the source
(``ast``), wherever they are: module level, inside functions, under ``TYPE_CHECKING``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

BACKEND_MODULES = (
    "engine.session",
    "engine.split_server",
    "engine.local",
    "engine.object_store",
    "engine.executor",
    "engine.execution",
    "engine.worker",
    "engine.worker_pool",
    "engine.forkserver",
    "engine.transport",
)
"""Parts of one backend (or of every backend's internals): only ``engine.runner`` may reach them."""

KNOWN_PRIVATE_IMPORTS: set[tuple[str, str]] = set()
"""(file, name) pairs allowed for now; the test below fails once an entry is no longer needed."""


def _imports(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """(line, dotted name) of every module or name imported anywhere in ``tree``; ``from a import
    b`` yields ``a.b`` (a module or a name of ``a``, either way what is reached)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                yield node.lineno, f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Call):  # importlib.import_module("engine.x"), __import__("engine.x")
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in ("import_module", "__import__") and node.args:
                first = node.args[0]
                if isinstance(first, ast.Constant) and isinstance(first.value, str):
                    yield node.lineno, first.value


def violations(source: str, filename: str) -> list[str]:
    """What ``source`` imports that a ``dataflow`` module must not."""
    found = []
    for line, name in _imports(ast.parse(source, filename)):
        if name != "engine" and not name.startswith("engine."):
            continue
        for module in BACKEND_MODULES:
            if name == module or name.startswith(module + "."):
                found.append(f"{filename}:{line}: imports {name} (a backend's internals; use engine.runner)")
                break
        else:
            if any(part.startswith("_") for part in name.split(".")) and (filename, name) not in KNOWN_PRIVATE_IMPORTS:
                found.append(f"{filename}:{line}: imports {name} (a private name of the engine)")
    return found


def _dataflow_files() -> list[Path]:
    files = sorted((ROOT / "dataflow").rglob("*.py"))
    assert len(files) > 10, files  # the walk found the package
    return files


def test_dataflow_reaches_the_engine_only_through_its_entry_point() -> None:
    found = []
    for path in _dataflow_files():
        found += violations(path.read_text(), path.relative_to(ROOT).as_posix())
    assert not found, "\n".join(found)


def test_known_private_imports_are_still_there() -> None:
    """An exception nobody needs anymore is removed, so it cannot hide a new import."""
    used = set()
    for path in _dataflow_files():
        rel = path.relative_to(ROOT).as_posix()
        used |= {(rel, name) for _, name in _imports(ast.parse(path.read_text(), rel))}
    assert KNOWN_PRIVATE_IMPORTS <= used, KNOWN_PRIVATE_IMPORTS - used


def test_the_check_sees_every_form_of_import() -> None:
    source = """
import engine.session
from engine import split_server, runner
from engine.object_store import read_block
from engine.runner import backend

def f():
    from engine.local import _STORE
    import engine.executor as ex
    from engine.block_format import _private

if TYPE_CHECKING:
    from engine.session import Session

def g():
    import importlib
    return importlib.import_module("engine.worker_pool")
"""
    found = violations(source, "example.py")
    named = sorted(line.split(": imports ")[1].split(" ")[0] for line in found)
    assert named == sorted([
        "engine.session",
        "engine.split_server",
        "engine.object_store.read_block",
        "engine.local._STORE",
        "engine.executor",
        "engine.block_format._private",
        "engine.session.Session",
        "engine.worker_pool",
    ]), found
    assert violations("from engine import runner\nfrom engine.runner import backend\nimport dataflow._x\n", "ok.py") == []


def test_split_policy_knows_no_transport() -> None:
    """``engine.split`` (the dealing policy and coordinator) is handed its transport by the
    backend; it never imports the multi-process one."""
    path = ROOT / "engine" / "split.py"
    names = [name for _, name in _imports(ast.parse(path.read_text(), str(path)))]
    assert not [name for name in names if name.startswith(("engine.split_server", "engine.session"))], names
