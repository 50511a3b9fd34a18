"""``ngram=1`` (the default) reproduces KTAE's output from before n-gram support.

Two checks, each portable across CPUs and thread counts:

1. Live, bit for bit: ``ngram=1`` and no ``ngram`` give identical output on this machine.
2. Stored: ``tests/data/ktae_unigram_golden.npz`` holds inputs, options, advantages
   (float64 and float32 rewards) and key-token tables computed by the library before
   spans were added, on 8 batches covering both modes, both variants, all bases, ignored
   ids, chunking, empty responses and continuous rewards. They were computed on one
   machine; another CPU's vector width (or ``ATEN_CPU_CAPABILITY``) changes how float32
   sums and vectorised exp/log round, so stored floats are compared with a tolerance
   (:func:`_tolerance`), never bit for bit.

Reference mode copies two float32 decisions of the released runtime that can go either
way on another CPU: ``F = 0`` only when the float32 Fisher sum is exactly 1.0, and a
hypergeometric term joins the sum only when ``p_k <= p_obs`` in float32 (a tie of exact
probabilities can round either way). A row whose stored F this machine does not reproduce must
have taken another of the runtime's choices (:func:`_runtime_choices`), and is then checked
against this machine's own p, as the released runtime itself behaves on each machine.
"""

from __future__ import annotations

import ast
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from oracle import single_thread  # noqa: F401  (autouse fixture)

import ktae
from ktae.core.groups import group_index

GOLDEN = np.load(Path(__file__).parent / "data" / "ktae_unigram_golden.npz")
CASES = sorted({k.split("_")[0] for k in GOLDEN.files if k[0] == "c" and k[1].isdigit()})
TABLE_FIELDS = ("group", "token", "a", "b", "c", "d", "p_value", "fisher", "info_gain",
                "tf_correct", "tf_incorrect", "direction", "value")
EPS32 = float(np.finfo(np.float32).eps)


def _case(case: str) -> tuple[dict, dict, dict]:
    g = {k[len(case) + 1:]: GOLDEN[k] for k in GOLDEN.files if k.startswith(case + "_")}
    opts = ast.literal_eval(str(g["opts"]))
    inputs = dict(group=g["group"].tolist(), token_ids=g["token_ids"], mask=g["mask"])
    return g, opts, inputs


def _tolerance(expect: np.ndarray, float32_math: bool) -> float:
    """Absolute tolerance for a stored float array.

    float32 arithmetic (reference mode's statistics, or float32 rewards): another summation
    order or kernel changes each float32 rounding by up to half a unit in the last place
    (ulp). The largest effect is in reference mode's Fisher terms, ``exp`` of a sum of three
    float32 ``lgamma`` values of size up to ``ln(G!)`` (about 30 for G = 16): a rounding of
    that sum moves the term by about ``30 ulp`` relative, and F = exp(-2p) doubles it, so
    256 ulp of the largest magnitude bounds it with room (observed: 17 ulp on p). float64
    arithmetic: the same argument gives ~1e-14 (observed 9e-15); 1e-12 leaves room. A real
    change of the estimator moves values by far more than either (1e-3 and up).
    """
    scale = max(1.0, float(np.abs(expect).max(initial=0.0)))
    return 256 * EPS32 * scale if float32_math else 1e-12 * scale


def _runtime_choices(a: int, b: int, c: int, d: int) -> list[float] | None:
    """The p-values the released runtime may compute for one table, or None if only one.

    The runtime keeps a hypergeometric term when ``p_k <= p_obs`` in float32; a term whose
    exact probability is within float32 rounding of ``p_obs`` (the mirror table of a
    balanced group is an exact tie) may land on either side on another CPU. The choices
    are the sums with every subset of such terms, decided in exact integers
    (``math.comb``), independently of any float kernel. A sum within float32 rounding of 1
    also decides ``F`` (0 only at exactly 1.0), so it counts as a choice too.
    """
    n, r1, c1 = a + b + c + d, a + b, a + c
    ks = range(max(0, r1 + c1 - n), min(r1, c1) + 1)
    num = {k: math.comb(c1, k) * math.comb(n - c1, r1 - k) for k in ks}
    obs, total = num[a], math.comb(n, r1)
    ties = [num[k] for k in ks if k != a and abs(num[k] - obs) <= 1e-5 * obs]
    below = sum(v for k, v in num.items() if k != a and v < obs and v not in ties)
    sums = {below + obs}
    for t in ties:
        sums |= {x + t for x in sums}
    choices = sorted(x / total for x in sums)
    if len(choices) == 1 and choices[0] < 1 - 1e-5:
        return None
    return choices


