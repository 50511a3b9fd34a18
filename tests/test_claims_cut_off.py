"""Responses cut at the token budget (docs/claims.md, Cut-off responses): a claim the end of
the text leaves open is skipped, a claim something closes is read as in a response that
ended; a claim read in a cut-off prefix is read the same in the whole response (checked at
every cut of real and generated responses), and by the independent reference
(tests/claims_reference.py) the same way; through the labeller, the token labels and the
audit's per-response labelling."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import pytest
from claims_reference import reference_claims
from test_viz_bpe import smollm2_tokenizer

from ktae.credit_audit.arith_input import claims_labels, cut_off_rows, run_stop_ids
from ktae.tasks.claims import claim_labels, claim_token_labels, find_claims, has_false_claim
from ktae.tasks.claims_grammar import generate_response

FIXTURE = Path(__file__).parent / "data" / "smollm2_arithmetic_samples.jsonl.gz"


def module(text: str, answer=None, *, cut_off: bool) -> list[tuple[str, bool]]:
    return [(" ".join(text[a:b] for a, b in c.labelled), c.correct)
            for c in find_claims(text, answer, cut_off=cut_off)]


def reference(text: str, answer=None, *, cut_off: bool) -> list[tuple[str, bool]]:
    claims = sorted(reference_claims(text, answer, cut_off), key=lambda c: c[1][0])
    return [(" ".join(text[a:b] for a, b in spans), ok) for _, spans, ok in claims]


BOTH = pytest.mark.parametrize("read", [module, reference], ids=["module", "reference"])


@pytest.mark.parametrize("text, answer, ended", [
    # the result runs to the end, or only spaces follow it
    ("6 * 6 = 3", None, [("3", False)]),             # 36 was being written
    ("6 * 6 = 36 ", None, [("36", True)]),           # "36 + 1 = 37" could follow
    ("6 * 6 = 36\t", None, [("36", True)]),
    ("6 * 6 = 36.", None, [("36", True)]),           # 36.5
    ("6 * 6 = 1,", None, [("1", False)]),            # 1,296
    ("2 + 3 = 4 + 1", None, [("4 + 1", True)]),      # "= 6" would make 4 the running value
    ("7 / 2 = 3 rem", None, [("3", False)]),         # "remainder 1"
    ("7 / 2 = 3 with a", None, [("3", False)]),
    ("6 x 6 = 3 x", None, [("3", False)]),           # "3 x 12 = 36"
    ("2 + 3 = 5 =", None, [("5", True)]),            # "==" is no link
    (r"6 \times 7 = 42 \ti", None, [("42", True)]),  # "\times 1 = 42"
    (r"\( 6 \times 7 = 42 \)", None, [("42", True)]),
    ("The answer is 42", "42", [("42", True)]),      # 420
    ("#### 4", "42", [("4", False)]),
    ("\\boxed{42}", "42", [("42", True)]),
])
@BOTH
def test_a_claim_the_end_leaves_open_is_skipped(read, text, answer, ended):
    assert read(text, answer, cut_off=False) == ended
    assert read(text, answer, cut_off=True) == []


@pytest.mark.parametrize("text, answer, expected", [
    ("6 * 6 = 35 apples", None, [("35", False)]),
    ("6 * 6 = 35 ap", None, [("35", False)]),        # a word that begins no open word
    ("6 * 6 = 35. So", None, [("35", False)]),
    ("6 * 6 = 35! ", None, [("35", False)]),
    ("6 * 6 = 35;x", None, [("35", False)]),
    ('The answer is "42" ', "42", [("42", True)]),
    ("6 * 6 = 35?", None, []),                       # the mark needs a character after it
    ("6 * 6 = 35\n", None, [("35", False)]),         # a line break closes
    ("2 + 3 = 5 + 1 = 6", None, [("5", True)]),      # "=" then a character closes the link
    ("7 / 2 = 3 remainder 1 left", None, [("3 1", True)]),
    ("7 / 2 = 3 with 1 left", None, [("3", False)]),
    ("5 + 5 = 11 and 2 + 2 = 4", None, [("11", False)]),
    ("3 + 4 = 7\n#### 7", "7", [("7", True)]),
    (r"$3 + 4 = 8$ and", None, [("8", False)]),
])
@BOTH
def test_a_claim_something_closes_is_read_when_cut_off(read, text, answer, expected):
    assert read(text, answer, cut_off=True) == expected
    ended = read(text, answer, cut_off=False)
    assert all(c in ended for c in expected)


def test_a_response_that_ended_keeps_every_claim():
    text = "So 6 * 6 = 3"
    assert claim_labels(text) == "...........w"
    assert claim_labels(text, cut_off=False) == claim_labels(text)
    assert claim_labels(text, cut_off=True) == "." * len(text)
    assert has_false_claim(text) and not has_false_claim(text, cut_off=True)


@pytest.mark.parametrize("bad", [1, 0, None, "yes", 1.0])
def test_cut_off_must_be_a_bool(bad):
    with pytest.raises(ValueError, match=r"^cut_off: expected True or False, got "):
        find_claims("1 + 1 = 2", cut_off=bad)
    with pytest.raises(ValueError, match=r"^cut_off: expected True or False"):
        claim_labels("1 + 1 = 2", cut_off=bad)


def _responses() -> list[tuple[str, str]]:
    with gzip.open(FIXTURE, "rt", encoding="utf-8") as f:
        real = [json.loads(line) for line in f]
    rng = random.Random(7)
    out = [(r["response"], r["answer"]) for r in real[::8]]
    for _ in range(60):
        g = generate_response(rng)
        out.append((g.text, g.answer))
    out += [(r"We get \( 6 \times 7 = 42 \), and $$\frac{12}{4} = 3$$ so 1{,}000 + 1 = "
             r"1{,}001 \text{ books}. Then 7 / 2 = 3 (with a remainder of 1) and 2 + 3 = 5 "
             r"+ 1 = 6.", "42")]
    return out


def _key(c) -> tuple:
    return c.kind, c.labelled, c.correct


def test_a_claim_read_in_a_cut_off_prefix_is_read_the_same_in_the_whole_response():
    """At every cut of 63 SmolLM2 responses, 60 generated ones and a LaTeX one: each
    claim of the prefix read as cut off is a claim of the whole response, with the same
    labelled spans and verdict (what follows the cut cannot change it)."""
    checked = 0
    for text, answer in _responses():
        whole = {_key(c) for c in find_claims(text, answer)}
        for k in range(len(text) + 1):
            for c in find_claims(text[:k], answer, cut_off=True):
                assert _key(c) in whole, (text[:k], c)
                checked += 1
    assert checked > 5_000


def test_the_reference_agrees_at_every_cut():
    """Module and reference read the same claims at every cut of 20 SmolLM2 responses, 20
    generated ones and a LaTeX one, as cut off."""
    responses = _responses()
    checked = 0
    for text, answer in responses[:20] + responses[63:83] + responses[-1:]:
        for k in range(len(text) + 1):
            got = {(c.kind, c.labelled, c.correct)
                   for c in find_claims(text[:k], answer, cut_off=True)}
            assert got == set(reference_claims(text[:k], answer, True)), text[:k]
            checked += len(got)
    assert checked > 1_000


def test_a_cut_after_a_line_break_keeps_the_claims_before_it():
    """Claims never read past a line break, so a cut just after one skips nothing."""
    seen = 0
    for text, answer in _responses():
        for k in (i + 1 for i, ch in enumerate(text) if ch == "\n"):
            assert find_claims(text[:k], answer, cut_off=True) == find_claims(text[:k], answer)
            seen += bool(find_claims(text[:k], answer))
    assert seen > 50


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return smollm2_tokenizer(tmp_path_factory.mktemp("smollm2"))


def test_token_labels_of_a_cut_off_response(tok):
    ids = tok("So 6 * 6 = 3", add_special_tokens=False)["input_ids"]
    assert claim_token_labels(tok, ids)[-1] == "w"
    assert set(claim_token_labels(tok, ids, cut_off=True)) == {"."}
    stopped = ids + [tok.eos_token_id]  # the same text, ended by the model
    assert claim_token_labels(tok, stopped, cut_off=False)[-2:] == ["w", "."]


def test_the_audit_labels_each_response_with_its_own_flag(tok):
    responses = [tok(t, add_special_tokens=False)["input_ids"]
                 for t in ("So 6 * 6 = 3", "So 6 * 6 = 3", "6 * 6 = 35 apples")]
    labels = claims_labels(tok, responses, "36", [False, True, True])
    assert labels[0].endswith("w") and "w" not in labels[1] and labels[2].count("w") == 2
    assert claims_labels(tok, responses, "36") == claims_labels(tok, responses, "36",
                                                                 [False] * 3)
    with pytest.raises(ValueError, match=r"^cut_off: expected one flag per response \(3\), "
                                         r"got 2$"):
        claims_labels(tok, responses, "36", [True, False])


def test_a_recorded_response_is_cut_off_when_it_does_not_end_with_a_stop_token(tok):
    eos, pad = tok.eos_token_id, tok.pad_token_id
    assert cut_off_rows([[5, eos], [5, 6], [], [5, pad]], [eos, pad]) == [False, True, False,
                                                                           False]
    assert run_stop_ids({"ignore_token_ids": [0, 2]}, tok) == [0, 2]
    assert run_stop_ids({}, tok) == [i for i in (eos, pad) if i is not None]


def _script():
    import importlib.util

    path = Path(__file__).parent.parent / "studies" / "claims" / "claims_cut_off.py"
    spec = importlib.util.spec_from_file_location("claims_cut_off", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def test_cut_off_counts_on_smollm2_samples():
    """studies/claims/claims_cut_off.py on the 500 responses: the counts
    studies/claims/report.md (Cut-off responses) reports; each skipped claim is the last
    claim of its response."""
    with gzip.open(FIXTURE, "rt", encoding="utf-8") as f:
        records = [json.loads(line) for line in f]
    counts, notes = _script().compare(records, 96)
    assert counts == {"responses": 500, "cut off": 188, "claims as ended": 198,
                      "false as ended": 148, "claims as cut off": 186, "false as cut off": 138,
                      "skipped": 12, "skipped false": 10}
    assert len(notes) == 12
    assert any(n.endswith("37 + 37 = 7'") for n in notes)  # 74, cut after its first digit
    counts, _ = _script().compare(records, 95)  # another budget: the 3 responses of 95 ids
    assert counts["cut off"] == 3


def test_cut_off_script_prints_the_counts(capsys, tmp_path):
    path = tmp_path / "two.jsonl"
    path.write_text(json.dumps({"response": "So 6 * 6 = 3", "answer": "36",
                                "response_ids": [1, 2, 3]}) + "\n"
                    + json.dumps({"response": "So 6 * 6 = 3", "answer": "36",
                                  "response_ids": [1, 2]}) + "\n")
    _script().main([str(path), "--max-new-tokens", "3", "--list"])
    out = capsys.readouterr().out.splitlines()
    assert out[:5] == ["responses          2", "cut off            1",
                       "claims as ended    1 (1 false)", "claims as cut off  0 (0 false)",
                       "skipped            1 (1 false)"]
    assert out[5] == "None false: 'So 6 * 6 = 3'"
    with pytest.raises(SystemExit):
        _script().main([str(path), "--max-new-tokens", "0"])
