"""Both claim labellers on responses whose claims are known by construction
(ktae.tasks.claims_grammar, docs/claims.md Checks): no wrong verdict, no missed claim of a
supported form, no claim where the grammar wrote none, the same labelled characters."""

from __future__ import annotations

import functools
import random
from collections import Counter

import pytest
from claims_reference import reference_claims

from ktae.tasks.claims import find_claims
from ktae.tasks.claims_grammar import generate_response

RESPONSES = 12_000


@functools.cache
def _responses():
    rng = random.Random(20240611)
    return [generate_response(rng) for _ in range(RESPONSES)]


def _expected(g) -> dict:
    return {(c.kind, c.spans): c.correct for c in g.claims}


def test_the_grammar_writes_every_kind_and_both_verdicts():
    kinds = Counter((c.kind, c.correct) for g in _responses()[:2000] for c in g.claims)
    assert {k for k in kinds} == {(kind, ok) for kind in ("equation", "remainder", "answer")
                                  for ok in (True, False)}
    assert min(kinds.values()) > 50


@pytest.mark.parametrize("labeller", ["module", "reference"])
def test_generated_claims(labeller):
    wrong = []
    claims = 0
    for g in _responses():
        if labeller == "module":
            got = {(c.kind, c.labelled): c.correct for c in find_claims(g.text, g.answer)}
        else:
            got = {(k, spans): ok for k, spans, ok in reference_claims(g.text, g.answer)}
        expected = _expected(g)
        claims += len(expected)
        if got != expected:
            wrong.append((g.text, sorted(expected.items()), sorted(got.items())))
    assert not wrong, (len(wrong), wrong[:3])
    assert claims > 3 * RESPONSES


def test_generator_bad_input():
    with pytest.raises(ValueError, match="rng"):
        generate_response(7)
    with pytest.raises(ValueError, match="fragments"):
        generate_response(random.Random(0), fragments=0)
