"""The registry of accessors: which upstream objects each ``_compat`` function reaches, and whether they resolve.

Every function of ``_compat`` that reads or writes a private TensorFlow/Keras
name is decorated with :func:`accessor`, naming the upstream objects it needs
as ``"module:Qualified.name"``. :func:`accessor_status` checks each name without
calling anything upstream (so without starting TensorFlow's runtime): it imports
the module (only if asked to), walks the attribute path, and accepts an
instance attribute when the owner's code names it (``self._name = ...``).

Spec forms: ``"a | b"`` resolves if either does (Keras 3 or tf_keras), and a
trailing ``?`` marks a name some supported releases lack (the accessor copes).
"""

from __future__ import annotations

import importlib
import inspect
import sys
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

__all__ = ["AccessorStatus", "accessor", "accessor_status", "accessor_summary", "registered_accessors"]

F = TypeVar("F", bound=Callable[..., object])

#: name -> the upstream specs it needs, in registration order.
_REGISTRY: dict[str, tuple[str, ...]] = {}


def accessor(*upstream: str) -> Callable[[F], F]:
    """Register the decorated function as an accessor of the ``upstream`` names (``"module:Qualified.name"``)."""
    if not upstream:
        raise ValueError("Received no upstream name; expected at least one 'module:Qualified.name'.")

    def register(function: F) -> F:
        _REGISTRY[function.__name__] = upstream
        return function

    return register


def registered_accessors() -> dict[str, tuple[str, ...]]:
    """Every registered accessor and the upstream names it needs."""
    return dict(_REGISTRY)


@dataclass(frozen=True, kw_only=True)
class AccessorStatus:
    """Whether one accessor's upstream names resolve on this install."""

    name: str
    upstream: tuple[str, ...]
    #: True: every name resolves; False: one is missing; None: a module was not imported, so not checked.
    resolved: bool | None
    detail: str = ""

    def state(self) -> str:
        """``resolved``, ``MISSING (what)`` or ``not checked (why)``."""
        state = "not checked" if self.resolved is None else "resolved" if self.resolved else "MISSING"
        return state + (f" ({self.detail})" if self.detail else "")

    def line(self) -> str:
        """``name: state``."""
        return f"{self.name}: {self.state()}"


def accessor_status(*, import_modules: bool = False) -> list[AccessorStatus]:
    """Check every registered accessor's upstream names, without calling upstream code.

    Args:
        import_modules: import the modules named (TensorFlow, Keras internals); when
            false, a name in a module not imported yet is reported as not checked.
    """
    statuses = []
    for name, specs in _REGISTRY.items():
        results = [_check_spec(spec, import_modules) for spec in specs]
        missing = [detail for ok, detail in results if ok is False]
        unchecked = [detail for ok, detail in results if ok is None]
        notes = [detail for ok, detail in results if ok is True and detail]
        if missing:
            statuses.append(AccessorStatus(name=name, upstream=specs, resolved=False, detail="; ".join(missing)))
        elif unchecked:
            statuses.append(AccessorStatus(name=name, upstream=specs, resolved=None, detail="; ".join(unchecked)))
        else:
            statuses.append(AccessorStatus(name=name, upstream=specs, resolved=True, detail="; ".join(notes)))
    return statuses


def accessor_summary(statuses: list[AccessorStatus]) -> str:
    """One line: how many accessors resolve, which are missing, how many were not checked."""
    resolved = sum(1 for status in statuses if status.resolved)
    missing = [status.name for status in statuses if status.resolved is False]
    unchecked = sum(1 for status in statuses if status.resolved is None)
    text = f"{resolved} of {len(statuses)} accessors resolve"
    if missing:
        text += f"; MISSING: {', '.join(missing)}"
    if unchecked:
        text += f"; {unchecked} not checked (their modules are not imported; tfstrategy env --compat checks them)"
    return text


def _check_spec(spec: str, import_modules: bool) -> tuple[bool | None, str]:
    """One spec (alternatives split on ``|``): resolved if any alternative is."""
    optional = spec.endswith("?")
    alternatives = [part.strip() for part in spec.rstrip("?").split("|")]
    results = [_check_name(part, import_modules) for part in alternatives]
    if any(ok for ok, _ in results):
        return True, ""
    if any(ok is None for ok, _ in results):
        return None, " or ".join(detail for ok, detail in results if ok is None)
    if optional:
        return True, f"{spec.rstrip('?')} absent (optional)"
    return False, " or ".join(detail for _, detail in results)


def _check_name(name: str, import_modules: bool) -> tuple[bool | None, str]:
    module_name, _, path = name.partition(":")
    module = sys.modules.get(module_name)
    if module is None:
        if not import_modules:
            return None, f"{module_name} not imported"
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            return False, f"no module {module_name}"
    value: Any = module
    parts = path.split(".") if path else []
    for index, part in enumerate(parts):
        if hasattr(value, part):
            value = getattr(value, part)
        elif index == len(parts) - 1 and part in _names_in_code(value):
            return True, ""  # an attribute its instances get, or a closure inside a function
        else:
            return False, f"no {name}"
    return True, ""


def _names_in_code(owner: object) -> set[str]:
    """Attribute, string-constant and nested-function names in the code of ``owner`` (a class or a function)."""
    functions: list[object] = []
    if inspect.isclass(owner):
        for klass in inspect.getmro(owner):
            for member in vars(klass).values():
                if isinstance(member, (staticmethod, classmethod)):
                    member = member.__func__
                if isinstance(member, property):
                    functions.extend(f for f in (member.fget, member.fset) if f is not None)
                elif inspect.isfunction(member):
                    functions.append(member)
    elif callable(owner):
        functions.append(inspect.unwrap(owner))
    names: set[str] = set()
    for function in functions:
        code = getattr(function, "__code__", None)
        if isinstance(code, types.CodeType):
            names.update(_code_names(code))
    return names


def _code_names(code: types.CodeType) -> Iterator[str]:
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, str):
            yield const
        elif isinstance(const, types.CodeType):
            yield const.co_name
            yield from _code_names(const)
