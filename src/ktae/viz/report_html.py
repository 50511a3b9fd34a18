"""The ``ktae explain`` page: one self-contained HTML file (inline CSS, no scripts).

Layout: a title and header lines, a toolbar of views (radio buttons styled as tabs: the
sequence advantage, the token credit, the calibrated credit and their difference), an
index of the groups ordered by how much token credit departs from the sequence
advantage, then one section per group: the prompt, a colour legend, every response
token by token, the strongest positive and negative key tokens, and the tokens a
calibration flagged.

Each real response token is exactly one ``<span class="tok">``. Its inline style holds
one background and one text colour per view (``--b0``, ``--f0``, ``--b1``, ...); the
checked view's CSS rule picks which pair is shown, so switching views needs no script.
Its ``title`` (the hover tooltip) gives the token id, every view's value, the key-token
statistics (a, b, c, d, p, F, IG, TF_T, TF_F, D, value) and, under a calibration, the
token's log-prob, entropy, weight and flag. Numbers carry 6 significant digits.
"""

from __future__ import annotations

import html

from ktae.viz.credit import NEGATIVE_RGB, POSITIVE_RGB, colour
from ktae.viz.page import STAT_KEYS, STAT_LABELS, GroupReport, Report, ResponseReport

VISIBLE = {" ": "\u00b7", "\n": "\u21b5", "\t": "\u2192", "\r": "\u240d"}
"""Whitespace drawn visibly inside tokens."""
_FLAG_ROWS = 20

_CSS = """
* { box-sizing: border-box; }
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 0;
  color: #1f2328; background: #fff; }
.page { max-width: 1100px; margin: 0 auto; padding: 16px 24px 48px; }
h1 { font-size: 22px; margin: 8px 0 6px; }
h2 { font-size: 18px; margin: 0 0 8px; }
h3 { font-size: 15px; margin: 18px 0 6px; }
.meta { margin: 0 0 10px; padding: 0; list-style: none; color: #57606a; font-size: 13px; }
.viewradio { position: absolute; opacity: 0; pointer-events: none; }
.toolbar { display: flex; flex-wrap: wrap; align-items: center; gap: 6px 8px;
  padding: 8px 0 12px; border-bottom: 1px solid #d0d7de; font-size: 14px; }
.toolbar label { border: 1px solid #d0d7de; border-radius: 6px; padding: 3px 10px;
  cursor: pointer; background: #f6f8fa; }
.hint { color: #57606a; font-size: 13px; margin-left: 8px; }
.index { margin: 14px 0 8px; }
table { border-collapse: collapse; font-size: 13px; }
.scroll { overflow-x: auto; max-width: 100%; }
td code { white-space: pre; }
td, th { border: 1px solid #d0d7de; padding: 3px 7px; text-align: right; vertical-align: top; }
th { background: #f6f8fa; font-weight: 600; }
td.l, th.l { text-align: left; }
td.sep { text-align: left; background: #f6f8fa; font-weight: 600; }
.group { margin-top: 22px; padding-top: 14px; border-top: 2px solid #d0d7de; }
.toolbar + .group { border-top: none; margin-top: 8px; }
.prompt { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 13px;
  white-space: pre-wrap; word-break: break-word; background: #f6f8fa; border: 1px solid #d0d7de;
  border-radius: 6px; padding: 6px 8px; margin: 4px 0 6px; }
.summary { font-size: 13px; color: #57606a; margin: 4px 0 8px; }
.legend { display: flex; flex-wrap: wrap; align-items: flex-start; gap: 6px 18px;
  font-size: 12px; color: #57606a; margin: 6px 0 10px; }
.scale { display: inline-flex; flex-direction: column; width: 260px; }
.bar { display: block; height: 12px; border: 1px solid #8c959f; border-radius: 2px; }
.ticks { display: flex; justify-content: space-between; margin-top: 2px; }
.key { display: inline-flex; align-items: center; gap: 6px; }
.sw { display: inline-block; width: 22px; height: 16px; border-radius: 2px; background: #fff;
  border: 1px solid #d0d7de; }
.resp { margin: 8px 0 12px; }
.rhead { font-size: 13px; margin-bottom: 3px; color: #424a53; }
.ok { color: #1a7f37; font-weight: 600; } .bad { color: #cf222e; font-weight: 600; }
.toks { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 14px;
  line-height: 1.25; }
.tok { display: inline-block; white-space: pre; padding: 2px 2px; margin: 1px 1px 1px 0;
  min-width: 0.7em; border-radius: 2px; background: var(--b); color: var(--f); }
.ws { opacity: 0.55; }
.bytes { font-size: 10px; opacity: 0.8; }
.flag { outline: 2px solid #111; outline-offset: -2px; }
.lw { outline: 2px dashed #cf222e; outline-offset: 0; border-radius: 2px; }
.out { background-image: repeating-linear-gradient(135deg, transparent 0 3px,
  rgba(0, 0, 0, 0.35) 3px 4px); }
"""


