"""The one "did you mean" of every Foundry message: the valid name closest to a wrong one.

Edit distance alone picks badly among names that share a stem: for ``retry`` it prefers
``retry_on`` (the same five letters, then three more) to ``retries`` (one letter
changed, two added), and for ``thread`` any name of the right length. People mistype
names in predictable ways, so the candidates are tried in the order of those ways:

1. the same name in another case (``Queue`` for ``queue``);
2. the same name with one of its words in another number (``retry`` → ``retries``,
   ``thread`` → ``threads``, ``queues`` → ``queue``, ``retries_on`` → ``retry_on``);
3. the same name with its separators changed (``max-pending``, ``maxpending`` →
   ``max_pending``);
4. a name the word begins (``concurrency_limit`` → ``concurrency``) or that begins
   with the word (``idem`` → ``idempotent``; three letters at least, one such name only);
5. only then edit distance (:func:`difflib.get_close_matches`), for typos
   (``durabel`` → ``durable``).

A compound value — ``model="queue/thread"`` — is corrected part by part
(:func:`closest_path`), so the suggestion is a value that would be accepted
(``queue/threads``), not a fragment of one.

Imports nothing of Foundry: the declaration, configuration and CLI layers all use it.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = ["closest", "closest_path"]


def _forms(word: str) -> set[str]:
    """The other grammatical numbers of an English word, as written in identifiers."""
    forms = {word + "s", word + "es"}
    if word.endswith("y"):
        forms.add(word[:-1] + "ies")
    if word.endswith("ies"):
        forms.add(word[:-3] + "y")
    if word.endswith("es"):
        forms.add(word[:-2])
    if word.endswith("s"):
        forms.add(word[:-1])
    return forms


def _squashed(name: str) -> str:
    return name.lower().replace("_", "").replace("-", "").replace(" ", "")


def closest(word: str, candidates: Iterable[str], *, cutoff: float = 0.6) -> str | None:
    """The candidate ``word`` was most likely meant to be, or ``None`` when none is close.
    ``word`` itself is never suggested (the caller already knows it is wrong)."""
    names = [c for c in dict.fromkeys(candidates) if c != word]
    if not names or not word:
        return None
    lower = word.lower()
    by_lower = {c.lower(): c for c in names}
    if lower in by_lower:
        return by_lower[lower]
    segments = lower.split("_")
    for i, segment in enumerate(segments):  # one word of the name in another number
        for form in sorted(_forms(segment)):
            other = "_".join([*segments[:i], form, *segments[i + 1 :]])
            if other in by_lower:
                return by_lower[other]
    squashed = _squashed(word)
    for c in names:
        if _squashed(c) == squashed or _squashed(c) in {_squashed(f) for f in _forms(lower)}:
            return c
    begun = [c for c in names if lower.startswith(c.lower()) and len(c) >= 3]
    if begun:
        return max(begun, key=len)  # the longest name the word begins: the most specific
    if len(lower) >= 3:
        beginning = [c for c in names if c.lower().startswith(lower)]
        if len(beginning) == 1:
            return beginning[0]
    close = difflib.get_close_matches(lower, list(by_lower), n=1, cutoff=cutoff)
    return by_lower[close[0]] if close else None


def closest_path(value: str, parts: Iterable[Iterable[str]], *, sep: str = "/") -> str | None:
    """The accepted value closest to a compound ``value`` (``"queue/thread"``): each part
    corrected among its own candidates (``parts``: one iterable per position); ``None``
    when ``value`` has another number of parts or a part has no close candidate."""
    pieces = value.split(sep)
    choices = [list(p) for p in parts]
    if len(pieces) != len(choices):
        return None
    fixed: list[str] = []
    for piece, names in zip(pieces, choices, strict=True):
        if piece in names:
            fixed.append(piece)
            continue
        near = closest(piece, names)
        if near is None:
            return None
        fixed.append(near)
    out = sep.join(fixed)
    return None if out == value else out
