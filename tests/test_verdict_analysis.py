"""studies/verdict-5seed/verdict_analysis.py: the verdict study's bootstrap, Welch interval, seed rule,
credit classes on real tokens, and the whole script on synthetic records."""

import importlib.util
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "studies" / "verdict-5seed"


def _load(name: str, folder: Path = SCRIPTS):
    if name not in sys.modules:
        sys.path.insert(0, str(SCRIPTS))
        spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


@pytest.fixture(scope="module")
def va():
    return _load("verdict_analysis")


@pytest.fixture(scope="module")
def mass():
    return _load("verdict_credit_mass")


def reference_bootstrap(a, b, draws, seed):
    """The plan's bootstrap written plainly, one draw at a time, with the same random
    numbers as the vectorised one (problems, then a's seeds, then b's)."""
    rng = np.random.default_rng(seed)
    n = len(a)
    problems = rng.integers(0, n, size=(draws, n))
    seeds_a = rng.integers(0, len(a[0]), size=(draws, len(a[0])))
    seeds_b = rng.integers(0, len(b[0]), size=(draws, len(b[0])))

    def mean_over_seeds(x, drawn_problems, drawn_seeds):
        per_seed = [sum(x[p][s] for p in drawn_problems) / n for s in drawn_seeds]
        return sum(per_seed) / len(per_seed)

    diffs = [mean_over_seeds(a, problems[d], seeds_a[d])
             - mean_over_seeds(b, problems[d], seeds_b[d]) for d in range(draws)]
    return np.quantile(diffs, [0.025, 0.975])


def test_a_constant_shift_collapses_the_interval(va):
    rng = np.random.default_rng(1)
    base = np.repeat(rng.uniform(0, 0.5, size=(200, 1)), 5, axis=1)  # same in every seed
    r = va.two_level_bootstrap(base + 0.3, base, draws=2000)
    assert r["estimate"] == pytest.approx(0.3)
    assert r["low"] == pytest.approx(0.3) and r["high"] == pytest.approx(0.3)
    assert va.verdict(r) == "helps"
    right, wrong = np.ones((200, 5)), np.zeros((200, 4))  # 0/1, other seed counts
    r = va.two_level_bootstrap(wrong, right, draws=500)
    assert (r["estimate"], r["low"], r["high"]) == (-1.0, -1.0, -1.0)
    assert va.verdict(r) == "hurts"


def test_the_vectorised_bootstrap_is_the_plain_one(va):
    rng = np.random.default_rng(2)
    a = (rng.uniform(size=(40, 5)) < 0.4).astype(float)
    b = (rng.uniform(size=(40, 3)) < 0.4).astype(float)
    low, high = reference_bootstrap(a.tolist(), b.tolist(), draws=400, seed=7)
    r = va.two_level_bootstrap(a, b, draws=400, seed=7)
    assert (r["low"], r["high"]) == pytest.approx((low, high), abs=1e-12)
    assert r["estimate"] == pytest.approx(a.mean() - b.mean())


def test_arms_alike_in_distribution_give_an_interval_around_zero(va):
    # Each problem has its own difficulty, each seed its own skill; both arms alike. The
    # interval holds 0 and its width is the plain bootstrap's (other seed: a different
    # set of draws), up to Monte Carlo error.
    rng = np.random.default_rng(3)
    difficulty = rng.uniform(0.1, 0.9, size=(200, 1))

    def arm():
        skill = rng.normal(0, 0.05, size=(1, 5))
        return (rng.uniform(size=(200, 5)) < np.clip(difficulty + skill, 0, 1)).astype(float)

    a, b = arm(), arm()
    r = va.two_level_bootstrap(a, b, draws=10_000, seed=0)
    assert r["low"] < 0 < r["high"] and r["draws"] == 10_000
    assert va.verdict(r) == "no evidence"
    low, high = reference_bootstrap(a.tolist(), b.tolist(), draws=1500, seed=99)
    assert r["high"] - r["low"] == pytest.approx(high - low, rel=0.1)
    assert r["low"] == pytest.approx(low, abs=0.015) and r["high"] == pytest.approx(high, abs=0.015)


def test_a_rate_on_a_subset_leaves_out_seeds_without_it(va):
    x = np.array([[1.0, 0.0], [0.0, 0.0], [1.0, 1.0]])
    den = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 0.0]])  # seed 1 holds no problem of it
    r = va.two_level_bootstrap(x, den_a=den, draws=300)
    assert r["estimate"] == pytest.approx(0.5)
    assert 0 <= r["low"] <= 0.5 <= r["high"] <= 1 and r["draws"] < 300  # empty draws dropped