def _num(x) -> str:
    """A number for tooltips and tables: ints as is, floats with 6 significant digits."""
    if isinstance(x, bool):
        return str(x)
    if isinstance(x, int):
        return str(x)
    x = float(x)
    return "n/a" if x != x else f"{x:.6g}"


def _signed(x: float) -> str:
    return f"{x:+.3g}"


def _hex(rgb) -> str:
    return "#{:02x}{:02x}{:02x}".format(*rgb)


def _fg(value: float, scale: float) -> str:
    return "#fff" if abs(value) / scale > 0.6 else "#000"


def visible(text: str) -> str:
    """``text`` escaped for HTML, whitespace drawn as faint symbols."""
    return "".join(f'<span class="ws">{VISIBLE[ch]}</span>' if ch in VISIBLE
                   else html.escape(ch) for ch in text)


def plain_visible(text: str) -> str:
    """``text`` with whitespace replaced by the visible symbols (no markup)."""
    return "".join(VISIBLE.get(ch, ch) for ch in text)


# --------------------------------------------------------------------------- tokens


def tooltip(report: Report, resp: ResponseReport, pos: int) -> str:
    """The hover text of token ``pos`` of ``resp`` (plain text, lines joined by ``\\n``)."""
    piece, tid = resp.pieces[pos], resp.token_ids[pos]
    shown = piece.text if piece.text else (
        f"bytes {piece.raw.hex(' ')}" if piece.raw else "no text of its own")
    lines = [f"{shown!r} \u00b7 id {tid} \u00b7 response {resp.index}, token {pos}",
             " \u00b7 ".join(f"{label} {_num(resp.values[key][pos])}"
                             for key, label in report.views)]
    st = resp.stats[pos]
    if st is None:  # KTAE over spans: a token in a run shorter than the span length
        lines.append("key span: none covers this token")
    else:
        head = f"key span {plain_visible(st['text'])!r} " if "span" in st else "key-token "
        lines.append(head + " ".join(f"{STAT_LABELS[k]}={_num(st[k])}" for k in STAT_KEYS[:4]))
        lines.append(" ".join(f"{STAT_LABELS[k]}={_num(st[k])}" for k in STAT_KEYS[4:7]))
        lines.append(" ".join(f"{STAT_LABELS[k]}={_num(st[k])}" for k in STAT_KEYS[7:]))
    if resp.logprobs is not None:
        cal = (f"log p={_num(resp.logprobs[pos])} entropy={_num(resp.entropies[pos])} "
               f"weight={_num(resp.weights[pos])}")
        if resp.flagged[pos]:
            cal += " \u00b7 flagged"
        lines.append(cal)
    if resp.in_loss is not None and not resp.in_loss[pos]:
        lines.append("left out of the loss")
    if resp.labels is not None and "w" in resp.labels[pos]:
        lines.append("locally wrong (exact label)")
    return "\n".join(lines)


def _labelled_visible(text: str, labels: str) -> str:
    """``visible(text)`` with each run of locally wrong characters outlined."""
    out, k = [], 0
    while k < len(text):
        j = k
        while j < len(text) and (labels[j] == "w") == (labels[k] == "w"):
            j += 1
        body = visible(text[k:j])
        out.append(f'<span class="lw">{body}</span>' if labels[k] == "w" else body)
        k = j
    return "".join(out)


def _token_html(report: Report, resp: ResponseReport, pos: int, scale: float) -> str:
    style = []
    for i, (key, _) in enumerate(report.views):
        v = resp.values[key][pos]
        style.append(f"--b{i}:{_hex(colour(v, scale))};--f{i}:{_fg(v, scale)}")
    classes = ["tok"]
    if resp.flagged is not None and resp.flagged[pos]:
        classes.append("flag")
    if resp.in_loss is not None and not resp.in_loss[pos]:
        classes.append("out")
    piece = resp.pieces[pos]
    if piece.text and resp.labels is not None and "w" in resp.labels[pos]:
        body = _labelled_visible(piece.text, resp.labels[pos])
    elif piece.text:
        body = visible(piece.text)
    elif piece.raw:
        body = f'<span class="bytes">{piece.raw.hex(" ")}</span>'
    else:
        body = '<span class="ws">\u2205</span>'
    title = html.escape(tooltip(report, resp, pos), quote=True).replace("\n", "&#10;")
    out = f'<span class="{" ".join(classes)}" style="{";".join(style)}" title="{title}">{body}</span>'
    return out + "<br>" if piece.text.endswith("\n") else out


