"""The importance is computed only for the groups whose credit reads it: OAR-G's credit
``A * w_t`` is 0 wherever every base advantage is 0, so such a group's importance is
skipped, and every other group's is the same as with all computed (the noise generator
advanced by the skipped group's draw)."""

import pytest
import torch

from ktae.core.estimators import ADVANTAGE_ESTIMATORS
from ktae.core.oar import importance_read


@pytest.fixture(scope="module")
def tiny_groups():
    from ktae.groups.sampling import load_model, prompt_rows, sample_groups

    model, tok, _ = load_model("default")
    rows = prompt_rows(None, tok, 6)
    groups = [g for _, g in sample_groups(model, tok, rows, num_generations=4,
                                          max_new_tokens=12, temperature=1.0, seed=0)]
    # two groups of equal rewards, whatever the tiny model answered
    for g in groups[:2]:
        g.rewards = [1.0] * len(g.rewards)
    groups[2].rewards = [1.0, 0.0, 0.0, 1.0]
    return model, tok, groups


@pytest.mark.parametrize("base", ["grpo", "drgrpo", "rloo"])
def test_importance_read_where_a_base_advantage_is_not_zero(base):
    assert not importance_read([1.0, 1.0, 1.0], base=base)
    assert not importance_read([0.0, 0.0], base=base)
    assert importance_read([1.0, 0.0, 0.0], base=base)
    rule = ADVANTAGE_ESTIMATORS.get("oar-g").reads_need
    assert not rule("input_grad_importance", [1.0, 1.0], base=base)
    assert rule("input_grad_importance", [1.0, 0.0], base=base)
    assert rule("mask", [1.0, 1.0], base=base)


def test_a_group_skipped_has_no_oar_g_credit_whatever_its_importance():
    from ktae.core.advantages import AdvantageBatch

    g = torch.Generator().manual_seed(0)
    mask = torch.ones(4, 6, dtype=torch.bool)
    rewards = torch.tensor([1.0, 1.0, 1.0, 1.0])
    for _ in range(5):
        batch = AdvantageBatch(rewards=rewards, gid=torch.zeros(4, dtype=torch.long),
                               num_groups=1, mask=mask,
                               input_grad_importance=torch.rand(4, 6, generator=g) * 10)
        assert not ADVANTAGE_ESTIMATORS.get("oar-g")(batch).any()


def test_skipped_groups_leave_the_others_unchanged(tiny_groups):
    import copy

    from ktae.groups.scoring import importance_groups

    model, tok, groups = tiny_groups
    every = copy.deepcopy(groups)
    some = copy.deepcopy(groups)
    importance_groups(model, tok, every, seed=3)
    calls = []
    importance_groups(model, tok, some, seed=3, on_group=lambda: calls.append(1),
                      reads_importance=lambda g: importance_read(g.rewards))
    read = [importance_read(g.rewards) for g in groups]
    assert read[:3] == [False, False, True] and len(calls) == sum(read)
    for a, b, r in zip(every, some, read, strict=True):
        if r:
            assert a.input_grad_importance == b.input_grad_importance
        else:
            assert all(v == 0.0 for row in b.input_grad_importance for v in row)
            assert [len(x) for x in b.input_grad_importance] == [len(x) for x in b.responses]


def test_the_audit_credit_is_unchanged_by_the_skip(tiny_groups):
    """OAR-G's credit with the skip equals its credit with every importance computed."""
    import copy

    from ktae.credit_audit.run import _reads_importance, parse_methods
    from ktae.groups.credit import credit_values
    from ktae.groups.scoring import importance_groups

    model, tok, groups = tiny_groups
    methods = parse_methods("oar-g,oar-g@base=rloo")
    reads = _reads_importance(list(methods.values()))
    every, some = copy.deepcopy(groups), copy.deepcopy(groups)
    importance_groups(model, tok, every, seed=1)
    importance_groups(model, tok, some, seed=1, reads_importance=reads)
    assert every[0].input_grad_importance != some[0].input_grad_importance
    for spec in methods.values():
        a, b = credit_values(every, spec), credit_values(some, spec)
        assert a.final.abs().sum() > 0
        torch.testing.assert_close(a.final, b.final)


def test_a_rule_without_importance_read_reads_every_group(clean_registries):
    import ktae
    from ktae.credit_audit.run import _reads_importance, parse_methods

    @ktae.register_estimator("grad-share", needs=("mask", "input_grad_importance"))
    def grad_share(b):
        return b.input_grad_importance

    equal = type("G", (), {"rewards": [1.0, 1.0]})()
    mixed = type("G", (), {"rewards": [1.0, 0.0]})()
    oar = parse_methods("oar-g")["oar-g"]
    assert not _reads_importance([oar])(equal) and _reads_importance([oar])(mixed)
    both = _reads_importance([oar, parse_methods("grad-share")["grad-share"]])
    assert both(equal) and both(mixed)


def test_a_skipped_group_still_gets_its_log_probs(tiny_groups):
    """A group whose credit does not read the importance, scored for a calibration too: its
    log-probs and entropies come from a plain forward pass, equal to those of the groups
    scored with every importance computed."""
    import copy

    from ktae.groups.scoring import score_groups

    model, tok, groups = tiny_groups
    every, some = copy.deepcopy(groups), copy.deepcopy(groups)
    for g in every + some:
        g.logprobs = g.entropies = None
    score_groups(model, tok, every, importance=True)
    score_groups(model, tok, some, importance=True,
                 reads_importance=lambda g: importance_read(g.rewards))
    for a, b in zip(every, some, strict=True):
        assert b.logprobs is not None and b.entropies is not None
        for x, y in zip(a.logprobs + a.entropies, b.logprobs + b.entropies, strict=True):
            torch.testing.assert_close(torch.tensor(x), torch.tensor(y), rtol=1e-4, atol=1e-5)
