"""Whether a module keeps the format-module contract (:mod:`tokformats.core.format_module`): what the conformance
suite checks for every built-in format and every plugin."""

from __future__ import annotations

import inspect
from types import ModuleType

from .format_module import CAPABILITIES, FormatModule
from .protocol import Reader, Writer
from .registry import FormatDescriptor

__all__ = ["conformance_problems"]


def _members(protocol: type) -> list[str]:
    return sorted(
        name
        for name in {*getattr(protocol, "__annotations__", {}), *vars(protocol)}
        if not name.startswith("_") and name not in ("Capability",)
    )


def _arity_problem(module: ModuleType, protocol: type, name: str) -> str | None:
    """How the module's function ``name`` differs from the protocol's (positional parameters, keywords)."""
    ours = getattr(protocol, name, None)
    theirs = getattr(module, name, None)
    if not inspect.isfunction(ours):
        return None
    if not callable(theirs):
        return f"{name} is a {type(theirs).__name__}, not a function"
    expected = [p for p in inspect.signature(ours).parameters.values() if p.name != "self"]
    try:
        found = list(inspect.signature(theirs).parameters.values())
    except (TypeError, ValueError):
        return None  # a builtin or C function: nothing to compare
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    want = sum(p.kind in positional for p in expected)
    have = [p for p in found if p.kind in positional]
    takes_any = any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in found)
    required = sum(p.default is inspect.Parameter.empty for p in have)
    if not takes_any and (len(have) < want or required > want):
        return f"{name} takes {len(have)} positional parameter(s) ({required} required); the contract passes {want}"
    keywords = [p.name for p in expected if p.kind is inspect.Parameter.KEYWORD_ONLY]
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in found):
        return None
    accepts = {p.name for p in found}
    missing = [k for k in keywords if k not in accepts]
    if missing:
        return f"{name} does not take the keyword(s) {', '.join(missing)}"
    return None


def conformance_problems(module: ModuleType) -> list[str]:
    """What ``module`` lacks or gets wrong as a format module (empty when it conforms): the required members, the
    descriptor naming this module, and the shape of every capability it has part of."""
    problems = [f"it has no {name}" for name in ("DESCRIPTOR", "Reader") if not hasattr(module, name)]
    descriptor = getattr(module, "DESCRIPTOR", None)
    if isinstance(descriptor, FormatDescriptor) and descriptor.detectable and not hasattr(module, "detect"):
        problems.append("it has no detect, and its DESCRIPTOR says the format is detectable")
    if descriptor is not None and not isinstance(descriptor, FormatDescriptor):
        problems.append(f"DESCRIPTOR is a {type(descriptor).__name__}, not a FormatDescriptor")
    elif descriptor is not None and descriptor.module != module.__name__:
        problems.append(f"DESCRIPTOR names the module {descriptor.module!r}, not {module.__name__!r}")
    reader = getattr(module, "Reader", None)
    if reader is not None and not (isinstance(reader, type) and issubclass(reader, Reader)):
        problems.append("Reader is not a tokformats.Reader subclass")
    writer = getattr(module, "Writer", None)
    if writer is not None and not (isinstance(writer, type) and issubclass(writer, Writer)):
        problems.append("Writer is not a tokformats.Writer subclass")
    for protocol in (FormatModule, *CAPABILITIES):
        members = _members(protocol)
        present = [m for m in members if hasattr(module, m)]
        if present and len(present) < len(members) and protocol is not FormatModule:
            absent = sorted(set(members) - set(present))
            problems.append(f"it has {', '.join(present)} but not {', '.join(absent)} ({protocol.__name__})")
        for name in present:
            problem = _arity_problem(module, protocol, name)
            if problem:
                problems.append(problem)
    return problems
