"""explain's PNG and terminal views on SmolLM2-135M-Instruct's real tokenizer (49,152-token
byte-level BPE, ChatML): tokens drawn as the text they decode to with no gap after a
leading-space token, boundaries marked, a character split over tokens drawn once over
all of them, newlines breaking lines, special tokens legible; checked against plain
prefix decoding. The character-level rendering is kept."""

from __future__ import annotations

import gzip
import os
import shutil
from pathlib import Path

import pytest

from ktae.viz.text_layout import NEWLINE_MARK, one_character_per_token, text_runs
from ktae.viz.tokens import token_pieces

FIXTURE = Path(__file__).parent / "fixtures" / "smollm2-tokenizer"

STEP = ("Step 1: Add both numbers.\n27 + 15 = 42\nThe answer is \\boxed{42}. Très bien! 😀"
        "<|im_end|>")
TEXTS = [STEP,
         "Step 1: Add both numbers.\n27 + 15 = 32\nThe answer is \\boxed{32}. 🤖<|im_end|>",
         "27 + 15 = 42, c'est ça. 日本語 ✓<|im_end|>",
         "Step 1: Subtract.\n\n  27 - 15 = 12\n\\boxed{12}<|im_end|>",
         "naïve résumé:\tdone\r\n<|im_start|>assistant\nOK"]


UNMARK = {NEWLINE_MARK: "\n", "\u2192": "\t", "\u2190": "\r"}


