"""PNG pictures of one group of a :class:`ktae.viz.page.Report` (matplotlib, Agg).

One panel per view (sequence advantage, token credit, calibrated credit), each showing
every response as wrapped lines of token cells coloured on the group's diverging scale,
cells as wide as their text; flagged tokens are outlined. Characters missing from
matplotlib's monospace font (most emoji) are drawn as boxes. A horizontal colour bar sits
in its own axes under the panels, so nothing overlaps.
"""

from __future__ import annotations

import warnings

from ktae.viz.credit import colour
from ktae.viz.page import GroupReport, Report

_LINE = 1.5  # height of a token line, in character widths


def _cells(resp, width: int, max_lines: int):
    """``[(line, x, w, pos, text)]`` for the tokens of ``resp``; True if cut."""
    cells, line, x = [], 0, 0
    for pos, piece in enumerate(resp.pieces):
        text = piece.text.replace("\n", "\u21b5").replace("\t", "\u2192") if piece.text else (
            piece.raw.hex() if piece.raw else "\u2205")
        w = max(1, len(text))
        if x + w > width and x > 0:
            line, x = line + 1, 0
            if line >= max_lines:
                return cells, True
        cells.append((line, x, min(w, width), pos, text[:width]))
        x += w
    return cells, False


def group_png(report: Report, group: GroupReport, path, *, width: int = 96,
              max_lines: int = 6, dpi: int = 130) -> None:
    """Write the picture of ``group`` to ``path``.

    ``width``: characters per token line; ``max_lines``: lines per response and panel
    (longer responses are cut, marked ``…``).
    """
    for name, value in (("width", width), ("max_lines", max_lines), ("dpi", dpi)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}: expected a positive integer, got {value!r}")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import LinearSegmentedColormap, Normalize
    from matplotlib.patches import Rectangle

    views = [(k, label) for k, label in report.views if k != "diff"]
    longest = max((sum(max(1, len(p.text)) for p in r.pieces) for r in group.responses), default=1)
    width = max(24, min(width, longest))
    layouts = [_cells(r, width, max_lines) for r in group.responses]
    rows = sum(1.5 + max((c[0] for c in cells), default=0) for cells, _ in layouts)
    panel_h = rows * _LINE + 1.5
    char_in = 0.085
    fig_h = 0.6 + len(views) * panel_h * char_in * 1.25 + 1.0
    fig = plt.figure(figsize=(width * char_in + 1.4, fig_h))
    try:
        top = 1 - 0.45 / fig_h
        fig.text(0.01, top + 0.2 / fig_h, f"{group.label}: {group.prompt}"[:140], fontsize=9,
                 family="monospace", va="bottom")
        bar_h = 0.8 / fig_h
        avail = top - bar_h - 0.45 / fig_h
        h = avail / len(views)
        for v, (key, label) in enumerate(views):
            ax = fig.add_axes((0.01, top - (v + 1) * h, 0.98, h * 0.95))
            ax.set_xlim(-12, width + 1)
            ax.set_ylim(panel_h, 0)
            ax.axis("off")
            ax.text(-12, 0.2, label, fontsize=9, fontweight="bold", va="top")
            y = 1.5
            for resp, (cells, cut) in zip(group.responses, layouts, strict=True):
                mark = "ok" if resp.correct else "x"
                ax.text(-12, y + 0.7, f"#{resp.index} {mark} r={resp.reward:.3g}", fontsize=6.5,
                        family="monospace", va="center",
                        color="#1a7f37" if resp.correct else "#cf222e")
                for line, x, w, pos, text in cells:
                    val = resp.values[key][pos]
                    rgb = tuple(c / 255 for c in colour(val, group.scale))
                    flagged = resp.flagged is not None and resp.flagged[pos] and key == "final"
                    ax.add_patch(Rectangle((x, y + line * _LINE), w, _LINE * 0.85, facecolor=rgb,
                                           edgecolor="#111" if flagged else "white",
                                           linewidth=1.0 if flagged else 0.3))
                    ax.text(x + w / 2, y + line * _LINE + _LINE * 0.43, text, ha="center",
                            va="center", fontsize=6.5, family="monospace", parse_math=False,
                            color="white" if abs(val) / group.scale > 0.6 else "black")
                n_lines = 1 + max((c[0] for c in cells), default=0)
                if cut:
                    ax.text(width + 0.3, y + (n_lines - 1) * _LINE + 0.6, "\u2026", fontsize=8)
                y += (n_lines + 0.5) * _LINE
        cax = fig.add_axes((0.3, 0.25 / fig_h, 0.4, 0.16 / fig_h))
        cmap = LinearSegmentedColormap.from_list(
            "ktae_credit", [tuple(c / 255 for c in colour(s, 1.0)) for s in (-1.0, 0.0, 1.0)])
        sm = plt.cm.ScalarMappable(norm=Normalize(-group.scale, group.scale), cmap=cmap)
        cb = fig.colorbar(sm, cax=cax, orientation="horizontal")
        cb.ax.tick_params(labelsize=7)
        cax.set_title("advantage", fontsize=7)
        if report.calibrated:
            fig.text(0.01, 0.75 / fig_h, "outlined: flagged by the calibration", fontsize=7)
        with warnings.catch_warnings():  # characters missing from the font show as boxes
            warnings.filterwarnings("ignore", message="Glyph .* missing from font")
            fig.savefig(path, dpi=dpi)
    finally:
        plt.close(fig)
