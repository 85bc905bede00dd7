"""Griffe extension: show the package's Sphinx-style roles as Markdown code.

Docstrings say ``:func:`select``` or ``:class:`~tfstrategy.errors.ScopeError```
(read fine in ``help()`` and editors); mkdocstrings renders Markdown, so each
role becomes a code span of the name (the ``~`` form: its last part).
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:func|class|meth|mod|data|attr|exc|obj):`(~?)([^`]+)`")


def _code(match: re.Match[str]) -> str:
    name = match.group(2)
    return f"`{name.rsplit('.', 1)[-1] if match.group(1) else name}`"


class SphinxRoles(griffe.Extension):
    def on_instance(self, *, node: Any, obj: griffe.Object, agent: Any, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = ROLE.sub(_code, obj.docstring.value)
