"""A griffe extension for the API pages: the docstrings are plain Google style with a little reST, rendered here as
markdown. ``:class:`~a.b.C``` and the other Sphinx roles become code spans (``C``), a paragraph ending in ``::``
ends in ``:`` (its indented block is code in markdown too), and ``.. code-block::`` lines are dropped."""

from __future__ import annotations

import re

import griffe

_ROLE = re.compile(r":(?:func|class|mod|meth|attr|data|obj|exc):`(~?)([^`]+)`")


def _role(match: re.Match) -> str:
    short, target = match.group(1), match.group(2)
    return f"`{target.rsplit('.', 1)[-1] if short else target}`"


def rst_to_markdown(text: str) -> str:
    """The reST bits of a docstring as markdown (see the module docstring)."""
    text = _ROLE.sub(_role, text)
    text = re.sub(r"^[ \t]*\.\. code-block::.*\n", "", text, flags=re.M)
    return re.sub(r"(\S)::[ \t]*$", r"\1:", text, flags=re.M)


class RstRoles(griffe.Extension):
    """Rewrites every loaded object's docstring with :func:`rst_to_markdown`."""

    def on_object(self, *, obj, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = rst_to_markdown(obj.docstring.value)
