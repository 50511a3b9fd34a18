"""PNG pictures of one group of a :class:`ktae.viz.page.Report` (matplotlib, Agg).

One panel per view (sequence advantage, token credit, calibrated credit), each showing
every response as the text its tokens decode to (:func:`ktae.viz.text_layout.text_runs`),
in wrapped lines on a grid of monospace columns. Each token's characters sit on its
colour on the group's diverging scale; thin lines mark token boundaries; a character
split over tokens is drawn once over all their colours; a newline breaks the line after
a ``↵``; special tokens are drawn smaller and muted; flagged tokens are outlined.
Characters missing from matplotlib's monospace font (most emoji) are drawn as boxes. A
horizontal colour bar sits in its own axes under the panels, so nothing overlaps.
"""

from __future__ import annotations

import warnings
from functools import lru_cache

from ktae.viz.credit import colour
from ktae.viz.page import GroupReport, Report, ResponseReport
from ktae.viz.text_layout import TextRun, one_character_per_token, text_runs

FONT = 8.0
"""Token text size, in points; a column is one character of it."""
_ROW = 1.7  # a text line's height, in font sizes
_LABEL_COLUMNS = 14  # the column left of the text that names each response
_BOUNDARY = (0.0, 0.0, 0.0, 0.3)  # token boundary lines: faint on any colour
_MUTED = 0.6  # opacity of marks (↵, ·, ∅) and special tokens


