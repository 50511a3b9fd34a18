"""The claim labeller (docs/claims.md): hand-made responses, the independent reference
(tests/claims_reference.py) on random texts and on 500 responses of SmolLM2-135M-Instruct."""

from __future__ import annotations

import gzip
import json
import os
import random
from fractions import Fraction
from pathlib import Path

import pytest
from claims_reference import reference_labels

from ktae.tasks import token_labels
from ktae.tasks.claims import (
    claim_labels,
    claim_token_labels,
    final_answer,
    find_claims,
    find_numbers,
    has_false_claim,
    parse_answer,
)

FIXTURE = Path(__file__).parent / "data" / "smollm2_arithmetic_samples.jsonl.gz"
REQUIRE = os.environ.get("KTAE_REQUIRE_REAL_MODEL") == "1"


def marked(text: str, answer=None) -> list[tuple[str, str]]:
    """The labelled runs of ``text``: (characters, label) for each run of ``r`` or ``w``."""
    labels = claim_labels(text, answer)
    assert len(labels) == len(text)
    out, k = [], 0
    while k < len(labels):
        if labels[k] == ".":
            k += 1
            continue
        j = k
        while j < len(labels) and labels[j] == labels[k]:
            j += 1
        out.append((text[k:j], labels[k]))
        k = j
    return out


@pytest.mark.parametrize("text, expected", [
    ("23 + 48 = 100", [("100", "w")]),
    ("23 + 48 = 71", [("71", "r")]),
    ("156 - 89 = 21", [("21", "w")]),
    ("so Ben has 85 + 38 = 229 books.", [("229", "w")]),
    ("17 + 25 = 42 apples, then 42 - 5 = 37.", [("42", "r"), ("37", "r")]),
    ("12 * 4 = 48 and 12 × 4 = 48 and 12 x 4 = 49", [("48", "r"), ("48", "r"), ("49", "w")]),
    ("84 / 7 = 12, 84 ÷ 7 = 11", [("12", "r"), ("11", "w")]),
    ("5 − 8 = −3 and 5 - 8 = -3 and 5 - 8 = 3", [("−3", "r"), ("-3", "r"), ("3", "w")]),
])
def test_equations_true_and_false(text, expected):
    assert marked(text) == expected


@pytest.mark.parametrize("text, expected", [
    ("2 + 3 * 4 = 14", [("14", "r")]),          # usual precedence
    ("2 + 3 * 4 = 20", [("20", "w")]),          # left to right is not the reading
    ("20 / 2 / 5 = 2", [("2", "r")]),
    ("28 + 23 - 21 = 30", [("30", "r")]),
    ("28 + 23 - 21 = 40", [("40", "w")]),
    ("2 + 3 = 5 + 4 = 9", [("5", "r"), ("9", "r")]),  # a running chain, link by link
    ("2 + 3 = 5 = 5", [("5", "r"), ("5", "r")]),  # "5 = 5" continues a claimed chain
    ("x = 3 + 5 = 8", [("8", "r")]),
    ("(15 + 79) = 225 coins", [("225", "w")]),     # a bracketed left side
    ("( 15 + 79 ) = 94", [("94", "r")]),
    ("sum (56+36=92). He", [("92", "r")]),         # an equation inside brackets
    ("[16 * 16 = 192]", [("192", "w")]),
    ("(3 + 4) * 2 = 14", [("14", "r")]),          # brackets are evaluated
    ("2 * (3 + 4) = 15", [("15", "w")]),
    ("((3 + 4)) = 7", [("7", "r")]),
    ("-3 + 5 = 2", [("2", "r")]),                  # a signed first operand
    ("3 + 4 = 3/4", [("3/4", "w")]),               # the right side's value
    ("1 / 4 = 1/4", [("1/4", "r")]),
])
def test_chains(text, expected):
    assert marked(text) == expected


