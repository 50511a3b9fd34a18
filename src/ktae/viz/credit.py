"""Pictures of token credit: which tokens of a group's responses got which advantage.

Each response is drawn as a row of tokens whose background shows its advantage on a
diverging scale, symmetric around 0 and scaled by the largest ``|advantage|`` shown:
blue for negative, white for 0, red for positive. :func:`credit_html` writes a
self-contained HTML page (inline CSS, no scripts), :func:`credit_png` a matplotlib figure,
and :func:`group_credit` runs KTAE (docs/method.md §3, Eq. 10) on a batch and picks one group,
with its key-token table rows, ready for both.

Example:
    >>> data = group_credit(rewards=[1., 0.], token_ids=[[5, 6], [5, 7]], mask=[[1, 1], [1, 1]])
    >>> page = credit_html(**data)
"""

from __future__ import annotations

import html
import numbers
from collections.abc import Sequence

import torch

from ktae.core.checks import as_tensor, check_float, check_mask
from ktae.core.estimators import compute_advantages
from ktae.core.groups import group_index as dense_groups
from ktae.core.ktae import key_token_table

NEGATIVE_RGB = (33, 102, 172)
"""The colour of the most negative advantage shown (blue)."""
POSITIVE_RGB = (178, 24, 43)
"""The colour of the most positive advantage shown (red)."""
TABLE_COLUMNS = ("a", "b", "c", "d", "p_value", "fisher", "info_gain", "value")
_TABLE_HEAD = ("a", "b", "c", "d", "p", "F", "IG", "value")
_VISIBLE = {" ": "\u00b7", "\n": "\u21b5", "\t": "\u2192", "\r": "\u240d"}

_CSS = """
body { font-family: sans-serif; margin: 1.5em; color: #222; }
.resp { margin: 0.6em 0 1em; }
.head { font-size: 0.9em; margin-bottom: 0.2em; }
.ok { color: #1a7f37; font-weight: bold; } .bad { color: #b42318; font-weight: bold; }
.toks { font-family: monospace; font-size: 15px; line-height: 1.9; word-break: break-all; }
.tok { padding: 2px 1px; border-radius: 2px; white-space: pre; }
.ws { color: #999; }
.legend span { display: inline-block; width: 2.4em; text-align: center; font-size: 0.8em; }
table { border-collapse: collapse; font-size: 0.85em; margin-top: 0.5em; }
td, th { border: 1px solid #ccc; padding: 2px 6px; text-align: right; }
"""


# --------------------------------------------------------------------------- input


def _token_rows(responses, mask) -> list[list]:
    """``responses`` as a list of rows (token ids as ints, or strings)."""
    if isinstance(responses, torch.Tensor):
        ids = responses
        if ids.dim() != 2 or ids.is_floating_point():
            raise ValueError(f"responses: expected a 2-D integer tensor [B, T], "
                             f"got shape {tuple(ids.shape)}, dtype {ids.dtype}")
        keep = torch.ones_like(ids, dtype=torch.bool) if mask is None else check_mask(
            as_tensor(mask, "mask"), "mask", tuple(ids.shape))
        return [row[m].tolist() for row, m in zip(ids, keep, strict=True)]
    if isinstance(responses, (str, bytes)) or not isinstance(responses, Sequence):
        raise ValueError(f"responses: expected a list of token lists or a [B, T] tensor, "
                         f"got {type(responses).__name__}")
    rows = []
    for i, row in enumerate(responses):
        if isinstance(row, torch.Tensor):
            row = row.tolist()
        if isinstance(row, (str, bytes)) or not isinstance(row, Sequence):
            raise ValueError(f"responses: row {i} should be a list of token ids or strings, "
                             f"got {type(row).__name__}")
        for tok in row:
            if isinstance(tok, bool) or not isinstance(tok, (numbers.Integral, str)):
                raise ValueError(f"responses: row {i} holds {tok!r}; expected token ids "
                                 "(int) or token strings")
        rows.append([tok if isinstance(tok, str) else int(tok) for tok in row])
    return rows


def _advantage_rows(advantages, mask, lengths: list[int]) -> list[list[float]]:
    """``advantages`` as per-token float rows matching ``lengths`` (one per response)."""
    if isinstance(advantages, torch.Tensor):
        adv = check_float(advantages, "advantages", ndim=2).double()
        keep = torch.ones_like(adv, dtype=torch.bool) if mask is None else check_mask(
            as_tensor(mask, "mask"), "mask", tuple(adv.shape))
        rows = [row[m].tolist() for row, m in zip(adv, keep, strict=True)]
    elif isinstance(advantages, (str, bytes)) or not isinstance(advantages, Sequence):
        raise ValueError(f"advantages: expected a list of float lists or a [B, T] tensor, "
                         f"got {type(advantages).__name__}")
    else:
        rows = [check_float(as_tensor(r, "advantages").reshape(-1), "advantages",
                            ndim=1).double().tolist() for r in advantages]
    if len(rows) != len(lengths):
        raise ValueError(f"advantages: expected {len(lengths)} rows (one per response), "
                         f"got {len(rows)}")
    for i, (row, n) in enumerate(zip(rows, lengths, strict=True)):
        if len(row) != n:
            raise ValueError(f"advantages: row {i} has {len(row)} values, expected {n} "
                             f"(the tokens of responses[{i}])")
    return rows