@pytest.mark.parametrize("case", CASES)
def test_ngram_1_is_the_default_bit_for_bit(case):
    _, opts, inputs = _case(case)
    for dtype in (torch.float64, torch.float32):
        rewards = torch.from_numpy(GOLDEN[case + "_rewards"]).to(dtype)
        a = ktae.compute_advantages("ktae", rewards=rewards, **inputs, **opts)
        b = ktae.compute_advantages("ktae", rewards=rewards, **inputs, **opts, ngram=1)
        assert torch.equal(a, b), f"{case} ({dtype}): ngram=1 differs from the default"
    opts.pop("chunk_tokens", None)
    rewards = torch.from_numpy(GOLDEN[case + "_rewards"])
    ta = ktae.key_token_table(rewards=rewards, **inputs, **opts)
    tb = ktae.key_token_table(rewards=rewards, **inputs, **opts, ngram=1)
    for f in TABLE_FIELDS:
        assert torch.equal(getattr(ta, f), getattr(tb, f)), f"{case} table column {f}"


@pytest.mark.parametrize("case", CASES)
def test_unigram_ktae_matches_the_stored_output(case):
    g, opts, inputs = _case(case)
    reference = opts.get("mode") == "reference"
    stored = {f: g["table_" + f] for f in TABLE_FIELDS}
    table_opts = {k: v for k, v in opts.items() if k != "chunk_tokens"}
    table = ktae.key_token_table(rewards=torch.from_numpy(g["rewards"]), **inputs,
                                 **table_opts)
    live = {f: getattr(table, f).numpy() for f in TABLE_FIELDS}
    for f in ("group", "token", "a", "b", "c", "d"):  # integers: exact everywhere
        np.testing.assert_array_equal(live[f], stored[f], err_msg=f"{case} table column {f}")
    tol = {f: _tolerance(stored[f], reference) for f in TABLE_FIELDS[6:]}

    # Reference-mode rows at a float32 decision may take another of the runtime's choices
    # on this CPU: then p must be one of them and F must follow the runtime's rule on this
    # machine's p; the row's value is then this machine's (checked through the
    # advantages' base part below).
    flipped = np.zeros(len(stored["a"]), dtype=bool)
    if reference:
        for i, abcd in enumerate(zip(*(stored[k].tolist() for k in "abcd"), strict=True)):
            choices = _runtime_choices(*abcd)
            if choices is None or abs(live["fisher"][i] - stored["fisher"][i]) <= tol["fisher"]:
                continue
            p = float(live["p_value"][i])
            assert min(abs(p - x) for x in choices) <= tol["p_value"], (
                f"{case} row {i}: p = {p} is none of the runtime's choices {choices}")
            rule = 0.0 if p == 1.0 else float(torch.exp(torch.tensor(-2.0 * p)))
            assert abs(live["fisher"][i] - rule) <= tol["fisher"], f"{case} row {i}: F"
            flipped[i] = True
    keep = ~flipped
    for f in TABLE_FIELDS[6:]:
        assert live[f].dtype == stored[f].dtype, f"{case} table column {f}"
        if f in ("p_value", "fisher", "value"):
            live_f, stored_f = live[f][keep], stored[f][keep]
        else:
            live_f, stored_f = live[f], stored[f]
        np.testing.assert_allclose(live_f, stored_f, rtol=0, atol=tol[f],
                                   err_msg=f"{case} table column {f}")

    # Advantages = the base advantage + the token's value. Tokens of decision rows carry
    # this machine's value; their base part must still match the stored one.
    gid, _ = group_index(inputs["group"], len(inputs["group"]), torch.device("cpu"))
    token_rows = table.token_rows(gid, torch.from_numpy(g["token_ids"]),
                                  torch.from_numpy(g["mask"]),
                                  opts.get("ignore_token_ids", ())).numpy()
    for dtype in ("float64", "float32"):
        rewards = torch.from_numpy(g["rewards"]).to(getattr(torch, dtype))
        adv = ktae.compute_advantages("ktae", rewards=rewards, **inputs, **opts).numpy()
        expect = g["adv_" + dtype].copy()
        assert adv.dtype == expect.dtype and adv.shape == expect.shape, case
        flip = (token_rows >= 0) & flipped[np.maximum(token_rows, 0)]
        expect[flip] += (live["value"] - stored["value"])[token_rows[flip]]
        np.testing.assert_allclose(adv, expect, rtol=0,
                                   atol=_tolerance(expect, reference or dtype == "float32"),
                                   err_msg=f"{case} advantages ({dtype} rewards)")
