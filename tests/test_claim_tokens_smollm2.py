"""The claims labels mapped to SmolLM2-135M-Instruct's real tokens (the shipped tokenizer
fixture): digits are single tokens, a space before a digit is a token of its own while a
space before a word, an operator or a minus sign rides on that token; exactly the tokens of
a claim's result are labelled, whether the result spans several tokens, is followed by
punctuation or a word, carries a sign or a decimal point, or follows ``####``."""

from __future__ import annotations

import pytest
from test_viz_bpe import smollm2_tokenizer

from ktae.tasks.claims import claim_token_labels, find_claims
from ktae.viz.tokens import token_pieces


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return smollm2_tokenizer(tmp_path_factory.mktemp("smollm2"))


def pieces_and_labels(tok, text: str, answer=None) -> list[tuple[str, str]]:
    ids = tok(text, add_special_tokens=False)["input_ids"]
    pieces = [p.text for p in token_pieces(tok, ids)]
    assert "".join(pieces) == text
    return list(zip(pieces, claim_token_labels(tok, ids, answer), strict=True))


def test_digits_are_single_tokens_and_a_space_before_a_digit_is_its_own(tok):
    assert pieces_and_labels(tok, "1") == [("1", ".")]
    assert pieces_and_labels(tok, " 1") == [(" ", "."), ("1", ".")]
    assert [p for p, _ in pieces_and_labels(tok, "12345")] == list("12345")
    assert [p for p, _ in pieces_and_labels(tok, " apples =")] == [" apples", " ="]


@pytest.mark.parametrize(("text", "answer", "expected"), [
    # a result split across tokens: "= 123" -> " =", " ", "1", "2", "3"
    ("3 + 4 = 123", None, [("3", "."), (" +", "."), (" ", "."), ("4", "."), (" =", "."),
                           (" ", "."), ("1", "w"), ("2", "w"), ("3", "w")]),
    # a result followed by punctuation
    ("12+3=15.", None, [("1", "."), ("2", "."), ("+", "."), ("3", "."), ("=", "."),
                        ("1", "r"), ("5", "r"), (".", ".")]),
    ("So 7 * 8 = 54, then", None, [("So", "."), (" ", "."), ("7", "."), (" *", "."),
                                   (" ", "."), ("8", "."), (" =", "."), (" ", "."),
                                   ("5", "w"), ("4", "w"), (",", "."), (" then", ".")]),
    ("3+4=8!", None, [("3", "."), ("+", "."), ("4", "."), ("=", "."), ("8", "w"),
                      ("!", ".")]),
    # followed by a word whose leading space rides on it
    ("3 + 4 = 7 apples", None, [("3", "."), (" +", "."), (" ", "."), ("4", "."),
                                (" =", "."), (" ", "."), ("7", "r"), (" apples", ".")]),
    # a sign rides with its space: the sign's token is the result's
    ("3 - 8 = -5.", None, [("3", "."), (" -", "."), (" ", "."), ("8", "."), (" =", "."),
                           (" -", "r"), ("5", "r"), (".", ".")]),
    ("7/2=3.6", None, [("7", "."), ("/", "."), ("2", "."), ("=", "."), ("3", "w"),
                       (".", "w"), ("6", "w")]),
    # "####" answers, right and wrong, after an equation
    ("#### 42", "42", [("####", "."), (" ", "."), ("4", "r"), ("2", "r")]),
    ("#### 41", "42", [("####", "."), (" ", "."), ("4", "w"), ("1", "w")]),
    ("5 + 5 = 10\n#### 11", "10", [("5", "."), (" +", "."), (" ", "."), ("5", "."),
                                   (" =", "."), (" ", "."), ("1", "r"), ("0", "r"),
                                   ("\n", "."), ("####", "."), (" ", "."), ("1", "w"),
                                   ("1", "w")]),
    ("The answer is 43.", "42", [("The", "."), (" answer", "."), (" is", "."), (" ", "."),
                                 ("4", "w"), ("3", "w"), (".", ".")]),
    # the numbers of the question are not claims; the end-of-turn token is not labelled
    ("He has 12 apples. 12 + 30 = 42<|im_end|>", None,
     [("He", "."), (" has", "."), (" ", "."), ("1", "."), ("2", "."), (" apples", "."),
      (".", "."), (" ", "."), ("1", "."), ("2", "."), (" +", "."), (" ", "."), ("3", "."),
      ("0", "."), (" =", "."), (" ", "."), ("4", "r"), ("2", "r"), ("<|im_end|>", ".")]),
])
def test_exactly_the_results_tokens_are_labelled(tok, text, answer, expected):
    assert pieces_and_labels(tok, text, answer) == expected


SAMPLES = [
    "Step 1: 27 + 15 = 42\nStep 2: 42 - 7 = 36.\n#### 36",
    "She buys 3 packs of 12, so 3 * 12 = 36 pencils. Then 36 / 4 = 9.5 each. The answer is 9.",
    "Total: 1,200 + 300 = 1,500 dollars; 1500 - 250 = 1250.\nThe answer is 1250.<|im_end|>",
    "We get 8 x 7 = 56 and 56 + 4 = 61, \\boxed{60}",
]


@pytest.mark.parametrize("text", SAMPLES)
def test_labelled_tokens_are_those_overlapping_a_results_span(tok, text):
    """On longer text, a token is labelled exactly when it overlaps the result span of
    a claim (``w`` when a false claim's), read from :func:`find_claims` on the same text."""
    answer = "36"
    got = pieces_and_labels(tok, text, answer)
    claims = find_claims(text, answer)
    assert claims  # every sample makes a claim
    pos = 0
    for piece, label in got:
        start, end = pos, pos + len(piece)
        pos = end
        hits = [c for c in claims if c.result_start < end and start < c.result_end]
        want = "." if not hits else "w" if any(not c.correct for c in hits) else "r"
        assert label == want, (piece, start)