def smollm2_tokenizer(directory: Path):
    """SmolLM2-135M-Instruct's tokenizer (and chat template) from the shipped fixture,
    unpacked into ``directory``."""
    from transformers import AutoTokenizer

    directory.mkdir(parents=True, exist_ok=True)
    with gzip.open(FIXTURE / "tokenizer.json.gz", "rb") as src, \
            open(directory / "tokenizer.json", "wb") as dst:
        shutil.copyfileobj(src, dst)
    for name in ("tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(FIXTURE / name, directory / name)
    return AutoTokenizer.from_pretrained(directory)


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return smollm2_tokenizer(tmp_path_factory.mktemp("smollm2"))


def encode(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def decode(tok, ids) -> str:
    return tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def reference_chars(tok, ids) -> list[tuple[str, tuple[int, ...]]]:
    """Per character of the decoded text: the character and the tokens holding its bytes,
    from prefix decodes alone: the first token whose prefix reaches the character (as the
    replacement character while incomplete) to the first whose prefix shows it whole."""
    text = decode(tok, ids)
    assert "\ufffd" not in text
    prefixes = [decode(tok, ids[:i + 1]) for i in range(len(ids))]
    out = []
    for j, ch in enumerate(text):
        first = next(i for i, p in enumerate(prefixes) if len(p) > j)
        last = next(i for i, p in enumerate(prefixes) if p[:j + 1] == text[:j + 1])
        out.append((ch, tuple(range(first, last + 1))))
    return out


def drawn_chars(runs) -> list[tuple[str, tuple[int, ...]]]:
    """The characters the runs stand for (``↵`` is a newline), with their runs' tokens."""
    out = []
    for run in runs:
        text = UNMARK.get(run.text, run.text) if run.kind == "mark" else run.text
        out += [(ch, run.tokens) for ch in text]
    return out


def lines_of(runs) -> list[list]:
    lines: list[list] = []
    for run in runs:
        while len(lines) <= run.line:
            lines.append([])
        lines[run.line].append(run)
    return lines


def test_fixture_is_smollm2s_tokenizer(tok):
    assert len(tok) == 49152 and tok.eos_token == "<|im_end|>"
    chat = tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False,
                                   add_generation_prompt=True)
    assert chat.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert decode(tok, encode(tok, STEP)) == STEP


def test_fixture_matches_the_prepared_model(tok):
    from ktae.models import smollm2

    if not smollm2.is_prepared():
        if os.environ.get("KTAE_REQUIRE_REAL_MODEL") == "1":  # CI prepares it
            pytest.fail("KTAE_REQUIRE_REAL_MODEL=1 but smollm2-135m is not prepared "
                        "(`ktae models prepare smollm2-135m`)")
        pytest.skip("smollm2-135m is not prepared (`ktae models prepare smollm2-135m`)")
    from transformers import AutoTokenizer

    prepared = AutoTokenizer.from_pretrained(smollm2.cache_dir())
    assert len(prepared) == len(tok)
    for text in TEXTS:
        assert encode(prepared, text) == encode(tok, text)
    assert prepared.chat_template == tok.chat_template


@pytest.mark.parametrize("text", TEXTS)
def test_runs_draw_the_decoded_text_over_the_tokens_prefix_decoding_gives(tok, text):
    ids = encode(tok, text)
    pieces = token_pieces(tok, ids)
    runs, cut = text_runs(pieces)
    assert not cut
    assert drawn_chars(runs) == reference_chars(tok, ids)
    # line by line, the runs abut (no gap, no overlap) and read as the decoded lines
    lines = text.split("\n")
    expected = [line + NEWLINE_MARK for line in lines[:-1]] + [lines[-1]]
    drawn = lines_of(runs)
    if not expected[-1]:
        expected.pop()
    assert len(drawn) == len(expected)
    for line, want in zip(drawn, expected, strict=True):
        assert [r.x for r in line] == [sum(len(r.text) for r in line[:i]) for i in range(len(line))]
        assert all(r.width == len(r.text) for r in line)
        assert "".join(UNMARK.get(r.text, r.text) if r.text != NEWLINE_MARK else r.text
                       for r in line) == want
    # every token is drawn, in order
    assert sorted({t for r in runs for t in r.tokens}) == list(range(len(ids)))


def test_leading_space_tokens_draw_no_extra_gap(tok):
    ids = encode(tok, STEP)
    runs, _ = text_runs(token_pieces(tok, ids))
    first = [(r.text, r.x, r.width) for r in runs if r.line == 0]
    assert first == [("Step", 0, 4), (" ", 4, 1), ("1", 5, 1), (":", 6, 1), (" Add", 7, 4),
                     (" both", 11, 5), (" numbers", 16, 8), (".", 24, 1), (NEWLINE_MARK, 25, 1)]
    assert tok.convert_ids_to_tokens(ids[4]) == "\u0120Add"  # the byte-level space marker


def test_a_character_split_over_tokens_is_drawn_once_over_all_of_them(tok):
    ids = encode(tok, STEP)
    pieces = token_pieces(tok, ids)
    runs, _ = text_runs(pieces)
    smiley = [r for r in runs if "😀" in r.text]
    assert len(smiley) == 1 and smiley[0].text == "😀" and smiley[0].width == 1
    k = smiley[0].tokens[-1]
    # the token before holds " " and the emoji's first three bytes
    assert smiley[0].tokens == (k - 1, k) and pieces[k - 1].raw == b" \xf0\x9f\x98"
    assert [r.text for r in runs if r.tokens == (k - 1,)] == [" "]
    assert decode(tok, ids[:k]).endswith("\ufffd") and decode(tok, ids[:k + 1]).endswith("😀")
    # over three tokens, the middle one holding neither text nor the character's ends
    ids = encode(tok, "so 🤖")
    pieces = token_pieces(tok, ids)
    runs, _ = text_runs(pieces)
    robot = [r for r in runs if r.text == "🤖"]
    assert len(robot) == 1 and len(robot[0].tokens) == 3 and pieces[robot[0].tokens[1]].text == ""
    assert pieces[robot[0].tokens[-1]].lead == 2
    assert sum(r.text.count("🤖") for r in runs) == 1 and "\u2205" not in "".join(r.text for r in runs)


def test_special_tokens_are_one_run_of_their_own_kind(tok):
    ids = encode(tok, STEP)
    runs, _ = text_runs(token_pieces(tok, ids))
    special = [r for r in runs if r.kind == "special"]
    assert [(r.text, r.tokens) for r in special] == [("<|im_end|>", (len(ids) - 1,))]
    assert token_pieces(tok, ids)[-1].special and not token_pieces(tok, ids)[0].special
    # a special token that does not fit starts the next line whole; one longer than a
    # line is cut to it
    runs, _ = text_runs(token_pieces(tok, encode(tok, "ok<|im_end|>")), width=8)
    assert [(r.text, r.line, r.x) for r in runs] == [("ok", 0, 0), ("<|im_end", 1, 0)]
    runs, _ = text_runs(token_pieces(tok, encode(tok, "ok<|im_end|>")), width=12)
    assert [(r.text, r.line, r.x) for r in runs] == [("ok", 0, 0), ("<|im_end|>", 0, 2)]


def test_newlines_end_lines_after_a_mark(tok):
    text = "Step 1: Subtract.\n\n  27 - 15"
    ids = encode(tok, text)
    runs, _ = text_runs(token_pieces(tok, ids))
    k = tok.convert_ids_to_tokens(ids).index("\u010a\u010a\u0120")  # "\n\n " in one token
    assert [(r.text, r.line, r.x, r.kind) for r in runs if r.tokens == (k,)] == [
        (NEWLINE_MARK, 0, 17, "mark"), (NEWLINE_MARK, 1, 0, "mark"), (" ", 2, 0, "text")]
    assert [r.text for r in lines_of(runs)[2]] == [" ", " ", "2", "7", " -", " ", "1", "5"]


def test_wrapping_keeps_tokens_whole_and_cuts_at_max_lines(tok):
    text = ("To add 27 and 15, we need to multiply 27 by 15 and add the result to 15. This "
            "can be done by performing the following steps: straightforwardly")
    ids = encode(tok, text)
    pieces = token_pieces(tok, ids)
    for width in (8, 13, 30):
        runs, cut = text_runs(pieces, width=width)
        assert not cut and "".join(r.text for r in runs) == text
        assert all(r.x + r.width <= width for r in runs)
        for line in lines_of(runs):
            assert [r.x for r in line] == [sum(r.width for r in line[:i]) for i in range(len(line))]
        # a token is split over lines only when it is longer than a line
        for k, p in enumerate(pieces):
            parts = [r for r in runs if r.tokens == (k,)]
            assert len(parts) == 1 or len(p.text) > width
            if len(p.text) > width:
                assert "".join(r.text for r in parts) == p.text
    runs, cut = text_runs(pieces, width=13)
    assert any(len(p.text) > 13 for p in pieces)  # " straightforwardly" is split
    short, cut = text_runs(pieces, width=13, max_lines=2)
    assert cut and short == [r for r in runs if r.line < 2]
    with pytest.raises(ValueError, match="^width: expected a positive integer"):
        text_runs(pieces, width=0)


def _report(tok, *, calibrated: bool = False):
    from ktae.core.methods import Method
    from ktae.explain.report import build_report
    from ktae.groups.input import GroupInput

    ids = [encode(tok, t) for t in TEXTS[:4]]
    group = GroupInput(prompt="<|im_start|>user\nWhat is 27 + 15?<|im_end|>\n"
                       "<|im_start|>assistant\n", responses=ids, rewards=[1.0, 0.0, 1.0, 0.0])
    if calibrated:
        # TACO flags positive-credit tokens with log p + H < log(alpha) (alpha 0.01)
        group.logprobs = [[-6.0 if t % 5 == 0 else -0.2 for t in range(len(r))] for r in ids]
        group.entropies = [[0.2 + 0.3 * (t % 3) for t in range(len(r))] for r in ids]
    credit = Method(calibration="taco") if calibrated else Method()
    return build_report([group], credit=credit, tokenizer=tok)


def _drawn_figure(monkeypatch, report, **kwargs):
    """Draw the report's first group with :func:`group_png`; the figure and the renderer
    that drew it."""
    from matplotlib.figure import Figure

    from ktae.viz.report_png import group_png

    seen = []
    original = Figure.savefig

    def keep(fig, *args, **kw):
        out = original(fig, *args, **kw)
        seen.append((fig, fig.canvas.get_renderer()))
        return out

    monkeypatch.setattr(Figure, "savefig", keep)
    group_png(report, report.groups[0], kwargs.pop("path"), **kwargs)
    return seen[0]


def test_png_draws_the_runs_on_a_grid_the_font_fills(tok, tmp_path, monkeypatch):
    import numpy as np

    from ktae.viz.credit import colour
    from ktae.viz.report_png import FONT, response_runs

    report = _report(tok)
    group = report.groups[0]
    fig, renderer = _drawn_figure(monkeypatch, report, path=tmp_path / "g.png", width=40,
                                  max_lines=3)
    assert (tmp_path / "g.png").read_bytes()[:4] == b"\x89PNG"
    panels = [ax for ax in fig.axes if ax.texts and ax.get_xlim()[0] < 0]
    assert len(panels) == len(report.views) - 1  # every view but the difference
    layouts = [response_runs(r, 40, 3) for r in group.responses]
    assert layouts[0][1]  # the first response is cut at 3 lines of 40
    for ax, (key, _) in zip(panels, [v for v in report.views if v[0] != "diff"], strict=True):
        # the characters drawn on each line, column by column, with their ink, are the
        # runs' (a line's characters go out as one text per ink; specials alone, centred)
        drawn: dict[float, dict] = {}
        for t in ax.texts:
            (x, y), text = t.get_position(), t.get_text()
            if x < 0 or text == "\u2026":
                continue
            line = drawn.setdefault(round(y, 6), {})
            if t.get_fontsize() < FONT:
                line[("special", x)] = (text, t.get_color())
            else:
                for i, ch in enumerate(text):
                    if ch != " ":
                        line[round(x) + i] = (ch, t.get_color(), t.get_alpha())
        want = []
        for resp, (runs, _) in zip(group.responses, layouts, strict=True):
            for line in lines_of(runs):
                cols: dict = {}
                for r in line:
                    value = resp.values[key][r.tokens[-1]]
                    ink = "white" if abs(value) / group.scale > 0.6 else "black"
                    if r.kind == "special":
                        cols[("special", r.x + r.width / 2)] = (r.text, ink)
                        continue
                    for i, ch in enumerate(r.text):
                        if ch != " ":
                            cols[r.x + i] = (ch, ink, 1.0 if r.kind == "text" else 0.6)
                want.append(cols)
        assert [drawn[y] for y in sorted(drawn)] == [cols for cols in want if cols]
        # one cell per token of each run, in its token's colour
        cells = ax.collections[0]
        expected = [tuple(c / 255 for c in colour(resp.values[key][p], group.scale))
                    for resp, (runs, _) in zip(group.responses, layouts, strict=True)
                    for r in runs for p in r.tokens]
        np.testing.assert_allclose(cells.get_facecolors()[:, :3], np.array(expected))
        # boundary lines: between runs of different tokens on a line, and inside split
        # characters
        boundaries = sum(
            sum(1 for i, r in enumerate(runs) if i and runs[i - 1].line == r.line
                and runs[i - 1].tokens[-1] != r.tokens[0]) + sum(len(r.tokens) - 1 for r in runs)
            for runs, _ in layouts)
        assert len(ax.collections[1].get_segments()) == boundaries
    # the glyphs fill the columns: a run of n characters is n columns wide as drawn
    ax = panels[0]
    text = max((t for t in ax.texts if t.get_position()[0] >= 0 and t.get_text().isascii()
                and t.get_fontsize() == FONT), key=lambda t: len(t.get_text()))
    drawn_px = text.get_window_extent(renderer).width
    (x0, _), (x1, _) = ax.transData.transform([(0, 0), (len(text.get_text()), 0)])
    assert len(text.get_text()) >= 7 and abs(drawn_px - (x1 - x0)) <= 1.5


def test_png_outlines_flagged_tokens_in_the_calibrated_view(tok, tmp_path, monkeypatch):
    from ktae.viz.report_png import response_runs

    report = _report(tok, calibrated=True)
    group = report.groups[0]
    fig, _ = _drawn_figure(monkeypatch, report, path=tmp_path / "c.png")
    panels = {ax.texts[0].get_text(): ax for ax in fig.axes if ax.texts and ax.get_xlim()[0] < 0}
    flagged = sum(any(r.flagged[p] for p in run.tokens) for r in group.responses
                  for run in response_runs(r, 96, 6)[0])
    assert flagged > 0
    assert len(panels[report.label("final")].collections[2].get_paths()) == flagged
    assert len(panels[report.label("seq")].collections[2].get_paths()) == 0


def test_terminal_writes_the_decoded_text_with_alternating_underline(tok):
    from rich.console import Console

    from ktae.viz.report_terminal import print_report, response_text

    report = _report(tok)
    group = report.groups[0]
    for resp, text in zip(group.responses, TEXTS[:4], strict=True):
        line = response_text(resp, "token", group.scale, boundaries=True)
        assert line.plain == text.replace("\n", NEWLINE_MARK + "\n")
        runs, _ = text_runs(resp.pieces)
        spans = [s for s in line.spans]
        assert len(spans) == len(runs)
        shade = False
        for i, (span, run) in enumerate(zip(spans, runs, strict=True)):
            if i and run.tokens != runs[i - 1].tokens:
                shade = not shade
            assert line.plain[span.start:span.end] == run.text
            assert ("underline" in span.style) == shade
            assert ("italic" in span.style) == (run.kind == "special")
    console = Console(record=True, width=200, color_system="truecolor")
    print_report(report, console, view="token")
    out = console.export_text()
    assert "Step 1: Add both numbers.\u21b5\n27 + 15 = 42\u21b5\n" in out
    assert "Très bien! 😀<|im_end|>" in out and "every other token underlined" in out


def test_character_level_rendering_is_kept():
    from rich.console import Console

    from ktae.core.methods import Method
    from ktae.explain.report import build_report
    from ktae.groups.input import GroupInput
    from ktae.models import build_char_tokenizer
    from ktae.viz.report_html import VISIBLE
    from ktae.viz.report_terminal import print_report, response_text

    tok = build_char_tokenizer()
    texts = ["37+45=82. 82-18=64. \\boxed{64}", "37+45=72. 72-18=54. \\boxed{54}"]
    ids = [tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for t in texts]
    report = build_report([GroupInput(prompt="Q:37+45-18 A:", responses=ids, rewards=[1.0, 0.0])],
                          credit=Method(), tokenizer=tok)
    group = report.groups[0]
    assert one_character_per_token(p for r in group.responses for p in r.pieces)
    for resp, text in zip(group.responses, texts, strict=True):
        # as before: one cell per character, spaces as "·", no boundary underline
        line = response_text(resp, "token", group.scale, boundaries=False)
        assert line.plain == "".join(VISIBLE.get(ch, ch) for ch in text) + "<eos>"
        assert not any("underline" in s.style for s in line.spans)
        runs, _ = text_runs(resp.pieces, mark_spaces=True)
        assert [r.text for r in runs] == [VISIBLE.get(ch, ch) for ch in text] + ["<eos>"]
        assert [r.tokens for r in runs] == [(k,) for k in range(len(text) + 1)]
    console = Console(record=True, width=120, color_system="truecolor")
    print_report(report, console)
    out = console.export_text()
    assert "37+45=82.\u00b782-18=64.\u00b7\\boxed{64}<eos>" in out
    assert "every other token underlined" not in out


def test_incremental_decoding_joins_a_split_character_too():
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<eos>": 1, " ": 2, "a": 3, "b": 4,
             **{f"<0x{b:02X}>": 5 + b for b in range(256)}}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    core.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Fuse()])
    bf = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<eos>", unk_token="<unk>")
    ids = bf("a é b😀", add_special_tokens=False)["input_ids"] + [bf.eos_token_id]
    assert len(ids) == 1 + 1 + 2 + 1 + 1 + 4 + 1  # é and 😀 fall back to their bytes
    pieces = token_pieces(bf, ids)
    assert all(p.raw is None for p in pieces)  # not byte-level: incremental decoding
    runs, _ = text_runs(pieces)
    assert [(r.text, r.tokens) for r in runs] == [
        ("a", (0,)), (" ", (1,)), ("é", (2, 3)), (" ", (4,)), ("b", (5,)),
        ("😀", (6, 7, 8, 9)), ("<eos>", (10,))]
    assert runs[-1].kind == "special" and pieces[-1].special