@lru_cache(maxsize=8)
def _column_points(dpi: int) -> float:
    """The advance of one monospace character at :data:`FONT`, in points, as Agg draws
    it at ``dpi`` (hinting rounds advances to whole pixels, so it depends on ``dpi``)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(dpi=dpi)
    text = fig.text(0, 0, "0" * 100, fontsize=FONT, family="monospace")
    return text.get_window_extent(FigureCanvasAgg(fig).get_renderer()).width / 100 * 72 / dpi


def response_runs(resp: ResponseReport, width: int, max_lines: int, *,
                  mark_spaces: bool = False) -> tuple[list[TextRun], bool]:
    """The runs drawn for ``resp`` (:func:`~ktae.viz.text_layout.text_runs`): what the
    picture shows, as text, columns and lines."""
    return text_runs(resp.pieces, width=width, max_lines=max_lines, mark_spaces=mark_spaces)


def _prompt_header(label: str, prompt: str, columns: int, lines: int = 2) -> list[str]:
    """``label: prompt`` on at most ``lines`` lines of ``columns``, newlines as ``↵``;
    a longer one keeps its start and, at twice the length, its end (where a chat
    template puts the question) around ``…``."""
    text = f"{label}: " + prompt.replace("\r", "").replace("\n", "\u21b5 ")
    room = columns * lines
    if len(text) > room:
        head = room // 3
        text = text[:head] + " \u2026 " + text[len(text) - (room - head - 3):]
    return [text[i:i + columns] for i in range(0, len(text), columns)]


@lru_cache(maxsize=4096)
def on_grid(ch: str) -> bool:
    """True when matplotlib's monospace font draws ``ch`` one column wide (it has the glyph
    and ``ch`` is not a combining mark or a format character): such characters are drawn
    as whole lines of text; any other is drawn alone at its column."""
    import unicodedata

    from matplotlib.font_manager import FontProperties, findfont, get_font

    font = get_font(findfont(FontProperties(family="monospace")))
    return font.get_char_index(ord(ch)) != 0 and unicodedata.category(ch) not in ("Mn", "Me",
                                                                                 "Cf")


class _Panel:
    """What one panel draws, gathered so that long responses stay fast: coloured cells,
    boundary lines and outlines as three collections, and the characters of each line as
    one text per ink (black or white, plain or muted), on the column grid."""

    _HEIGHT = 0.85  # a cell's height, in lines

    def __init__(self, ax):
        self.ax, self.cells, self.colours, self.lines, self.outlines = ax, [], [], [], []
        self.layers: dict[tuple[float, str, float], dict[int, str]] = {}

    def _text(self, x: float, y: float, text: str, ink: str, alpha: float, **kw) -> None:
        self.ax.text(x, y + self._HEIGHT / 2, text, va="center", family="monospace", color=ink,
                     alpha=alpha, parse_math=False, **({"ha": "left", "fontsize": FONT} | kw))

    def run(self, run: TextRun, y: float, resp: ResponseReport, key: str, scale: float,
            flagged: bool, boundary: bool) -> None:
        h = self._HEIGHT
        n = len(run.tokens)
        for i, pos in enumerate(run.tokens):  # a split character: one strip per token
            x0, x1 = run.x + run.width * i / n, run.x + run.width * (i + 1) / n
            self.cells.append([(x0, y), (x1, y), (x1, y + h), (x0, y + h)])
            self.colours.append(tuple(c / 255 for c in colour(resp.values[key][pos], scale)))
            if i or boundary:
                self.lines.append([(x0, y), (x0, y + h)])
        if flagged:
            x0, x1 = run.x, run.x + run.width
            self.outlines.append([(x0, y), (x1, y), (x1, y + h), (x0, y + h)])
        value = resp.values[key][run.tokens[-1]]
        ink = "white" if abs(value) / scale > 0.6 else "black"
        if run.kind == "special":
            self._text(run.x + run.width / 2, y, run.text, ink, _MUTED, ha="center",
                       fontsize=FONT * 0.8, style="italic")
            return
        alpha = 1.0 if run.kind == "text" else _MUTED
        layer = self.layers.setdefault((y, ink, alpha), {})
        for i, ch in enumerate(run.text):
            if ch == " ":
                continue
            if on_grid(ch):
                layer[run.x + i] = ch
            else:
                self._text(run.x + i, y, ch, ink, alpha)

    def finish(self) -> None:
        from matplotlib.collections import LineCollection, PolyCollection

        self.ax.add_collection(PolyCollection(self.cells, facecolors=self.colours,
                                              edgecolors="none", zorder=1))
        self.ax.add_collection(LineCollection(self.lines, colors=[_BOUNDARY], linewidths=0.5,
                                              zorder=2))
        self.ax.add_collection(PolyCollection(self.outlines, facecolors="none",
                                              edgecolors="#111", linewidths=1.0, zorder=2))
        for (y, ink, alpha), chars in self.layers.items():
            if chars:
                first, last = min(chars), max(chars)
                line = "".join(chars.get(c, " ") for c in range(first, last + 1))
                self._text(first, y, line, ink, alpha)


def group_png(report: Report, group: GroupReport, path, *, width: int = 96,
              max_lines: int = 6, dpi: int = 130) -> None:
    """Write the picture of ``group`` to ``path`` (see the module docstring).

    ``width``: characters per text line (at most; narrower when every response is);
    ``max_lines``: lines per response and panel (longer responses are cut, marked ``…``).
    """
    for name, value in (("width", width), ("max_lines", max_lines), ("dpi", dpi)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}: expected a positive integer, got {value!r}")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import LinearSegmentedColormap, Normalize

    views = [(k, label) for k, label in report.views if k != "diff"]
    mark_spaces = one_character_per_token(p for g in report.groups for r in g.responses
                                          for p in r.pieces)
    longest = max((run.x + run.width for r in group.responses
                   for run in text_runs(r.pieces, mark_spaces=mark_spaces)[0]), default=1)
    width = max(24, min(width, longest + 1))
    layouts = [response_runs(r, width, max_lines, mark_spaces=mark_spaces)
               for r in group.responses]
    heights = [1 + max((run.line for run in runs), default=0) for runs, _ in layouts]
    panel_rows = 1.5 + sum(h + 0.6 for h in heights)  # title, then each response and a gap
    col_in = _column_points(dpi) / 72
    row_in = FONT * _ROW / 72
    columns = _LABEL_COLUMNS + width + 2
    fig_w = columns * col_in + 0.2
    header = _prompt_header(group.label, group.prompt, int(fig_w / (9 * 0.6 / 72)) - 4)
    head_in = 0.15 + 0.17 * len(header)
    bar_in = 0.95 if report.calibrated else 0.75  # the colour bar, and a note above it
    fig_h = head_in + len(views) * (panel_rows * row_in + 0.1) + bar_in
    fig = plt.figure(figsize=(fig_w, fig_h), dpi=dpi)
    try:
        fig.text(0.1 / fig_w, 1 - 0.1 / fig_h, "\n".join(header), fontsize=9,
                 family="monospace", va="top", parse_math=False)
        for v, (key, label) in enumerate(views):
            top = head_in + v * (panel_rows * row_in + 0.1)
            ax = fig.add_axes((0.1 / fig_w, 1 - (top + panel_rows * row_in) / fig_h,
                               columns * col_in / fig_w, panel_rows * row_in / fig_h))
            ax.set_xlim(-_LABEL_COLUMNS, width + 2)
            ax.set_ylim(panel_rows, 0)
            ax.axis("off")
            ax.text(-_LABEL_COLUMNS, 0.2, label, fontsize=9, fontweight="bold", va="top")
            panel = _Panel(ax)
            y = 1.5
            for resp, (runs, cut), h in zip(group.responses, layouts, heights, strict=True):
                mark = "ok" if resp.correct else "x"
                ax.text(-_LABEL_COLUMNS, y + 0.45, f"#{resp.index} {mark} r={resp.reward:.3g}",
                        fontsize=FONT * 0.8, family="monospace", va="center",
                        color="#1a7f37" if resp.correct else "#cf222e")
                for i, run in enumerate(runs):
                    before = runs[i - 1] if i else None
                    boundary = (before is not None and before.line == run.line
                                and before.tokens[-1] != run.tokens[0])
                    flagged = key == "final" and resp.flagged is not None and any(
                        resp.flagged[p] for p in run.tokens)
                    panel.run(run, y + run.line, resp, key, group.scale, flagged, boundary)
                if cut:
                    ax.text(width + 0.3, y + h - 0.55, "\u2026", fontsize=FONT, va="center")
                y += h + 0.6
            panel.finish()
        cax = fig.add_axes((0.3, 0.3 / fig_h, 0.4, 0.14 / fig_h))
        cmap = LinearSegmentedColormap.from_list(
            "ktae_credit", [tuple(c / 255 for c in colour(s, 1.0)) for s in (-1.0, 0.0, 1.0)])
        sm = plt.cm.ScalarMappable(norm=Normalize(-group.scale, group.scale), cmap=cmap)
        cb = fig.colorbar(sm, cax=cax, orientation="horizontal")
        cb.ax.tick_params(labelsize=7)
        cax.set_title("advantage", fontsize=7)
        if report.calibrated:
            fig.text(0.1 / fig_w, 0.78 / fig_h, "outlined: flagged by the calibration", fontsize=7)
        with warnings.catch_warnings():  # characters missing from the font show as boxes
            warnings.filterwarnings("ignore", message="Glyph .* missing from font")
            fig.savefig(path, dpi=dpi)
    finally:
        plt.close(fig)