def _labels(rewards, correct, n: int) -> tuple[list | None, list | None]:
    if rewards is not None:
        rewards = check_float(as_tensor(rewards, "rewards"), "rewards", ndim=1).tolist()
        if len(rewards) != n:
            raise ValueError(f"rewards: expected {n} values (one per response), got {len(rewards)}")
    if correct is not None:
        correct = [bool(c) for c in as_tensor(correct, "correct").reshape(-1).tolist()]
        if len(correct) != n:
            raise ValueError(f"correct: expected {n} values (one per response), got {len(correct)}")
    elif rewards is not None:
        correct = [r > 0 for r in rewards]  # KTAE's default reward_threshold
    return rewards, correct


def _prepare(responses, advantages, mask, rewards, correct, decode):
    rows = _token_rows(responses, mask)
    adv = _advantage_rows(advantages, mask, [len(r) for r in rows])
    if decode is not None and not callable(decode):
        raise ValueError(f"decode: expected a callable token id -> str, got {type(decode).__name__}")
    texts = [[_token_text(tok, decode) for tok in row] for row in rows]
    rewards, correct = _labels(rewards, correct, len(rows))
    return rows, texts, adv, rewards, correct


def _token_text(tok, decode) -> str:
    if isinstance(tok, str):
        return tok
    return str(decode(tok)) if decode is not None else f"<{tok}>"


def _scale(adv: list[list[float]]) -> float:
    """The largest ``|advantage|`` shown; 1 when every value is 0 (all white)."""
    top = max((abs(v) for row in adv for v in row), default=0.0)
    return top if top > 0 else 1.0


def colour(value: float, scale: float) -> tuple[int, int, int]:
    """RGB of ``value`` on the diverging scale ``[-scale, scale]`` (white at 0, clipped)."""
    t = max(-1.0, min(1.0, value / scale))
    end = POSITIVE_RGB if t > 0 else NEGATIVE_RGB
    return tuple(round(255 + (e - 255) * abs(t)) for e in end)


def _header(i: int, rewards, correct) -> str:
    parts = [f"response {i}"]
    if rewards is not None:
        parts.append(f"reward {rewards[i]:.4g}")
    if correct is not None:
        parts.append('<span class="ok">correct</span>' if correct[i]
                     else '<span class="bad">wrong</span>')
    return " &middot; ".join(parts)


# --------------------------------------------------------------------------- HTML


def _token_html(text: str, tok, value: float, scale: float) -> str:
    r, g, b = colour(value, scale)
    fg = "#fff" if abs(value) / scale > 0.6 else "#000"
    shown = "".join(f'<span class="ws">{_VISIBLE[ch]}</span>' if ch in _VISIBLE
                    else html.escape(ch) for ch in text) or '<span class="ws">&empty;</span>'
    hover = f"advantage {float(value)!r}" + (f" (token id {tok})" if isinstance(tok, int) else "")
    return (f'<span class="tok" style="background: rgb({r},{g},{b}); color: {fg}" '
            f'title="{html.escape(hover, quote=True)}">{shown}</span>')


def _legend_html(scale: float) -> str:
    steps = [-1.0, -0.5, 0.0, 0.5, 1.0]
    cells = "".join(
        f'<span style="background: rgb{colour(s * scale, scale)}; color: '
        f'{"#fff" if abs(s) > 0.6 else "#000"}">{s * scale:+.3g}</span>' for s in steps)
    return f'<div class="legend">advantage: {cells}</div>'


def count_text(x) -> str:
    """A table count: an integer as is, a soft count (``split="graded"``) to 3 digits."""
    return str(int(x)) if float(x).is_integer() else f"{float(x):.3g}"


def _table_html(rows: Sequence[dict]) -> str:
    head = "".join(f"<th>{h}</th>" for h in ("token", "text", *_TABLE_HEAD))
    body = []
    for row in rows:
        text = row.get("text")
        text = "" if text is None else "".join(_VISIBLE.get(ch, ch) for ch in str(text))
        ids = " ".join(str(int(t)) for t in row["span"]) if "span" in row else str(int(row["token"]))
        cells = [ids, html.escape(text)]
        cells += [count_text(row[k]) for k in "abcd"]
        cells += [f"{float(row[k]):.4g}" for k in TABLE_COLUMNS[4:]]
        body.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    return (f"<h2>Key tokens</h2><table><tr>{head}</tr>{''.join(body)}</table>")


