"""A terminal rendering of a :class:`ktae.viz.page.Report` with ``rich`` (quick looks over ssh).

Per group: the prompt, a colour legend, each response's tokens on the diverging scale of
the report's default view (the sequence advantage is in each response's header),
flagged tokens underlined, and the strongest key tokens as a table.
"""

from __future__ import annotations

from ktae.viz.credit import colour, count_text
from ktae.viz.page import GroupReport, Report
from ktae.viz.report_html import VISIBLE, plain_visible


def _style(value: float, scale: float) -> str:
    r, g, b = colour(value, scale)
    fg = "white" if abs(value) / scale > 0.6 else "black"
    return f"{fg} on #{r:02x}{g:02x}{b:02x}"


def _group_renderables(report: Report, group: GroupReport, view: str):
    from rich.table import Table
    from rich.text import Text

    out = [Text(group.prompt, style="bold")]
    legend = Text("advantage ")
    legend.append(f"{-group.scale:+.3g} ")
    for k in range(-5, 6):
        legend.append("  ", style=_style(k / 5 * group.scale, group.scale))
    legend.append(f" {group.scale:+.3g}   colour: {report.label(view)}")
    if report.calibrated:
        legend.append("   ")
        legend.append("flagged", style="underline bold")
    out.append(legend)
    for resp in group.responses:
        verdict = Text("correct", style="bold green") if resp.correct else Text("wrong",
                                                                                style="bold red")
        head = Text(f"#{resp.index} ")
        head.append_text(verdict)
        head.append(f"  reward {resp.reward:.4g}  {report.label('seq')} "
                    f"{group.sequence[resp.index]:+.3g}  {len(resp.token_ids)} tokens")
        out.append(head)
        line = Text()
        for pos, piece in enumerate(resp.pieces):
            text = "".join(VISIBLE.get(ch, ch) for ch in piece.text) if piece.text else "\u2205"
            style = _style(resp.values[view][pos], group.scale)
            if resp.flagged is not None and resp.flagged[pos]:
                style += " underline bold"
            line.append(text, style=style)
        out.append(line)
    rows = group.positive[:5] + group.negative[:5]
    if rows:
        table = Table(title="key tokens", title_justify="left", show_edge=False)
        for col in ("token", "id", "a", "b", "c", "d", "p", "F", "IG", "value"):
            table.add_column(col, justify="left" if col == "token" else "right")
        for row in rows:
            table.add_row(plain_visible(row["text"]),
                          " ".join(map(str, row.get("span", (row["token"],)))),
                          *(count_text(row[k]) for k in "abcd"),
                          *(f"{row[k]:.3g}" for k in ("p_value", "fisher", "info_gain")),
                          f"{row['value']:+.3g}", style=None)
        out.append(table)
    return out


def print_report(report: Report, console=None, *, view: str | None = None) -> None:
    """Print ``report`` to ``console`` (default: a new ``rich.console.Console``)."""
    from rich.console import Console
    from rich.rule import Rule

    console = console or Console()
    view = view or report.default_view
    if view not in dict(report.views):
        raise ValueError(f"view: expected one of {[k for k, _ in report.views]}, got {view!r}")
    console.print(f"[bold]{report.title}[/bold]")
    for line in report.meta:
        console.print(line, highlight=False)
    for group in report.groups:
        console.print(Rule(f"{group.label}  ({group.num_correct}/{len(group.responses)} correct, "
                           f"mean |{report.label(view)} \u2212 {report.label('seq')}| "
                           f"{group.divergence:.3g})"))
        for item in _group_renderables(report, group, view):
            console.print(item, highlight=False)