def test_the_bootstrap_refuses_mismatched_problems(va):
    with pytest.raises(ValueError, match="same 3 problems"):
        va.two_level_bootstrap(np.ones((3, 2)), np.ones((4, 2)))


def test_welch_matches_scipy_and_a_hand_computed_case(va):
    stats = pytest.importorskip("scipy.stats")
    a, b = [0.62, 0.55, 0.71, 0.60, 0.58], [0.50, 0.49, 0.57, 0.52, 0.47]
    w = va.welch(a, b)
    ci = stats.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    assert (w["low"], w["high"]) == pytest.approx((ci.low, ci.high))
    # by hand: variances 2 and n = 2 per side, so se = sqrt(2/2 + 2/2), df = 2**2 / (1 + 1)
    # = 2, t(0.975, 2) = 4.302653
    w = va.welch([1.0, 3.0], [0.0, 2.0])
    assert w["diff"] == 1.0 and w["df"] == pytest.approx(2.0)
    half = 4.302653 * 2 ** 0.5
    assert (w["low"], w["high"]) == pytest.approx((1 - half, 1 + half), abs=1e-5)


# --- synthetic records ------------------------------------------------------------------

FIRST, SECOND = list(_load("verdict_analysis").SETTINGS)
"""The plan's two settings (verdict_study.SETTINGS)."""
TOKENS = [504, 2988, 314, 216, 36, 34, 13855, 30, 2]
"""'The answer is 42 apples.<|im_end|>' in SmolLM2's tokenizer."""


