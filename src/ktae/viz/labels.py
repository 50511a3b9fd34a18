"""Per-character local-error labels from user-given spans.

A JSONL group may mark, per response, the ``[start, end)`` character spans that are
locally wrong (``wrong``) and those that were judged at all (``checked``). ``ktae explain``
outlines them on its page and ``ktae audit`` scores each credit method against them; both
read them here. Labels: ``"w"`` wrong, ``"r"`` right, ``"."`` not judged.
"""

from __future__ import annotations


def _spans(value, text: str, what: str, where: str) -> list[tuple[int, int]]:
    if not isinstance(value, list):
        raise ValueError(f"{where}: expected '{what}' spans as a list of [start, end] pairs")
    spans = []
    for span in value:
        ok = (isinstance(span, list) and len(span) == 2
              and all(isinstance(x, int) and not isinstance(x, bool) for x in span))
        if not ok:
            raise ValueError(f"{where}: expected '{what}' spans as [start, end] integer pairs, "
                             f"got {span!r}")
        start, end = span
        if not 0 <= start < end <= len(text):
            raise ValueError(f"{where}: '{what}' span [{start}, {end}] lies outside the "
                             f"response's {len(text)} characters (expected 0 <= start < end "
                             f"<= {len(text)})")
        spans.append((start, end))
    return spans


def span_labels(text: str, wrong: list, checked: list | None, where: str) -> str:
    """Per-character labels from user spans: wrong inside ``wrong``, right elsewhere in
    ``checked`` (None: the whole text), not judged outside it.

    Raises:
        ValueError: a span that is not an integer pair inside ``text``, naming ``where``.
    """
    chars = ["r" if checked is None else "."] * len(text)
    for start, end in (_spans(checked, text, "checked", where) if checked is not None else ()):
        chars[start:end] = "r" * (end - start)
    for start, end in _spans(wrong, text, "wrong", where):
        chars[start:end] = "w" * (end - start)
    return "".join(chars)
