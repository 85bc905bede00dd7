"""YAML text of JSON-like values (dicts, lists, strings, ints, bools), without a YAML library.

The manifests are plain data, so block-style YAML is a few rules: a string is written
bare only when YAML would read it back as the same string, else as a JSON string (JSON's
double-quoted strings are YAML's too). ``tests/kubernetes`` reads every generated text
back with PyYAML and compares it with the data.

Why not PyYAML here: ``tfstrategy k8s`` runs wherever tfstrategy is installed, without
TensorFlow and with ``packaging`` its one dependency; PyYAML would make it a second one,
or put the command behind a ``k8s`` extra, for these sixty lines over plain data (the
manifests hold only dicts, lists, strings, integers and booleans). PyYAML stays the
judge: the tests read every text back with it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence

__all__ = ["dump", "dump_all"]

_PLAIN = re.compile(r"^[A-Za-z_/][A-Za-z0-9_./-]*$")
#: Words YAML 1.1 (PyYAML) or 1.2 reads as booleans or null.
_KEYWORDS = frozenset({"y", "n", "yes", "no", "on", "off", "true", "false", "null", "nan", "inf"})


def _scalar(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        if _PLAIN.match(value) and value.lower() not in _KEYWORDS:
            return value
        return json.dumps(value)
    raise TypeError(f"Received {type(value).__name__} {value!r}; expected a dict, list, str, int or bool.")


def _lines(value: object, indent: int) -> list[str]:
    pad = " " * indent
    if isinstance(value, Mapping):
        if not value:
            return [pad + "{}"]
        lines = []
        for key, item in value.items():
            head = f"{pad}{_scalar(str(key))}:"
            if isinstance(item, (Mapping, list, tuple)) and item:
                lines.append(head)
                lines.extend(_lines(item, indent + 2))
            else:
                lines.append(f"{head} {_inline(item)}")
        return lines
    if isinstance(value, Sequence) and not isinstance(value, str):
        if not value:
            return [pad + "[]"]
        lines = []
        for item in value:
            if isinstance(item, (Mapping, list, tuple)) and item:
                nested = _lines(item, indent + 2)
                lines.append(f"{pad}- {nested[0].lstrip()}")
                lines.extend(nested[1:])
            else:
                lines.append(f"{pad}- {_inline(item)}")
        return lines
    return [pad + _scalar(value)]


def _inline(value: object) -> str:
    if isinstance(value, Mapping):
        return "{}"
    if isinstance(value, (list, tuple)):
        return "[]"
    return _scalar(value)


def dump(document: Mapping[str, object]) -> str:
    """One document as block-style YAML text ending in a newline."""
    return "\n".join(_lines(document, 0)) + "\n"


def dump_all(documents: Sequence[Mapping[str, object]]) -> str:
    """Several documents separated by ``---``, as ``kubectl apply -f`` reads them."""
    return "---\n".join(dump(document) for document in documents)