@pytest.mark.parametrize("text, expected", [
    ("1,234 + 1 = 1,235", [("1,235", "r")]),
    ("1,000 * 3 = 3,001", [("3,001", "w")]),
    ("$50 - $36 = $14", [("14", "r")]),         # the $ is not labelled
    ("1.5 + 2.25 = 3.75", [("3.75", "r")]),
    ("10 / 3 = 3.33", [("3.33", "r")]),         # within half a unit of the last place
    ("10 / 3 = 3.3", [("3.3", "r")]),
    ("10 / 3 = 3.34", [("3.34", "w")]),
    ("10 / 3 = 3", [("3", "w")]),               # an integer result must be exact
    ("7 / 2 = 3.5", [("3.5", "r")]),
])
def test_number_forms_and_rounding(text, expected):
    assert marked(text) == expected


@pytest.mark.parametrize("text", [
    "x2 + 3 = 5", "3rd + 4 = 7", "x + 3 = 5", "2^3 + 1 = 9", "1 234 + 1 = 1 235",
    "3 + 4) = 7", "(3 + 4)) = 7", "f(3 + 4) = 7", "2(3 + 4) = 14", "so -3 + 10 = 7",
    "17 apples + 25 = 42", "50% + 3 = 53", "3 + 4 = 7%", "- 3 + 10 = 7", "5 – 2 = 3",
    "3 + 4 =\n7", "3 +\n4 = 7", "5 / 0 = 0", "3 + 4 = - 7", "2 ** 3 = 8", "H2O + 1 = 3",
    "3.14.15 + 1 = 4", "1,23 + 1 = 2", "y x 3 + 4 = 7", "3 + 4 == 7",
])
def test_unreadable_claims_are_ignored(text):
    assert marked(text, answer=7) == []


def test_markdown_bold_is_not_an_operator():
    assert marked("**23 + 48 = 71**") == [("71", "r")]
    assert marked("* 23 + 48 = 71") == [("71", "r")]  # a list bullet
    assert marked("so * 23 + 48 = 71") == []  # a single * mid-line: an operand may be missing


@pytest.mark.parametrize("text, expected", [
    ("So the answer is 42.", [("42", "r")]),
    ("The final answer is: 41", [("41", "w")]),
    ("Answer: 42", [("42", "r")]),
    ("**Answer:** 42 apples", [("42", "r")]),
    ("**Answer**: 43", [("43", "w")]),
    ("ANSWER IS **42**", [("42", "r")]),
    ("\\boxed{42}", [("42", "r")]),
    ("\\boxed{ 41 }", [("41", "w")]),
    ("\\boxed{40 + 2}", []),
    ("the answer is 40 + 2 = 42", [("42", "r")]),  # an equation, not an answer claim
    ("answers: 42", []),
    ("Tom has 42 apples.", []),
])
def test_answer_claims(text, expected):
    assert marked(text, answer=42) == expected


def test_answer_claims_need_the_answer():
    assert marked("So the answer is 42.") == []
    assert marked("the answer is 3.5", answer="7/2") == [("3.5", "r")]
    assert marked("the answer is 1,234", answer="1234") == [("1,234", "r")]


def test_claim_records():
    text = "Tom has 17 + 25 = 32 apples. So the answer is 42."
    claims = find_claims(text, answer=42)
    assert [(c.kind, c.correct) for c in claims] == [("equation", False), ("answer", True)]
    eq = claims[0]
    assert text[eq.start:eq.end] == "17 + 25 = 32"
    assert text[eq.result_start:eq.result_end] == "32"
    assert (eq.stated, eq.expected) == (32, 42)
    assert has_false_claim(text, 42) and not has_false_claim("17 + 25 = 42", 42)
    assert final_answer(text, 42).stated == 42
    assert final_answer("no answer here") is None


def test_numbers():
    got = [(n.value, n.places) for n in find_numbers("1,234.5 and $7, 1 000, 3rd, x2, **4**.")]
    assert got == [(Fraction(24690, 20), 1), (7, 0), (1, 0), (0, 0), (4, 0)]


def test_bad_input():
    with pytest.raises(ValueError, match="text: expected a string"):
        claim_labels(None)
    with pytest.raises(ValueError, match="answer: expected a number"):
        parse_answer("forty")
    with pytest.raises(ValueError, match="answer: expected a number"):
        find_claims("1 + 1 = 2", answer=[2])


