"""The audit's sanity rules and its credit by kind of token on synthetic groups (fast); the
progress lines of every phase after sampling. On the real model, SmolLM2-135M-Instruct on
the arith task, they are checked by the end-to-end audit of
``test_audit_real.py::test_audit_of_smollm2_end_to_end``, which samples the same 6 x 6
groups this file's real-model audit sampled."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

from ktae.cli import main
from ktae.credit_audit.progress import phase_printer
from ktae.credit_audit.run import AuditGroup, audit_groups, parse_methods
from ktae.credit_audit.sanity import SANITY_RULES
from ktae.credit_audit.token_kinds import KINDS
from ktae.groups.input import GroupInput


def synthetic_groups(n: int = 60, seed: int = 0) -> list[AuditGroup]:
    """``n`` groups of 4 responses of 6-12 tokens, half right; each wrong answer holds
    1-3 wrong tokens among labelled right ones; kinds: wrong tokens ``w``, others a mix."""
    rng = np.random.default_rng(seed)
    groups = []
    for k in range(n):
        responses, labels, kinds, rewards = [], [], [], []
        for i in range(4):
            T = int(rng.integers(6, 13))
            responses.append(rng.integers(1, 50, size=T).tolist())
            row = rng.choice(list("r.."), size=T)
            if i % 2:  # a wrong answer with a slip
                row[rng.choice(T, size=int(rng.integers(1, 4)), replace=False)] = "w"
                row[0] = "r"
            labels.append("".join(row))
            kinds.append("".join("w" if c == "w" else "nap"[j % 3] for j, c in enumerate(row)))
            rewards.append(float(i % 2 == 0))
        groups.append(AuditGroup(GroupInput(prompt="p", responses=responses, rewards=rewards),
                                 labels, level=k % 2, key=str(k), kinds=kinds))
    return groups


def test_sanity_rules_are_reported_beside_the_methods_and_hold():
    result = audit_groups(synthetic_groups(), parse_methods("grpo,ktae"), resamples=500)
    assert list(result["methods"]) == ["grpo", "ktae"]  # the rules are not methods
    assert list(result["sanity_rules"]) == list(SANITY_RULES)
    oracle = result["sanity_rules"]["oracle"]["all"]
    assert oracle["blame"]["mean"] == 1.0 and oracle["lowest"]["mean"] == 1.0
    assert oracle["blame"]["responses"] == result["methods"]["grpo"]["all"]["blame"]["responses"]
    assert oracle["mass_gap"]["mean"] == pytest.approx(-2.0)
    assert oracle["scale"]["mean"] == pytest.approx(1.0)
    for lv in ("0", "1"):
        assert result["sanity_rules"]["oracle"]["levels"][lv]["blame"]["mean"] == 1.0
    random = result["sanity_rules"]["random"]["all"]
    assert random["blame"]["low"] <= 0.5 <= random["blame"]["high"]
    assert random["blame"]["mean"] != 0.5  # it is drawn, not constant
    chance = random["chance"]["mean"]
    assert random["lowest"]["low"] <= chance <= random["lowest"]["high"]
    # seeded: the same draws every time
    again = audit_groups(synthetic_groups(), parse_methods("grpo"), resamples=500)
    assert again["sanity_rules"]["random"]["all"]["blame"] == random["blame"]


def test_the_oracle_misses_when_its_labels_are_one_token_off():
    """The oracle reaches 1.0 only on the tokens it is scored against: its credit built
    from labels shifted by one token, scored against the true labels, falls short."""
    import torch

    from ktae.core.credit_metrics import response_metrics
    from ktae.credit_audit.run import _prepare
    from ktae.credit_audit.sanity import sanity_credit

    groups = synthetic_groups()
    shifted = [AuditGroup(g.group, [row[1:] + row[:1] for row in g.labels], key=g.key)
               for g in groups]
    grpo = parse_methods("grpo")["grpo"]
    (true,), (off,) = _prepare(groups, grpo), _prepare(shifted, grpo)
    gen = torch.Generator()
    for labels, expected in ((true.labels, 1.0), (off.labels, None)):
        credit = sanity_credit("oracle", labels, true.mask, true.reference, generator=gen)
        m = response_metrics(credit, true.labels, true.mask, true.correct, true.group)
        blame = float(m.blame[m.blame_defined].mean())
        assert blame == expected if expected is not None else blame < 0.9
    with pytest.raises(ValueError, match=r"^rule: expected one of oracle, random, got 'x'$"):
        sanity_credit("x", true.labels, true.mask, true.reference, generator=gen)


def test_credit_by_kind_puts_the_oracles_negative_credit_on_wrong_results():
    result = audit_groups(synthetic_groups(), parse_methods("grpo,ktae"), resamples=0)
    by_kind = result["credit_by_kind"]
    assert set(by_kind) == {"grpo", "ktae", *SANITY_RULES}
    names = list(KINDS.values())
    oracle = by_kind["oracle"]
    assert oracle["negative"]["wrong result"] == pytest.approx(1.0)
    assert oracle["positive"]["wrong result"] == 0.0
    # GRPO gives a wrong answer's tokens one negative value: its negative credit is
    # spread as the tokens are, and it gives no positive credit there
    grpo = by_kind["grpo"]
    for k in names:
        assert grpo["negative"][k] == pytest.approx(grpo["tokens"][k])
    assert grpo["positive_mass"] == 0 and grpo["positive"]["word"] is None
    assert sum(grpo["tokens"].values()) == pytest.approx(1.0)
    assert grpo["responses"] == result["methods"]["grpo"]["all"]["blame"]["responses"]
    assert by_kind["ktae"]["negative_mass"] > 0
    # without token kinds (groups built without a tokenizer) there is no breakdown
    plain = [AuditGroup(g.group, g.labels, level=g.level, key=g.key) for g in synthetic_groups()]
    assert "credit_by_kind" not in audit_groups(plain, parse_methods("grpo"), resamples=0)


def test_phase_printer_lines_first_throttled_last():
    out = io.StringIO()
    step = phase_printer(out, every=3600)("scored", "groups (log-probs)", 4)
    for _ in range(4):
        step(1)
    lines = out.getvalue().splitlines()
    assert [x.split(" in ")[0] for x in lines] == ["  scored 1/4 groups (log-probs)",
                                                   "  scored 4/4 groups (log-probs)"]
    assert "left" in lines[0] and "left" not in lines[1]
    out = io.StringIO()
    step = phase_printer(out, every=0)("computed", "credit methods", 3)
    for _ in range(3):
        step(1)
    assert len(out.getvalue().splitlines()) == 3


def test_every_phase_after_sampling_shows_progress(tmp_path, capsys):
    args = ["audit", "--model", "default", "--prompts", "20", "--samples", "4", "--credit",
            "grpo,ktae,taco,oar-g", "--resamples", "50"]
    assert main([*args, "-o", str(tmp_path / "a")]) == 0
    captured = capsys.readouterr()
    err, out = captured.err, captured.out
    read = [x for x in err.splitlines() if x.startswith("  scored ")]
    assert read and "input-gradient importance of each response token, for oar-g, of the " in read[-1]
    assert "the clean pass read from the sampling's cache" in read[-1]
    done, total = read[-1].split()[1].split("/")
    assert done == total and f"of the {total} of 20 groups whose credit reads it" in read[-1]
    for line in ("  labelled 20/20 groups",
                 "  computed 6/6 credit methods and sanity rules",
                 "  summarised 6/6 credit methods and sanity rules (50 bootstrap draws"):
        assert line in err, line
    assert "(oracle: sanity rule)" in out and "(random: sanity rule)" in out
    md = (tmp_path / "a" / "audit.md").read_text()
    assert "| *oracle (sanity rule)* | 1.000 | 1.000 | 0.000 |" in md
    assert "## Where the credit goes, by kind of token" in md
    assert "  time: loading " in out and "after sampling" in out
    written = json.loads((tmp_path / "a" / "audit.json").read_text())
    for key in ("seconds", "cpu_seconds"):
        assert list(written[key]) == ["loading", "sampling", "scoring", "credit and bootstrap"]
        assert all(v >= 0 for v in written[key].values())
    assert written["cpu_seconds"]["sampling"] > 0
    assert "  CPU time: loading " in out
    assert main([*args, "--no-progress", "-o", str(tmp_path / "b")]) == 0
    err = capsys.readouterr().err
    assert "labelled" not in err and "scored" not in err and "computed" not in err


def test_random_rule_interval_holds_its_draws_on_a_single_response():
    # one group with one blame response: an interval over groups alone would be a point;
    # the random rule's resamples its draws too, so it is wide and holds 0.5
    result = audit_groups(synthetic_groups(1, seed=3), parse_methods("grpo"), resamples=500)
    random = result["sanity_rules"]["random"]["all"]["blame"]
    grpo = result["methods"]["grpo"]["all"]["blame"]
    assert random["groups"] == grpo["groups"] == 1
    assert random["responses"] == grpo["responses"]
    assert random["low"] < 0.5 < random["high"] and random["high"] - random["low"] > 0.1
    assert grpo["low"] == grpo["high"] == 0.5


def test_the_plots_show_the_sanity_rules_beside_the_methods(tmp_path, monkeypatch):
    import matplotlib.axes

    from ktae.credit_audit.report import plot_metric

    cell = {"mean": 0.5, "low": 0.4, "high": 0.6}
    result = {"methods": {"grpo": {"all": {"blame": cell}}, "ktae": {"all": {"blame": cell}}},
              "sanity_rules": {"oracle": {"all": {"blame": {**cell, "mean": 1.0, "high": 1.0}}},
                               "random": {"all": {"blame": cell}}}}
    seen = {}
    real = matplotlib.axes.Axes.bar

    def bar(self, x, height, *args, **kwargs):
        seen["heights"], seen["colors"] = list(height), list(kwargs["color"])
        return real(self, x, height, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "bar", bar)
    path = plot_metric(result, "blame", tmp_path / "blame.png")
    assert path.is_file() and path.stat().st_size > 0
    assert seen["heights"] == [0.5, 0.5, 1.0, 0.5]
    assert seen["colors"][:2] != seen["colors"][2:]  # the rules set apart