def write_run(folder: Path, va, accuracy_after: float, rng, *, n: int = 200,
              truncate: float = 0.1) -> None:
    """A record as the driver keeps it, in ``folder`` named SETTING-ARM-sSEED."""
    setting, _, seed = folder.name.split("-")
    from ktae.tasks import arith

    held = arith.generate(n, split="test", seed=arith.TEST_SEED, difficulty=0)
    folder.mkdir(parents=True)
    evals = []
    for step, acc in ((0, 0.3), (12, accuracy_after)):
        problems = []
        for p in held:
            truncated = bool(rng.uniform() < truncate)
            correct = bool(rng.uniform() < acc) and not truncated
            problems.append({"correct": correct, "tokens": 64 if truncated else 20,
                             "truncated": truncated,
                             "extracted": p.answer if correct else "-1", "response": "r"})
        evals.append({"step": step, "accuracy": sum(r["correct"] for r in problems) / n,
                      "truncated": truncate, "response_length": 24.0, "n": n,
                      "problems": problems})
    (folder / "eval.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals))
    (folder / "metrics.jsonl").write_text("".join(
        json.dumps({"step": s, "reward": 0.5, "truncated_fraction": 0.25}) + "\n"
        for s in range(1, 13)))
    rows = [{"kind": "header", "format": "ktae-rollouts", "version": 1, "estimator": "grpo"}]
    for step in range(1, 13):
        rows.append({"kind": "group", "step": step, "group": 0, "prompt": "p",
                     "responses": [TOKENS, TOKENS[:4]], "rewards": [1.0, 0.0],
                     "correct": [True, False],
                     "advantages": [[1.0] * len(TOKENS), [-1.0] * 4]})
    (folder / "rollouts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "summary.json").write_text("{}\n")
    (folder / "config.yaml").write_text(f"task: arith@difficulty=0\nseed: {seed[1:]}\n"
                                        f"max_new_tokens: {va.SETTINGS[setting]}\n")
    (folder / va.MARKER).write_text("{}\n")


def write_audit(folder: Path, va, mean: float) -> None:
    folder.mkdir(parents=True)
    rate = {"mean": mean, "low": mean / 2, "high": min(1.0, mean * 2), "responses": 40,
            "groups": 30}
    blame = {"mean": 0.6, "low": 0.55, "high": 0.65, "responses": 12, "groups": 9}
    (folder / "audit.json").write_text(json.dumps(
        {"right_answer_wrong_tokens": {"all": rate, "levels": {}, "steps": {}},
         "methods": {"grpo": {"all": {"blame": dict(blame, mean=0.5)}},
                     "ktae": {"all": {"blame": blame}}}}))
    (folder / va.MARKER).write_text("{}\n")


@pytest.fixture()
def fake_classes(mass, monkeypatch):
    classes = np.full(49152, mass.CLASSES.index("rest"), dtype=np.int8)
    classes[[504, 2988, 314, 13855]] = mass.CLASSES.index("word")
    classes[[36, 34]] = mass.CLASSES.index("number")
    classes[2] = mass.CLASSES.index("end")
    monkeypatch.setattr(mass, "model_classes", lambda model=mass.MODEL: classes)
    return classes


def test_only_seeds_every_arm_shares_are_used(va, tmp_path):
    rng = np.random.default_rng(0)
    seeds = va.SEEDS
    for arm in va.ARMS:
        for seed in seeds[:2]:
            write_run(tmp_path / va.run_name(FIRST, arm, seed), va, 0.5, rng, n=10)
    write_run(tmp_path / va.run_name(FIRST, "grpo", seeds[2]), va, 0.5, rng, n=10)
    (tmp_path / va.run_name(FIRST, "ktae", seeds[3])).mkdir()  # started, no marker
    assert va.shared_seeds(tmp_path, FIRST) == list(seeds[:2])
    assert va.shared_seeds(tmp_path, SECOND) == []
    missing = va.missing_runs(tmp_path)
    assert va.run_name(FIRST, "ktae", seeds[2]) in missing
    assert va.run_name(FIRST, "grpo", seeds[2]) not in missing
    assert len(missing) == len(va.SEEDS) * len(va.SETTINGS) * len(va.ARMS) - 2 * len(va.ARMS) - 1


def test_the_whole_script_on_synthetic_records(va, tmp_path, fake_classes, capsys):
    rng = np.random.default_rng(5)
    gain = {"grpo": 0.4, "ktae": 0.6, "length": 0.58, "ktae3": 0.4, "oarg": 0.2}
    for seed in va.SEEDS[:3]:
        for setting in va.SETTINGS:
            for arm in va.ARMS:
                write_run(tmp_path / va.run_name(setting, arm, seed), va, gain[arm], rng)
    write_run(tmp_path / va.run_name(FIRST, "grpo", va.SEEDS[3]), va, 0.4, rng)
    write_audit(tmp_path / f"audit-{FIRST}-start", va, 0.1)
    write_audit(tmp_path / f"audit-{va.run_name(FIRST, 'ktae', va.AUDIT_SEEDS[0])}", va, 0.05)
    out = tmp_path / "out" / "figures.json"
    vt = _load("verdict_tables")
    assert vt.main(["--records", str(tmp_path), "--json", str(out), "--draws", "2000"]) == 0
    text = capsys.readouterr().out
    result = json.loads(out.read_text())
    first = result["verdict"][FIRST]
    assert first["seeds"] == list(va.SEEDS[:3])  # seed 14 of GRPO alone is left out
    comp = {(c["arm"], c["against"]): c for c in first["comparisons"]}
    assert set(comp) == {(a, "grpo") for a in va.ARMS if a != "grpo"} | {("ktae", "length")}
    assert comp[("ktae", "grpo")]["verdict"] == "helps"
    assert comp[("oarg", "grpo")]["verdict"] == "hurts"
    assert comp[("ktae", "length")]["bootstrap"]["low"] < comp[("ktae", "length")]["diff"]
    ktae = first["arms"]["ktae"]
    assert ktae["after"]["mean"] == pytest.approx(comp[("ktae", "grpo")]["diff"]
                                                  + first["arms"]["grpo"]["after"]["mean"])
    # length: every truncated response is wrong, so accuracy on the rest is higher
    after = result["length"][FIRST]["arms"]["ktae"]["after"]
    assert after["accuracy_not_truncated"]["mean"] > after["accuracy"]["mean"]
    assert after["truncated"]["low"] <= after["truncated"]["mean"] <= after["truncated"]["high"]
    assert set(after["accuracy_by_kind"]) == {"add", "sub", "mul"}
    assert after["response_tokens"]["mean"] == pytest.approx(
        20 + 44 * after["truncated"]["mean"])
    assert result["length"][FIRST]["arms"]["grpo"]["train_truncated_last3"]["mean"] == 0.25
    # credit mass: right responses +1 on 9 tokens (4 words, 2 digits, the end of turn, 2
    # rest), wrong ones -1 on their first 4 (3 words, 1 rest)
    m = result["credit_mass"][FIRST]["arms"]["grpo"]
    assert m["positive"] == pytest.approx({"number": 2 / 9, "word": 4 / 9, "end": 1 / 9,
                                           "rest": 2 / 9})
    assert m["negative"] == pytest.approx({"number": 0, "word": 3 / 4, "end": 0, "rest": 1 / 4})
    assert m["totals"]["groups"] == 3 * 12 and len(m["runs"]) == 3
    # audit: what exists, None for the rest
    audit = result["audit"][FIRST]
    assert audit["start"]["rate"]["mean"] == 0.1 and audit["grpo-s11"]["rate"] is None
    assert result["missing_runs"][0] == va.run_name(FIRST, "ktae", va.SEEDS[3])
    for title in ("## Verdict", "## Length and truncation", "## Credit mass", "## Audit"):
        assert title in text
    assert f"| `{FIRST}` | GRPO + KTAE | 3 |" in text and "helps" in text
    assert audit["start"]["blame"]["ktae"]["mean"] == 0.6
    assert audit["start"]["blame"]["ktae@ngram=3"] is None  # not scored: n/a, not an error
    assert (f"| `{FIRST}` | starting model | — | 40 | 10.0 [5.0, 20.0] | 0.600 [0.550, 0.650] "
            "(12) | n/a |") in text
    assert "Not recorded yet (" in text and f"audit-{SECOND}-start" in text


def test_no_records_is_one_line(va, tmp_path, capsys):
    vt = _load("verdict_tables")
    assert vt.main(["--records", str(tmp_path / "none")]) == 0
    assert capsys.readouterr().out.strip().count("\n") == 0
    for name in va.TABLES:
        table = vt.table(name, tmp_path)
        assert table.startswith("| setting |") and va.NO_RECORDS in table


def test_a_record_of_another_run_or_other_problems_is_refused(va, tmp_path):
    rng = np.random.default_rng(0)
    folder = tmp_path / va.run_name(FIRST, "grpo", 11)
    write_run(folder, va, 1.0, rng, n=10, truncate=0.0)
    va.load_run(folder, {"seed": 11, "max_new_tokens": 64})
    with pytest.raises(ValueError, match="max_new_tokens is 64, the plan's 160"):
        va.load_run(folder, {"seed": 11, "max_new_tokens": 160})
    evals = [json.loads(line) for line in (folder / "eval.jsonl").read_text().splitlines()]
    evals[1]["problems"].reverse()
    (folder / "eval.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals))
    with pytest.raises(ValueError, match="not the held-out problems in order"):
        va.load_run(folder)


def test_tables_renders_the_verdict_from_the_records(va, tmp_path, monkeypatch, fake_classes):
    tables = _load("tables", REPO / "scripts")
    rng = np.random.default_rng(1)
    for setting in va.SETTINGS:
        for arm in va.ARMS:
            write_run(tmp_path / va.run_name(setting, arm, va.SEEDS[0]), va, 0.5, rng, n=20)
    monkeypatch.setattr(va, "RECORDS", tmp_path)
    for name in ("verdict", "verdict-length", "verdict-credit-mass", "verdict-audit"):
        assert tables.TABLES[name].runs == ()
        table = tables.render(name)
        assert table.startswith("| setting |") and "\n|---" in table
    assert f"| `{SECOND}` | GRPO + OAR-G | 1 |" in tables.render("verdict")


# --- the credit classes of real tokens ---------------------------------------------------

@pytest.fixture(scope="module")
def real_classes(mass):
    from ktae.models import smollm2

    if not smollm2.is_prepared() and os.environ.get("KTAE_REQUIRE_REAL_MODEL") != "1":
        pytest.skip("smollm2-135m is not prepared (`ktae models prepare smollm2-135m`); "
                    "KTAE_REQUIRE_REAL_MODEL=1 requires it")
    return mass.model_classes()


def test_real_smollm2_tokens_fall_in_their_class(mass, real_classes):
    # 'The answer is 42 apples.<|im_end|>': SmolLM2 writes digits one token each
    expected = ["word", "word", "word", "rest", "number", "number", "word", "rest", "end"]
    assert [mass.CLASSES[real_classes[i]] for i in TOKENS] == expected
    assert len(real_classes) == 49152
    assert (real_classes == mass.CLASSES.index("end")).sum() == 1


def test_token_class_by_text(mass):
    assert mass.token_class(" 12") == "number" and mass.token_class("²") == "rest"
    assert mass.token_class(" apples") == "word" and mass.token_class(" ") == "rest"
    assert mass.token_class("3.5") == "rest" and mass.token_class("x", is_end=True) == "end"


def test_the_loss_credit_reads_weights_and_mask(mass):
    rec = {"advantages": [[1.0, -2.0, 3.0]], "weights": [[0.5, 1.0, 1.0]],
           "loss_mask": [[1, 1, 0]]}
    assert mass.loss_credit(rec, 0).tolist() == [0.5, -2.0, 0.0]
    rec = {"advantages": [[1.0, 2.0]], "weights": [None]}
    assert mass.loss_credit(rec, 0).tolist() == [1.0, 2.0]
