"""``ktae simulate`` with any registered estimator: ``prefix-value`` with its options and a
user's rule from ``--plugin``, computed on the MDP's trajectories as the trainer does."""

from __future__ import annotations

import dataclasses
import json
import textwrap

import numpy as np
import pytest
import torch
from oracle import single_thread  # noqa: F401  (one torch thread for this module)
from prefix_value_oracle import slow_prefix_value_advantages

import ktae
from ktae.cli import main
from ktae.sim.credit import CreditBatch, method_advantages, parse_method, parse_methods

TINY = ["--actions", "8", "--steps", "6", "--seeds", "1", "--eval-every", "3",
        "--horizon", "4", "--n-opt", "2", "--group-size", "4", "--threads", "1",
        "--no-progress"]


#: every test registers its rules afresh (conftest.py)
pytestmark = pytest.mark.usefixtures("clean_registries")


def _batch(seed: int, runs: int = 4, G: int = 5, H: int = 4, A: int = 2) -> CreditBatch:
    """Few actions, so that trajectories share prefixes; the last run is shorter."""
    gen = torch.Generator().manual_seed(seed)
    actions = torch.randint(0, A, (runs * G, H), generator=gen)
    mask = torch.ones(runs * G, H, dtype=torch.bool)
    mask[-G:, H - 1:] = False
    steps = torch.arange(H).expand_as(actions)
    return CreditBatch(
        step_rewards=((actions == 0) & mask).float(), mask=mask,
        group=torch.arange(runs).repeat_interleave(G),
        horizon=torch.tensor([H] * (runs - 1) * G + [H - 1] * G),
        token_ids=torch.where(mask, steps * A + actions, 0),
        logprobs=torch.where(mask, -torch.rand(runs * G, H, generator=gen), 0.0),
        entropies=torch.where(mask, torch.rand(runs * G, H, generator=gen), 0.0),
        run_slices=tuple((k * G, (k + 1) * G) for k in range(runs)))


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("name, options", [
    ("prefix-value", {}),
    ("prefix-value@total=add@weight=0.5", {"total": "add", "weight": 0.5}),
    ("prefix-value@apply=all@unit=span", {"apply": "all", "unit": "span"}),
])
def test_prefix_value_on_trajectories_equals_its_slow_reference(seed, name, options):
    """Tokens are (step, action) pairs, ``correct`` is "return above the group's mean",
    and the base advantage is GRPO on the normalised returns."""
    b = _batch(seed)
    method = parse_method(name)
    assert method.base == "prefix-value" and method.calibration is None
    got = method_advantages(method, b)
    assert torch.equal(got.loss_mask, b.mask) and not got.flagged.any()
    returns = b.returns.double().numpy()
    group = b.group.numpy()
    above = np.array([returns[i] > returns[group == group[i]].mean() for i in range(len(group))])
    ref = slow_prefix_value_advantages(returns, group, b.token_ids.numpy(), b.mask.numpy(),
                                       above, **options)
    np.testing.assert_allclose(got.advantages.double().numpy(), ref, rtol=1e-5, atol=1e-5)


def test_rule_with_a_calibration_and_its_options():
    b = _batch(0)
    gen = torch.Generator().manual_seed(1)  # improbable tokens too, for TACO to flag
    b = dataclasses.replace(b, logprobs=torch.where(
        b.mask, -6 * torch.rand(b.mask.shape, generator=gen), 0.0))
    got = method_advantages(parse_method("prefix-value@total=add+taco@alpha=0.3"), b)
    base = method_advantages(parse_method("prefix-value@total=add"), b).advantages
    want = ktae.calibrate_advantages("taco", base, logprobs=b.logprobs, entropies=b.entropies,
                                     mask=b.mask, old_logprobs=b.logprobs, alpha=0.3)
    torch.testing.assert_close(got.advantages, want.advantages)
    other = method_advantages(parse_method("prefix-value@total=add+taco"), b).advantages
    assert got.flagged.any()
    assert not torch.allclose(got.advantages, other)  # alpha reached the calibration


def test_names_and_errors():
    assert [m.name for m in parse_methods("broadcast,prefix-value@weight=0.5")] == [
        "broadcast", "prefix-value@weight=0.5"]
    assert parse_method("ktae").rule is None  # the simulator's own KTAE keeps its name
    with pytest.raises(ValueError, match=r"^methods: 'prefix-value@wieght=1': .*wieght") as e:
        parse_method("prefix-value@wieght=1")
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="methods: unknown method 'nope'; .*prefix-value"):
        parse_method("nope")


def test_user_rule_from_a_plugin_runs_in_simulate(tmp_path):
    """``ktae --plugin FILE simulate --methods ...,RULE@KEY=VALUE``: the rule's credit
    drives the updates and its blame figures are reported beside GRPO's."""
    path = tmp_path / "late_steps.py"
    path.write_text(textwrap.dedent("""
        import torch
        import ktae

        CALLS = []

        @ktae.register_estimator("late-steps")
        def late_steps(batch, *, slope: float = 1.0):
            CALLS.append(slope)
            adv = ktae.compute_advantages("grpo", rewards=batch.rewards, group=batch.group)
            steps = torch.cumsum(batch.mask.long(), dim=1).to(adv.dtype)
            return adv[:, None] * (1 + slope * steps) * batch.mask
    """))
    out = tmp_path / "sim"
    assert main(["--plugin", str(path), "simulate", *TINY, "--methods",
                 "broadcast,late-steps@slope=2", "-o", str(out)]) == 0
    import sys

    calls = [m for m in sys.modules.values()
             if getattr(m, "__file__", None) == str(path)][0].CALLS
    assert calls and set(calls) == {2.0}
    data = json.loads((out / "curves.json").read_text())
    assert {c["method"] for c in data["curves"]} == {"broadcast", "late-steps@slope=2"}
    results = data["audit"]["results"]
    audited = results[min(results, key=int)]
    assert "late-steps@slope=2" in json.dumps(audited)
    assert "late-steps@slope=2" in (out / "results.md").read_text()


def test_ktae_with_options_takes_the_trainers_path():
    """``ktae@KEY=VALUE`` in the simulator is KTAE with those options and the simulator's
    classes (return above the group's mean); plain ``ktae`` stays the simulator's own."""
    b = _batch(3)
    got = method_advantages(parse_method("ktae@apply=wrong@ngram=2"), b).advantages
    want = ktae.compute_advantages("ktae", rewards=b.returns, group=b.group,
                                   token_ids=b.token_ids, mask=b.mask,
                                   correct=b.above_group_mean(), apply="wrong", ngram=2)
    torch.testing.assert_close(got, want.to(got.dtype))
    plain = method_advantages(parse_method("ktae"), b).advantages
    every = method_advantages(parse_method("ktae@apply=all"), b).advantages
    torch.testing.assert_close(plain, every)
