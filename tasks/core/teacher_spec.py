"""The grammar of a teacher spec: one model, or members joined by ``+``, each optionally ``<weight>*<model>``.

Only the text is split here (store names need it in ``core``); :mod:`tasks.ml.teachers` gives the members'
weights their meaning and refuses bad ones.
"""

from __future__ import annotations

from typing import NamedTuple

SEPARATOR, WEIGHT = "+", "*"


class Member(NamedTuple):
    """One member of a spec as written: its model and its weight's text (``None`` when it has no ``*``)."""

    model: str
    weight: str | None


def split(spec: str) -> list[Member]:
    """The members of ``spec`` in order, stripped; a plain model spec is one member, taken as it is."""
    parts = [part.strip() for part in spec.split(SEPARATOR)]
    if len(parts) == 1:
        return [Member(parts[0], None)]
    return [_member(part) for part in parts]


def _member(part: str) -> Member:
    weight, star, model = part.partition(WEIGHT)
    return Member(model.strip(), weight.strip()) if star else Member(part, None)