def credit_html(responses, advantages, *, rewards=None, title: str = "Token credit",
                decode=None, mask=None, correct=None, table_rows=None) -> str:
    """A self-contained HTML page: one row of coloured tokens per response.

    Args:
        responses: ``B`` lists of token ids (or of strings, one per token), or an integer
            tensor ``[B, T]`` (with ``mask``).
        advantages: ``B`` lists of per-token floats of the same lengths, or a float tensor
            ``[B, T]``; with ``mask`` (``[B, T]``, 0/1) only masked-in positions are shown.
        rewards: optional ``[B]`` rewards, shown in each response's header.
        title: page title and heading (escaped).
        decode: optional ``token id -> str`` (e.g. ``lambda i: tok.decode([i])``); without
            it ids are shown as ``<id>``.
        correct: optional ``[B]`` booleans; default ``reward > 0`` (KTAE's default
            threshold) when ``rewards`` is given.
        table_rows: optional key-token table rows (dicts as from
            :meth:`ktae.KeyTokenTable.to_rows`, optional ``"text"``), shown as a table.

    Each token's background is :func:`colour` of its advantage, scaled by the largest
    ``|advantage|`` on the page (all white if every value is 0); hovering shows the exact
    value. Spaces, newlines and tabs are drawn as ``·``, ``↵``, ``→``; all text is escaped.

    Raises:
        ValueError: naming the argument, e.g. when ``advantages`` and ``responses`` differ
            in number of rows or in any row's length.
    """
    rows, texts, adv, rewards, correct = _prepare(responses, advantages, mask, rewards,
                                                  correct, decode)
    scale = _scale(adv)
    parts = [f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>"
             f"{html.escape(str(title))}</title><style>{_CSS}</style></head><body>",
             f"<h1>{html.escape(str(title))}</h1>", _legend_html(scale)]
    for i, (row, text_row, adv_row) in enumerate(zip(rows, texts, adv, strict=True)):
        toks = "".join(_token_html(t, tok, v, scale)
                       for tok, t, v in zip(row, text_row, adv_row, strict=True))
        parts.append(f'<div class="resp"><div class="head">{_header(i, rewards, correct)}</div>'
                     f'<div class="toks">{toks}</div></div>')
    if table_rows:
        parts.append(_table_html(table_rows))
    parts.append("</body></html>\n")
    return "\n".join(parts)


# --------------------------------------------------------------------------- PNG


def credit_png(responses, advantages, path, *, rewards=None, decode=None,
               max_tokens: int = 80, mask=None, correct=None, title: str = "Token credit",
               table_rows=None) -> None:
    """The picture of :func:`credit_html` as a PNG (matplotlib, Agg backend).

    One row per response, one coloured cell per token with its text; rows longer than
    ``max_tokens`` are cut (marked ``…``). Same arguments as :func:`credit_html`;
    ``table_rows`` is accepted so that :func:`group_credit`'s dict can be passed as is,
    and is not drawn. Writes ``path``.
    """
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise ValueError(f"max_tokens: expected a positive integer, got {max_tokens!r}")
    rows, texts, adv, rewards, correct = _prepare(responses, advantages, mask, rewards,
                                                  correct, decode)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import LinearSegmentedColormap, Normalize
    from matplotlib.patches import Rectangle

    scale = _scale(adv)
    width = max(1, min(max_tokens, max((len(r) for r in rows), default=1)))
    n = max(len(rows), 1)
    fig, ax = plt.subplots(figsize=(2.5 + 0.24 * width, 0.8 + 0.42 * n))
    try:
        for i, (text_row, adv_row) in enumerate(zip(texts, adv, strict=True)):
            y = n - 1 - i
            for j, (t, v) in enumerate(zip(text_row[:max_tokens], adv_row[:max_tokens],
                                           strict=True)):
                rgb = tuple(c / 255 for c in colour(v, scale))
                ax.add_patch(Rectangle((j, y + 0.1), 1, 0.8, facecolor=rgb, edgecolor="white",
                                       linewidth=0.5))
                shown = "".join(_VISIBLE.get(ch, ch) if ch != "\n" else "\\n" for ch in t)
                if len(shown) > 5:
                    shown = shown[:4] + "\u2026"
                ax.text(j + 0.5, y + 0.5, shown, ha="center", va="center",
                        fontsize=7, family="monospace", parse_math=False,
                        color="white" if abs(v) / scale > 0.6 else "black")
            if len(text_row) > max_tokens:
                ax.text(width + 0.2, y + 0.5, "\u2026", va="center", fontsize=9)
        labels = []
        for i in range(len(rows)):
            label = f"#{i}"
            if rewards is not None:
                label += f" r={rewards[i]:.3g}"
            if correct is not None:
                label += " correct" if correct[i] else " wrong"
            labels.append(label)
        ax.set_yticks([n - 1 - i + 0.5 for i in range(len(rows))], labels, fontsize=8)
        ax.set_xlim(0, width + 1)
        ax.set_ylim(0, n)
        ax.set_xticks([])
        for side in ("top", "right", "bottom", "left"):
            ax.spines[side].set_visible(False)
        ax.set_title(str(title), fontsize=10, loc="left")
        cmap = LinearSegmentedColormap.from_list(
            "ktae_credit", [tuple(c / 255 for c in colour(s, 1.0)) for s in (-1.0, 0.0, 1.0)])
        sm = plt.cm.ScalarMappable(norm=Normalize(-scale, scale), cmap=cmap)
        fig.colorbar(sm, ax=ax, fraction=0.03, pad=0.01, label="advantage")
        fig.tight_layout()
        fig.savefig(path, dpi=120)
    finally:
        plt.close(fig)


