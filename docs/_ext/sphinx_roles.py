"""A griffe extension for the API pages: Sphinx roles in docstrings become markdown code spans.

The docstrings cross-reference with Sphinx roles (``:func:`learners.trainer.train```, ``:class:`~x.Y```),
which mkdocstrings renders as literal text ("``:func:``" and backticks on the page). Each role becomes the
code span of its target (with ``~``: the last component, as Sphinx shows it), so the pages read cleanly;
``tests/test_docs.py`` fails if a built page still holds a role.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:func|meth|class|mod|data|attr|exc|obj|const|ref|doc|term):`(~?)([^`<]*?)(?:\s*<([^`>]*)>)?`")


def plain(text: str) -> str:
    """``:role:`target``` -> ```target```; ``:role:`~a.b.c``` -> ```c```; ``:role:`title <target>``` -> ```title```."""

    def sub(m: re.Match[str]) -> str:
        tilde, target, _ = m.group(1), m.group(2).strip(), m.group(3)
        if tilde:
            target = target.rsplit(".", 1)[-1]
        return f"`{target}`"

    return ROLE.sub(sub, text)


class SphinxRoles(griffe.Extension):
    """Rewrite every docstring griffe loads (modules, classes, functions, attributes)."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:  # type: ignore[override]
        if obj.docstring is not None and ":" in obj.docstring.value:
            obj.docstring.value = plain(obj.docstring.value)
