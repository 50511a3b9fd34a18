"""``ktae simulate``: the ``ktae-graded`` method and the report's two measures (the
paper's claims and the share of the oracle's gain on the final and on the mean return)."""

from __future__ import annotations

import pytest
import torch
from oracle import single_thread  # noqa: F401  (one torch thread for this module)

import ktae
from ktae.sim import report
from ktae.sim.config import PRESETS, Setting, SimConfig
from ktae.sim.credit import CreditBatch, all_methods, base_advantages, parse_method
from ktae.sim.run import SimResult, simulate


def _batch(seed: int = 0) -> CreditBatch:
    gen = torch.Generator().manual_seed(seed)
    G, H, A = 4, 6, 3
    actions = torch.randint(0, A, (2 * G, H), generator=gen)
    return CreditBatch(step_rewards=(actions < 1).float(), mask=torch.ones(2 * G, H, dtype=torch.bool),
                       group=torch.arange(2).repeat_interleave(G), horizon=torch.full((2 * G,), H),
                       token_ids=torch.arange(H) * A + actions, logprobs=torch.zeros(2 * G, H),
                       entropies=torch.ones(2 * G, H), run_slices=((0, G), (G, 2 * G)))


@pytest.mark.parametrize("ngram", [1, 2])
def test_graded_method_is_the_library_call(ngram):
    batch = _batch()
    got = base_advantages("ktae-graded", batch, ktae_ngram=ngram)
    want = ktae.compute_advantages("ktae", rewards=batch.returns, group=batch.group,
                                   token_ids=batch.token_ids, mask=batch.mask, split="graded",
                                   ngram=ngram)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert not torch.equal(got, base_advantages("ktae", batch, ktae_ngram=ngram))


def test_graded_method_names():
    assert "ktae-graded" in all_methods() and "ktae-graded" in PRESETS["quick"]["methods"]
    m = parse_method("ktae-graded+taco")
    assert (m.base, m.calibration) == ("ktae-graded", "taco")


def test_graded_method_runs_in_the_simulator():
    cfg = SimConfig(horizons=(3,), n_opts=(2,), group_sizes=(4,), actions=12, steps=6,
                    lr=0.2, seeds=2, eval_every=2, methods=("broadcast", "ktae-graded"))
    res = simulate(cfg)
    c = res.curves[("ktae-graded", cfg.base)]
    assert c.shape == (2, 4) and ((c >= 0) & (c <= 1)).all()


def _result(curves_by_method) -> SimResult:
    cfg = SimConfig(horizons=(2, 8), n_opts=(1,), group_sizes=(4,), actions=4, steps=20,
                    eval_every=10, seeds=2, methods=tuple(curves_by_method))
    curves = {(m, Setting(h, 1, 4)): torch.tensor(v, dtype=torch.float64)
              for m, per_h in curves_by_method.items() for h, v in per_h.items()}
    return SimResult(cfg, cfg.eval_steps(), curves, 1.0)


def test_claims_on_final_and_mean_return_can_differ():
    """At H = 8 the oracle learns fast but ends where broadcast ends; at H = 2 the oracle
    ends higher: the gap widens with H on the mean return but shrinks on the final one."""
    res = _result({"broadcast": {2: [[0.1, 0.2, 0.5]] * 2, 8: [[0.1, 0.2, 0.9]] * 2},
                   "step": {2: [[0.1, 0.3, 0.8]] * 2, 8: [[0.1, 0.9, 0.9]] * 2},
                   "ktae-graded": {2: [[0.1, 0.25, 0.65]] * 2, 8: [[0.1, 0.2, 0.9]] * 2}})
    mean, final = report.claims(res, "mean"), report.claims(res, "final")
    assert mean[1].held is True and final[1].held is False
    assert final[0].held is False and "1 of 2" in final[0].detail  # tie at H = 8
    assert {c.measure for c in mean} == {"mean"} and {c.measure for c in final} == {"final"}
    shares = report.oracle_shares(res, "final")
    assert shares[("ktae-graded", Setting(2, 1, 4))] == pytest.approx(0.5)
    assert shares[("ktae-graded", Setting(8, 1, 4))] is None  # oracle = broadcast there
    text = report.summary_paragraph(res)
    assert "on the final return" in text and "on the mean return over training" in text
    md = report.markdown(res)
    assert "share of the oracle's gain, final return" in md
    assert "share of the oracle's gain, mean return over training" in md
    assert [c["measure"] for c in report.to_json(res)["claims_final"]] == ["final"] * 4
    with pytest.raises(ValueError, match="measure: expected one of final, mean"):
        report.gaps(res, "median")