def _response_html(report: Report, group: GroupReport, resp: ResponseReport) -> str:
    verdict = '<span class="ok">correct</span>' if resp.correct else '<span class="bad">wrong</span>'
    seq_label = report.label("seq")
    parts = [f"<b>#{resp.index}</b>", verdict, f"reward {_num(resp.reward)}",
             f"{html.escape(seq_label)} {_signed(group.sequence[resp.index])}",
             f"{len(resp.token_ids)} tokens"]
    if resp.flagged is not None:
        parts.append(f"{sum(resp.flagged)} flagged")
    toks = "".join(_token_html(report, resp, p, group.scale) for p in range(len(resp.token_ids)))
    return (f'<div class="resp"><div class="rhead">{" &middot; ".join(parts)}</div>'
            f'<div class="toks">{toks}</div></div>')


# --------------------------------------------------------------------------- group


def _legend_html(report: Report, group: GroupReport) -> str:
    s = group.scale
    neg, pos = _hex(NEGATIVE_RGB), _hex(POSITIVE_RGB)
    ticks = "".join(f"<span>{x:+.3g}</span>" if x else "<span>0</span>"
                    for x in (-s, -s / 2, 0.0, s / 2, s))
    items = [f'<span class="key">advantage</span><span class="scale"><span class="bar" '
             f'style="background: linear-gradient(90deg, {neg}, #ffffff, {pos})"></span>'
             f'<span class="ticks">{ticks}</span></span>']
    if report.calibrated:
        items.append('<span class="key"><span class="sw flag"></span>flagged by the '
                     'calibration</span>')
    if report.calibrated or report.partial_loss:
        items.append('<span class="key"><span class="sw out"></span>left out of the loss</span>')
    if any(r.labels is not None for r in group.responses):
        items.append('<span class="key"><span class="sw lw"></span>locally wrong characters '
                     '(exact labels)</span>')
    return f'<div class="legend">{"".join(items)}</div>'


def _key_table_html(group: GroupReport) -> str:
    head = "".join(f"<th>{STAT_LABELS[k]}</th>" for k in STAT_KEYS)
    rows = [f'<tr><th class="l">token</th><th>id</th>{head}</tr>']

    def section(title: str, items: list[dict]) -> None:
        if not items:
            return
        rows.append(f'<tr><td class="sep" colspan="{len(STAT_KEYS) + 2}">{title}</td></tr>')
        for row in items:
            v = row["value"]
            cells = [f'<td class="l"><code>{html.escape(plain_visible(row["text"]))}</code></td>',
                     f'<td>{" ".join(map(str, row.get("span", (row["token"],))))}</td>']
            cells += [f"<td>{_num(row[k])}</td>" for k in STAT_KEYS[:-1]]
            cells.append(f'<td style="background:{_hex(colour(v, group.scale))};'
                         f'color:{_fg(v, group.scale)}">{_num(v)}</td>')
            rows.append("<tr>" + "".join(cells) + "</tr>")

    section("strongest positive", group.positive)
    section("strongest negative", group.negative)
    if len(rows) == 1:
        return ("<h3>Key tokens</h3><p class=\"summary\">No token of this group has a key-token "
                "value (all responses correct, all wrong, or only shared tokens).</p>")
    note = (f'<p class="summary">{group.zero_tokens} distinct tokens with value 0 not shown.</p>'
            if group.zero_tokens else "")
    return f"<h3>Key tokens</h3><div class=\"scroll\"><table>{''.join(rows)}</table></div>{note}"


def _flag_table_html(report: Report, group: GroupReport) -> str:
    flagged = [(r, p) for r in group.responses if r.flagged is not None
               for p in range(len(r.token_ids)) if r.flagged[p]]
    if not flagged:
        return '<h3>Flagged tokens</h3><p class="summary">The calibration flagged no token.</p>'
    before = report.label("token") if "token" in dict(report.views) else report.label("seq")
    after = report.label("final")
    head = ("<tr><th>response</th><th>token</th><th class=\"l\">text</th><th>log p</th>"
            f"<th>entropy</th><th>weight</th><th>{html.escape(before)}</th>"
            f"<th>{html.escape(after)}</th><th>in loss</th></tr>")
    rows = []
    before_key = "token" if "token" in dict(report.views) else "seq"
    for r, p in flagged[:_FLAG_ROWS]:
        rows.append(f"<tr><td>#{r.index}</td><td>{p}</td><td class=\"l\"><code>"
                    f"{html.escape(plain_visible(r.pieces[p].text))}</code></td>"
                    f"<td>{_num(r.logprobs[p])}</td><td>{_num(r.entropies[p])}</td>"
                    f"<td>{_num(r.weights[p])}</td><td>{_num(r.values[before_key][p])}</td>"
                    f"<td>{_num(r.values['final'][p])}</td>"
                    f"<td>{'yes' if r.in_loss[p] else 'no'}</td></tr>")
    more = (f'<p class="summary">Showing {_FLAG_ROWS} of {len(flagged)} flagged tokens.</p>'
            if len(flagged) > _FLAG_ROWS else "")
    return (f"<h3>Flagged tokens</h3><div class=\"scroll\"><table>{head}{''.join(rows)}</table>"
            f"</div>{more}")


