"""LaTeX arithmetic (docs/claims.md, LaTeX): each form read with its verdict and the
characters it labels in the original text, the forms that are skipped (both on
ktae.tasks.claims and on tests/claims_reference.py), the rewrite that keeps every
position, and the labels on SmolLM2's real tokens."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from claims_reference import latex_plain, reference_claims
from test_viz_bpe import smollm2_tokenizer

from ktae.tasks.claims import claim_labels, claim_token_labels, find_claims
from ktae.tasks.claims_latex import plain_math
from ktae.viz.tokens import token_pieces

FIXTURE = Path(__file__).parent / "data" / "smollm2_arithmetic_samples.jsonl.gz"


def module(text: str, answer=None) -> list[tuple[str, bool]]:
    """(labelled text of the original, verdict) of each claim, in the order of results."""
    return [(" ".join(text[a:b] for a, b in c.labelled), c.correct)
            for c in find_claims(text, answer)]


def reference(text: str, answer=None) -> list[tuple[str, bool]]:
    claims = sorted(reference_claims(text, answer), key=lambda c: c[1][0])
    return [(" ".join(text[a:b] for a, b in spans), ok) for _, spans, ok in claims]


BOTH = pytest.mark.parametrize("read", [module, reference], ids=["module", "reference"])


@pytest.mark.parametrize("text, expected", [
    # delimiters: inline, display, dollars
    (r"\( 6 \times 7 = 42 \)", [("42", True)]),
    (r"\(6 \times 7 = 43\)", [("43", False)]),
    (r"\[ 3 + 4 = 8 \]", [("8", False)]),
    (r"$12 \div 4 = 3$", [("3", True)]),
    (r"$$2 \ast 3 = 7$$", [("7", False)]),
    (r"$3 + 4 = 7$.", [("7", True)]),
    (r"we get: $-3 + 5 = 2$", [("2", True)]),
    # operators with and without spaces, and without delimiters
    (r"5 \cdot 3 = 15", [("15", True)]),
    (r"6\times7=42", [("42", True)]),
    (r"6 \times 7 = 42", [("42", True)]),
    (r"20 \div 4 \div 5 = 1", [("1", True)]),
    (r"\left( 3 + 4 \right) \times 2 = 14", [("14", True)]),
    (r"3 + 4 &= 7", [("7", True)]),
    # fractions of two numbers are one operand
    (r"\frac{12}{4} = 3", [("3", True)]),
    (r"\dfrac{7}{2} = 3.5", [("3.5", True)]),
    (r"\tfrac{1}{3} = 0.33", [("0.33", True)]),
    (r"2 \div \frac{12}{4} = 0.67", [("0.67", True)]),  # 2 / (12/4), not (2/12)/4
    (r"\frac{3}{4} + \frac{1}{4} = 2", [("2", False)]),
    (r"\frac{-6}{4} = -1.5", [("-1.5", True)]),
    (r"12 \div 4 = \frac{12}{4} = 3", [(r"\frac{12}{4}", True), ("3", True)]),
    # braces, units, thousands
    (r"6 \times 7 = {42}", [("42", True)]),
    (r"{6} \times {7} = {41}", [("41", False)]),
    (r"6 \times 7 = 42 \text{ apples}", [("42", True)]),
    (r"1{,}000 + 1 = 1{,}001", [("1{,}001", True)]),
    (r"1\,000 \times 3 = 3\,001", [(r"3\,001", False)]),
    (r"\$5 + \$3 = \$8", [("8", True)]),
    # chains across commands: the whole right side is labelled in the original text
    (r"3 \times 4 = 12 = 6 \times 2", [("12", True), (r"6 \times 2", True)]),
    (r"2 \times 3 = 6 \times 1 = 6", [("6", True), ("6", True)]),
    # remainders after a closing delimiter
    (r"$7 \div 2 = 3$ remainder 1", [("3 1", True)]),
])
@BOTH
def test_latex_forms_are_read_with_their_spans(read, text, expected):
    assert read(text) == expected


@pytest.mark.parametrize("text, answer, expected", [
    (r"The answer is \( \boxed{42} \)", 42, [("42", True)]),
    (r"$\boxed{41}$", 42, [("41", False)]),
    (r"6 \times 7 = \boxed{42}", 42, [("42", True)]),  # the answer marker, not the equation
])
@BOTH
def test_latex_answers(read, text, answer, expected):
    assert read(text, answer) == expected


@pytest.mark.parametrize("text", [
    r"\frac{\frac{1}{2}}{3} = 0.17",       # a nested fraction
    r"\frac{1 + 2}{3} = 1",                # an expression in a fraction
    r"\frac{x}{2} = 3",
    r"\frac12 = 0.5",                      # the short form
    r"\frac {1}{2} = 0.5",                 # a space before the braces
    r"2\frac{1}{2} = 2.5",                 # a mixed number or a product
    r"2 \frac{1}{2} = 2.5",
    r"1 + 2\frac{1}{2} = 3.5",
    r"2\sqrt{4} = 4", r"\sqrt{16} + 1 = 5", r"2^{3} + 1 = 9", r"3 + 4 = 7^{2}",
    r"x_{1} + 3 = 5", r"a_{2} + 3 = 5",
    r"3 \pm 1 = 4", r"2 \times \pi = 6.28", r"2\pi = 6.28",
    r"3 + 4 = 7\%", r"50\% + 3 = 53",
    r"6 \text{ apples} \times 7 = 42",     # units inside the expression
    r"3 \times 4 = \mathbf{12}",           # a result inside a command
    r"1{,}00 + 1 = 101", r"3\,4 + 1 = 35",  # not groups of three digits
    r"\( 3 + 4 = \)", r"6 \times = 42",
    r"3 + 4 \approx 7", r"3 + 4 \neq 8",
])
@BOTH
def test_ambiguous_or_unread_latex_is_skipped(read, text):
    assert read(text, 7) == []


def test_plain_math_keeps_the_length_and_what_is_read():
    """The rewrite has the input's length; digits, ``=``, ``.``, signs and letters outside
    commands stay where they were; text without LaTeX is returned unchanged."""
    texts = [r"\( 6 \times 7 = 42 \) and $$\frac{12}{4} = 3$$, 1{,}000 \div {5} = 200 \%",
             r"x &= 3 + 4 \\ \left( 2 \right) \cdot 3 \, \; \! \: \ = 6$"]
    with gzip.open(FIXTURE, "rt", encoding="utf-8") as f:
        texts += [json.loads(line)["response"] for line in f]
    for text in texts:
        plain = plain_math(text)
        assert plain == latex_plain(text)  # the reference's own rewrite
        assert len(plain) == len(text)
        for k, (a, b) in enumerate(zip(text, plain, strict=True)):
            if a in "0123456789=.-":
                assert b == a, (text, k)
        if not any(c in text for c in "\\${&"):
            assert plain is text


def test_plain_math_rewrites():
    assert plain_math(r"\frac{12}{4}") == "(     12 /4)"
    assert plain_math(r"6\times7") == "6\u00d7     7"
    assert plain_math(r"$12 \div 4 = 3$") == "$12 \u00f7    4 = 3 "
    assert plain_math(r"1\,000 and 6\, x") == r"1\,000 and 6   x"
    assert plain_math(r"{{42}}") == "  42  "
    assert plain_math(r"\boxed{42}") == r"\boxed{42}"  # a command's argument keeps its braces
    assert plain_math(r"40\%") == "40 %"


def test_plain_math_needs_a_string():
    with pytest.raises(ValueError, match=r"^text: expected a string, got int$"):
        plain_math(3)


def test_character_labels_fall_on_the_original_digits():
    text = r"We get \( 6 \times 7 = 41 \), so \[ 1{,}000 \div 8 = 125 \]."
    labels = claim_labels(text)
    assert len(labels) == len(text)
    assert [text[k] for k, lab in enumerate(labels) if lab == "w"] == ["4", "1"]
    assert [text[k] for k, lab in enumerate(labels) if lab == "r"] == ["1", "2", "5"]


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return smollm2_tokenizer(tmp_path_factory.mktemp("smollm2"))


@pytest.mark.parametrize("text, answer, wrong, right", [
    (r"\( 6 \times 7 = 41 \)", None, ["4", "1"], []),
    (r"$12 \div 4 = 3$ and 5 \cdot 3 = 16", None, ["1", "6"], ["3"]),
    (r"\frac{12}{4} = 3, so 1{,}000 + 1 = 1{,}002", None, ["1", "{", ",", "}", "0", "0", "2"],
     ["3"]),
    (r"So the answer is \(\boxed{42}\).", "42", [], ["4", "2"]),
])
def test_latex_labels_on_smollm2_tokens(tok, text, answer, wrong, right):
    """The tokens labelled are exactly those holding a result's characters in the
    original text (LaTeX tokens around them are not labelled)."""
    ids = tok(text, add_special_tokens=False)["input_ids"]
    pieces = [p.text for p in token_pieces(tok, ids)]
    assert "".join(pieces) == text
    labels = claim_token_labels(tok, ids, answer)
    assert [p.strip() for p, lab in zip(pieces, labels, strict=True) if lab == "w"] == wrong
    assert [p.strip() for p, lab in zip(pieces, labels, strict=True) if lab == "r"] == right
