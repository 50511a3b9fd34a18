"""A response's tokens laid out as the text they decode to, for the PNG and terminal views.

:func:`text_runs` turns the :class:`~ktae.viz.tokens.TokenPiece` of a response into
:class:`TextRun` stretches on a grid of lines and columns (one column per character):

* the text reads as the tokenizer decodes it: a token that starts with a space is drawn
  with that space and nothing else between it and the previous token;
* a character whose bytes are split over several tokens is drawn once, as a run that
  names all those tokens (``TokenPiece.lead``);
* a newline ends the line after a visible mark (``↵``); a tab and a carriage return are
  drawn as marks (``→``, ``←``);
* a special token (``<|im_end|>``, ``<eos>``) is one run of kind ``"special"``, never
  split, and a token with no text of its own is drawn as ``∅``;
* with ``mark_spaces`` (one character per token, as the shipped character-level
  model), spaces are drawn as ``·``, since each token is then a cell of its own.

Renderers mark token boundaries themselves (thin lines in the PNG, alternating
underline in the terminal), from which tokens each run draws.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ktae.viz.tokens import TokenPiece

NEWLINE_MARK = "\u21b5"
EMPTY_MARK = "\u2205"
SPACE_MARK = "\u00b7"
_MARKS = {"\t": "\u2192", "\r": "\u2190"}


@dataclass(frozen=True)
class TextRun:
    """One stretch of a drawn response: ``text`` on line ``line`` from column ``x``,
    ``width`` columns wide (``len(text)``).

    ``tokens``: the positions of the tokens it draws (several for one character whose
    bytes are split over tokens). ``kind``: ``"text"``; ``"mark"`` (a drawn stand-in:
    ``↵`` before a line break, ``→``, ``←``, and ``·`` for spaces with ``mark_spaces``);
    ``"special"`` (a special token's text); ``"empty"`` (``∅``, a token with no text).
    """

    text: str
    tokens: tuple[int, ...]
    line: int
    x: int
    width: int
    kind: str = "text"


def one_character_per_token(pieces: Iterable[TokenPiece]) -> bool:
    """True when no token other than a special one holds more than one character (the
    shipped character-level tokenizer)."""
    return all(len(p.text) <= 1 for p in pieces if not p.special)


def _segments(pieces: Sequence[TokenPiece], mark_spaces: bool) -> list[list[tuple]]:
    """Per token to draw: ``[(text, tokens, kind, breaks_line)]`` in reading order.

    Tokens whose bytes only start a character drawn by a later token get no segment
    of their own (their position is in that character's ``tokens``).
    """
    covered = {k - j for k, p in enumerate(pieces) if p.text for j in range(1, p.lead + 1)}
    out = []
    for k, p in enumerate(pieces):
        if p.special:
            out.append([(p.text or EMPTY_MARK, (k,), "special", False)])
            continue
        if not p.text:
            if k not in covered:
                out.append([(EMPTY_MARK, (k,), "empty", False)])
            continue
        segs: list[tuple] = []
        text = p.text
        if p.lead:  # the first character began in earlier tokens
            segs.append((text[0], tuple(range(k - p.lead, k + 1)), "text", False))
            text = text[1:]
        for ch in text:
            if ch == "\n":
                segs.append((NEWLINE_MARK, (k,), "mark", True))
            elif ch in _MARKS or (mark_spaces and ch == " "):
                segs.append((_MARKS.get(ch, SPACE_MARK), (k,), "mark", False))
            elif segs and segs[-1][2] == "text" and segs[-1][1] == (k,):
                segs[-1] = (segs[-1][0] + ch, (k,), "text", False)
            else:
                segs.append((ch, (k,), "text", False))
        out.append(segs)
    return out


def text_runs(pieces: Sequence[TokenPiece], *, width: int | None = None,
              max_lines: int | None = None, mark_spaces: bool = False
              ) -> tuple[list[TextRun], bool]:
    """Lay out one response's ``pieces`` (see the module docstring).

    Args:
        pieces: the response's :class:`~ktae.viz.tokens.TokenPiece` list.
        width: columns per line (None: lines break at newlines only). A token that does
            not fit on what is left of a line starts the next one; a token longer than a
            line is split over lines (a special token is cut to ``width``).
        max_lines: lines kept (None: all); the rest is cut.
        mark_spaces: draw spaces as ``·`` (one character per token).

    Returns:
        ``(runs, cut)``: the runs in reading order and whether lines were cut.

    Raises:
        ValueError: ``width`` or ``max_lines`` not a positive integer.
    """
    for name, value in (("width", width), ("max_lines", max_lines)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 1):
            raise ValueError(f"{name}: expected a positive integer or None, got {value!r}")
    runs: list[TextRun] = []
    line = x = 0

    def new_line() -> bool:
        nonlocal line, x
        line, x = line + 1, 0
        return max_lines is not None and line >= max_lines

    for segs in _segments(pieces, mark_spaces):
        first = 0  # the token's width up to its first line break decides the wrap
        for text, _, _, breaks in segs:
            first += len(text)
            if breaks:
                break
        if width is not None and x > 0 and x + first > width and new_line():
            return runs, True
        for text, tokens, kind, breaks in segs:
            if kind == "special" and width is not None:
                text = text[:width]
            while text:
                room = len(text) if width is None else width - x
                if room <= 0:  # only a token longer than a line gets here
                    if new_line():
                        return runs, True
                    continue
                part, text = text[:room], text[room:]
                runs.append(TextRun(part, tokens, line, x, len(part), kind))
                x += len(part)
            if breaks and new_line():
                return runs, True
    return runs, False