def test_results_split_across_tokens():
    """BPE pieces with a leading space: every piece holding a character of the result is
    marked, the others are not."""
    text = "23 + 48 = 100 apples"
    pieces = ["23", " +", " 4", "8", " =", " 1", "00", " apples"]
    assert token_labels(claim_labels(text), pieces) == [".", ".", ".", ".", ".", "w", "w", "."]
    pieces = ["23 + 48 =", " ", "7", "1", " apples"]
    assert token_labels(claim_labels("23 + 48 = 71 apples"), pieces) == [".", ".", "r", "r", "."]


def _grammar_text(rng: random.Random) -> str:
    pieces = ["12", "7", "0", "1,234", "1 234", "3.5", "$4", "2.25", "100", " + ", " - ", "-",
              "(", ")", " (", ") ", "[", "]",
              " x ", "x", " * ", "*", "**", " / ", " \u00d7 ", "\u2212", "\u00f7", "=", " = ",
              "answer is ", "Answer: ", "ANSWER** is: ", "\\boxed{", "}", " ", "\t", "\n",
              "a", "%", "(", ")", ".", ",", "^", "rd", "_"]
    return "".join(rng.choice(pieces) for _ in range(rng.randint(1, 12)))


def test_reference_agrees_on_random_texts():
    """Texts built at random from the specification's pieces: both implementations give
    the same labels (and the sample holds both kinds of claims)."""
    rng = random.Random(7)
    seen = set()
    for _ in range(4000):
        text = _grammar_text(rng)
        for answer in (None, 7, "3.5"):
            labels = claim_labels(text, answer)
            assert labels == reference_labels(text, answer), (text, answer)
            seen.update(labels)
    assert seen == {".", "r", "w"}


def _fixture() -> list[dict]:
    with gzip.open(FIXTURE, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def test_reference_agrees_on_smollm2_samples():
    """Every label of 500 SmolLM2-135M-Instruct responses, per character and per token."""
    records = _fixture()
    assert len(records) >= 500
    claims = 0
    for rec in records:
        text = "".join(rec["response_pieces"])
        labels = claim_labels(text, rec["answer"])
        assert labels == reference_labels(text, rec["answer"]), rec["id"]
        assert token_labels(labels, rec["response_pieces"]) == \
            token_labels(reference_labels(text, rec["answer"]), rec["response_pieces"])
        claims += len(find_claims(text, rec["answer"]))
    assert claims > 200  # the samples do make claims


def test_disagreement_counts_on_smollm2_samples():
    """studies/claims/claims_disagreements.py on the 500 responses: the counts
    studies/claims/report.md reports, with no verdict that differs and no claim one labeller skips."""
    import importlib.util

    path = Path(__file__).parent.parent / "studies" / "claims" / "claims_disagreements.py"
    spec = importlib.util.spec_from_file_location("claims_disagreements", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    counts, notes = script.compare(_fixture())
    assert notes == []
    assert counts == {"responses": 500, "module": 508, "reference": 508, "agree": 508,
                      "verdict differs": 0, "module only": 0, "reference only": 0}


def test_token_labels_with_smollm2_tokenizer():
    """The fixture's ids decode to its pieces with the real tokenizer, and the labels of a
    result split into " ", "1", "0", "0" mark the digits' tokens."""
    from transformers import AutoTokenizer

    from ktae.models import smollm2

    if not smollm2.is_prepared():
        if REQUIRE:
            pytest.fail("KTAE_REQUIRE_REAL_MODEL=1 but smollm2-135m is not prepared")
        pytest.skip("smollm2-135m is not prepared")
    tok = AutoTokenizer.from_pretrained(smollm2.cache_dir())
    for rec in _fixture()[:50]:
        got = claim_token_labels(tok, rec["response_ids"], rec["answer"])
        assert got == token_labels(claim_labels("".join(rec["response_pieces"]), rec["answer"]),
                                   rec["response_pieces"])
    ids = tok("23 + 48 = 100 apples", add_special_tokens=False)["input_ids"]
    pieces = [tok.decode([i]) for i in ids]
    labels = claim_token_labels(tok, ids)
    assert [p for p, lab in zip(pieces, labels, strict=True) if lab == "w"] == ["1", "0", "0"]
