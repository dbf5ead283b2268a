"""How a count reads in a message: ``plural(1, "edge")`` is ``"1 edge"``, ``plural(2, "edge")`` is ``"2 edges"``."""

from __future__ import annotations

__all__ = ["plural"]


def plural(n: int, one: str, many: str | None = None) -> str:
    """``n`` and the words that go with it: ``one`` when ``n == 1``, else ``many``.

    Args:
        n: the count.
        one: the words for one, e.g. ``"edge"``, or ``"edge is"`` when a verb must agree.
        many: the words for any other count; None: ``one + "s"`` (give it for irregular nouns, ``"vertices"``, and
            for verbs, ``"edges are"``).

    Returns:
        ``f"{n} {one}"`` or ``f"{n} {many}"``.
    """
    return f"{n} {one}" if n == 1 else f"{n} {one + 's' if many is None else many}"
