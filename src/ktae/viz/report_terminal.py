"""A terminal rendering of a :class:`ktae.viz.page.Report` with ``rich`` (quick looks over ssh).

Per group: the prompt, a colour legend, each response on the diverging scale of the
report's default view (the sequence advantage is in each response's header), and the
strongest key tokens as a table.

A response is the text its tokens decode to (:func:`ktae.viz.text_layout.text_runs`):
a newline breaks the line after a ``↵``, a character split over tokens is written once,
special tokens are in italics. When tokens hold several characters (BPE), every other
token is underlined so that token boundaries show; with one character per token (the
shipped model) spaces are written ``·`` instead. Flagged tokens are bold and underlined.
"""

from __future__ import annotations

from ktae.viz.credit import colour, count_text
from ktae.viz.page import GroupReport, Report, ResponseReport
from ktae.viz.report_html import plain_visible
from ktae.viz.text_layout import one_character_per_token, text_runs


def _style(value: float, scale: float) -> str:
    r, g, b = colour(value, scale)
    fg = "white" if abs(value) / scale > 0.6 else "black"
    return f"{fg} on #{r:02x}{g:02x}{b:02x}"


def response_text(resp: ResponseReport, view: str, scale: float, *, boundaries: bool):
    """``resp`` as a ``rich.text.Text`` coloured by ``view`` (see the module docstring);
    ``boundaries``: underline every other token (else write spaces as ``·``)."""
    from rich.text import Text

    line = Text()
    runs, _ = text_runs(resp.pieces, mark_spaces=not boundaries)
    shade, before = False, None
    for k, run in enumerate(runs):
        if before is not None and run.tokens != before:
            shade = not shade
        before = run.tokens
        style = _style(resp.values[view][run.tokens[-1]], scale)
        if run.kind == "special":
            style += " italic"
        if resp.flagged is not None and any(resp.flagged[p] for p in run.tokens):
            style += " underline bold"
        elif boundaries and shade:
            style += " underline"
        line.append(run.text, style=style)
        if k + 1 < len(runs) and runs[k + 1].line > run.line:
            line.append("\n")
    return line


def _group_renderables(report: Report, group: GroupReport, view: str):
    from rich.table import Table
    from rich.text import Text

    boundaries = not one_character_per_token(p for g in report.groups for r in g.responses
                                             for p in r.pieces)

    out = [Text(group.prompt, style="bold")]
    legend = Text("advantage ")
    legend.append(f"{-group.scale:+.3g} ")
    for k in range(-5, 6):
        legend.append("  ", style=_style(k / 5 * group.scale, group.scale))
    legend.append(f" {group.scale:+.3g}   colour: {report.label(view)}")
    if report.calibrated:
        legend.append("   ")
        legend.append("flagged", style="underline bold")
    if boundaries:
        legend.append("   every other token underlined")
    out.append(legend)
    for resp in group.responses:
        verdict = Text("correct", style="bold green") if resp.correct else Text("wrong",
                                                                                style="bold red")
        head = Text(f"#{resp.index} ")
        head.append_text(verdict)
        head.append(f"  reward {resp.reward:.4g}  {report.label('seq')} "
                    f"{group.sequence[resp.index]:+.3g}  {len(resp.token_ids)} tokens")
        out.append(head)
        out.append(response_text(resp, view, group.scale, boundaries=boundaries))
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
