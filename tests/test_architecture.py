"""The package's shape: no import cycles, layers that import only downward (import-linter), function size budget,
the format-module contract for every registered format, the public names of the README, and the 0.1 module paths
kept for one release."""

from __future__ import annotations

import ast
import collections.abc
import importlib
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import tokformats
from tokformats._moved import MOVED
from tokformats.core.conformance import conformance_problems
from tokformats.core.registry import formats, load_plugins

PACKAGE = Path(tokformats.__file__).parent
ROOT = PACKAGE.parent


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _runtime_imports(path: Path, modules: set[str]) -> set[str]:
    """The package modules ``path`` imports when it runs (module level or inside functions; not the imports under
    ``if TYPE_CHECKING:``, which never run)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    typing_only = {
        id(node)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
        for node in ast.walk(block)
    }
    found = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - (node.level - 1)] if node.level else []
            target = ".".join([*base, *([node.module] if node.module else [])])
            for alias in node.names:
                full = f"{target}.{alias.name}"
                found.add(full if full in modules else target)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {m for m in found if m in modules and m != name}


def _import_graph() -> dict[str, set[str]]:
    paths = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {name: _runtime_imports(path, set(paths)) for name, path in paths.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_package_has_no_import_cycle() -> None:
    graph = _import_graph()
    assert len(graph) > 50 and sum(map(len, graph.values())) > 150  # the graph was read, not empty
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_layers_import_only_downward() -> None:
    if shutil.which("lint-imports") is None:
        pytest.skip("import-linter is not installed (pip install import-linter); CI runs lint-imports")
    result = subprocess.run(["lint-imports"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "0 broken" in result.stdout


def _function_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines of a function without its docstring."""
    lines = (node.end_lineno or node.lineno) - node.lineno + 1
    first = node.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        lines -= (first.end_lineno or first.lineno) - first.lineno + 1
    return lines


def test_no_library_function_is_longer_than_80_lines() -> None:
    long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _function_lines(node) > 80:
                long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({_function_lines(node)} lines)")
    assert long == []


def test_no_library_assert() -> None:
    """Checks in the library are real checks: an ``assert`` vanishes under ``python -O``."""
    found = [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name != "testing.py"  # the conformance suite is tests, for pytest
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Assert)
    ]
    assert found == []


def test_no_module_is_named_after_a_standard_library_module() -> None:
    clashes = [
        str(path.relative_to(ROOT))
        for path in PACKAGE.rglob("*.py")
        if path.stem in sys.stdlib_module_names and path.stem not in ("__init__", "__main__")
    ]
    assert clashes == []


def test_every_registered_format_keeps_the_module_contract() -> None:
    load_plugins()
    problems = {name: conformance_problems(entry.load()) for name, entry in formats.items()}
    assert {name: found for name, found in problems.items() if found} == {}
    assert len(problems) >= 11


def test_a_module_that_breaks_the_contract_is_told_what_it_lacks() -> None:
    import types

    module = types.ModuleType("broken_plugin")
    module.DESCRIPTOR = tokformats.FormatDescriptor("broken", "x", (".x",), "other.module")  # type: ignore[attr-defined]
    module.REMOTE_INDEX = ("index.json",)  # type: ignore[attr-defined]
    module.merge = lambda sources: None  # type: ignore[attr-defined]
    found = conformance_problems(module)
    assert "it has no Reader" in found
    assert "it has no detect, and its DESCRIPTOR says the format is detectable" in found
    assert "DESCRIPTOR names the module 'other.module', not 'broken_plugin'" in found
    assert any("REMOTE_INDEX but not remote_files" in p for p in found)
    assert any(p.startswith("merge takes 1 positional parameter") for p in found)


def test_formats_is_the_package_and_the_table() -> None:
    import tokformats.formats as package
    import tokformats.formats.megatron

    assert package is tokformats.formats
    assert isinstance(package, collections.abc.Mapping)
    assert tokformats.formats.megatron.DESCRIPTOR is tokformats.formats["megatron"]
    assert list(tokformats.formats) == list(formats) and dict(tokformats.formats.items()) == dict(formats)
    assert "llmc" in tokformats.formats and tokformats.formats.get("nope") is None
    assert tokformats.llmc.Vocab is tokformats.formats.llmc_vocab.Vocab


@pytest.mark.parametrize("old", sorted(MOVED))
def test_old_module_paths_import_with_a_deprecation_warning(old: str) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sys.modules.pop(old, None)
        module = importlib.import_module(old)
    assert module is importlib.import_module(MOVED[old])
    assert module.__spec__ is not None and module.__spec__.name == MOVED[old]  # relative imports inside still work
    assert any(issubclass(w.category, DeprecationWarning) and MOVED[old] in str(w.message) for w in caught)


def _readme_names() -> set[str]:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    names = set(re.findall(r"\btokformats(?:\.[A-Za-z_][A-Za-z0-9_]*)+", readme))
    for module, imported in re.findall(r"from (tokformats[\w.]*) import ([\w, ]+)", readme):
        names.update(f"{module}.{name.split(' as ')[0].strip()}" for name in imported.split(",") if name.strip())
    return names


def test_every_public_name_the_readme_shows_resolves() -> None:
    missing = []
    for dotted in sorted(_readme_names()):
        if dotted.endswith((".py", ".md", ".json")) or ".NAME" in dotted:
            continue
        parts = dotted.split(".")
        try:
            found: object = importlib.import_module(parts[0])
            for k, part in enumerate(parts[1:], start=1):
                try:
                    found = getattr(found, part)
                except AttributeError:
                    found = importlib.import_module(".".join(parts[: k + 1]))
        except (AttributeError, ImportError):
            missing.append(dotted)
    assert missing == []


def test_an_open_completes_a_killed_writers_commit_once_per_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tokformats.fs import journal

    with tokformats.create(tmp_path / "a", "megatron", vocab_size=100) as writer:
        writer.write([1, 2, 3])
    calls: list[Path] = []
    original = journal.recover
    monkeypatch.setattr(journal, "recover", lambda folder: (calls.append(Path(folder)), original(folder))[1])
    with tokformats.open(tmp_path / "a") as reader:
        assert reader[0].tolist() == [1, 2, 3]
    assert calls == [tmp_path]