# --------------------------------------------------------------------------- KTAE


def group_credit(*, rewards, token_ids, mask, group_index: int = 0, group=None, decode=None,
                 top_rows: int = 15, **ktae_options) -> dict:
    """KTAE advantages and key-token rows of one group, ready for the renderers.

    Runs ``ktae.compute_advantages("ktae", ...)`` and ``ktae.key_token_table(...)`` on the
    whole batch (``rewards`` ``[B]``, ``token_ids`` ``[B, T]``, ``mask`` ``[B, T]``,
    ``group`` ``[B]`` labels, default: all one group; ``ktae_options`` as for
    ``compute_advantages``) and keeps group ``group_index`` (dense index, groups numbered
    by first appearance as in :class:`ktae.KeyTokenTable`).

    Returns:
        ``{"responses", "advantages", "rewards", "correct", "table_rows"}``: the group's
        responses (token ids, or their ``decode``d strings), per-token advantages, rewards,
        correctness (as KTAE judged it), and its ``top_rows`` key-token rows by ``|value|``
        (with ``"text"`` when ``decode`` is given). ``credit_html(**result)`` and
        ``credit_png(**result, path=...)`` take it as is.
    """
    ids = as_tensor(token_ids, "token_ids")
    if ids.dim() != 2:
        raise ValueError(f"token_ids: expected [B, T], got shape {tuple(ids.shape)}")
    if group is None:
        group = [0] * ids.shape[0]
    gid, num_groups = dense_groups(group, ids.shape[0], ids.device)
    if isinstance(group_index, bool) or not isinstance(group_index, int) or not (
            0 <= group_index < num_groups):
        raise ValueError(f"group_index: expected an integer in [0, {num_groups}), "
                         f"got {group_index!r}")
    if isinstance(top_rows, bool) or not isinstance(top_rows, int) or top_rows < 0:
        raise ValueError(f"top_rows: expected a non-negative integer, got {top_rows!r}")
    kwargs = dict(rewards=rewards, group=group, token_ids=ids, mask=mask)
    adv = compute_advantages("ktae", **kwargs, **ktae_options)
    table = key_token_table(**kwargs, **ktae_options)
    keep = check_mask(as_tensor(mask, "mask"), "mask", tuple(ids.shape))
    rew = as_tensor(rewards, "rewards").reshape(-1).double()
    if "correct" in ktae_options:
        correct = as_tensor(ktae_options["correct"], "correct").reshape(-1).bool()
    else:
        correct = rew > float(ktae_options.get("reward_threshold", 0.0))
    rows = (gid == group_index).nonzero().flatten().tolist()
    responses = [ids[r][keep[r]].tolist() for r in rows]
    if decode is not None:
        responses = [[str(decode(t)) for t in resp] for resp in responses]
    in_group = (table.group == group_index).nonzero().flatten()
    order = in_group[torch.argsort(table.value[in_group].abs(), descending=True, stable=True)]
    table_rows = []
    for i in order[:top_rows].tolist():
        row = {k: getattr(table, k)[i].item() for k in ("token", *TABLE_COLUMNS)}
        if table.span is not None:  # ngram > 1: the row is a span of tokens
            row["span"] = tuple(table.span[i].tolist())
        if decode is not None:
            row["text"] = "".join(str(decode(t)) for t in row.get("span", (row["token"],)))
        table_rows.append(row)
    return {"responses": responses,
            "advantages": [adv[r][keep[r]].tolist() for r in rows],
            "rewards": [rew[r].item() for r in rows],
            "correct": [bool(correct[r]) for r in rows],
            "table_rows": table_rows}