def _group_html(report: Report, group: GroupReport) -> str:
    final_key = report.default_view
    parts = [f'<section class="group" id="{group.anchor}"><h2>{html.escape(group.label)}</h2>',
             f'<pre class="prompt">{html.escape(group.prompt)}</pre>']
    summary = [f"{group.num_correct} of {len(group.responses)} correct"]
    if group.answer is not None:
        summary.append(f"reference answer <code>{html.escape(str(group.answer))}</code>")
    if final_key != "seq":
        summary.append(f"mean |{html.escape(report.label(final_key))} \u2212 "
                       f"{html.escape(report.label('seq'))}| per token {group.divergence:.3g}")
    parts.append(f'<div class="summary">{" &middot; ".join(summary)}</div>')
    parts.append(_legend_html(report, group))
    parts += [_response_html(report, group, r) for r in group.responses]
    parts.append(_key_table_html(group))
    if report.calibrated:
        parts.append(_flag_table_html(report, group))
    parts.append("</section>")
    return "\n".join(parts)


# --------------------------------------------------------------------------- page


def _index_html(report: Report) -> str:
    final_key = report.default_view
    head = (f"<tr><th>rank</th><th class=\"l\">group</th><th class=\"l\">prompt</th>"
            f"<th>correct</th><th>mean |{html.escape(report.label(final_key))} \u2212 "
            f"{html.escape(report.label('seq'))}|</th><th class=\"l\">strongest key tokens</th></tr>")
    rows = []
    for rank, g in enumerate(report.ranked(), 1):
        prompt = g.prompt if len(g.prompt) <= 60 else g.prompt[:59] + "\u2026"
        keys = [f"{html.escape(plain_visible(r['text']))} {_signed(r['value'])}"
                for r in (g.positive[:1] + g.negative[:1])]
        rows.append(f'<tr><td>{rank}</td><td class="l"><a href="#{g.anchor}">'
                    f'{html.escape(g.label)}</a></td><td class="l"><code>'
                    f'{html.escape(plain_visible(prompt))}</code></td>'
                    f"<td>{g.num_correct}/{len(g.responses)}</td><td>{g.divergence:.3g}</td>"
                    f'<td class="l"><code>{" &nbsp; ".join(keys) or "&ndash;"}</code></td></tr>')
    return (f'<nav class="index"><h2>Groups, most token credit first</h2><div class="scroll">'
            f'<table>{head}{"".join(rows)}</table></div></nav>')


def _view_css(report: Report) -> str:
    rules = []
    for i, (key, _) in enumerate(report.views):
        rules.append(f"#view-{key}:checked ~ .page .tok {{ --b: var(--b{i}); --f: var(--f{i}); }}")
        rules.append(f"#view-{key}:checked ~ .page label[for=view-{key}] {{ background: #0969da; "
                     "color: #fff; border-color: #0969da; }")
    return "\n".join(rules)


def report_html(report: Report) -> str:
    """The whole page for ``report`` (a string; write it with UTF-8)."""
    title = html.escape(report.title)
    radios = "".join(
        f'<input type="radio" name="view" class="viewradio" id="view-{key}"'
        f'{" checked" if key == report.default_view else ""}>' for key, _ in report.views)
    labels = "".join(f'<label for="view-{key}">{html.escape(label)}</label>'
                     for key, label in report.views)
    meta = "".join(f"<li>{html.escape(line)}</li>" for line in report.meta)
    parts = [f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{title}</title>'
             f"<style>{_CSS}\n{_view_css(report)}</style></head><body>",
             radios, '<div class="page">', f"<h1>{title}</h1>", f'<ul class="meta">{meta}</ul>',
             f'<div class="toolbar"><span>Colour tokens by</span>{labels}<span class="hint">'
             "Hover a token for its statistics.</span></div>"]
    if len(report.groups) > 1:
        parts.append(_index_html(report))
    parts += [_group_html(report, g) for g in report.groups]
    parts.append("</div></body></html>\n")
    return "\n".join(parts)
