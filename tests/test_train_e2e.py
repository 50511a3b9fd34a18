"""End-to-end ``ktae train`` runs on CPU: every algo x credit, token-level credit in the loss."""

from __future__ import annotations

import math

import pytest
import torch
from test_train_helpers import contains_digit, read_jsonl, tiny_config

from ktae.train.session import train
from ktae.train.trainer import KTAEGRPOTrainer

pytestmark = pytest.mark.slow


class RecordingTrainer(KTAEGRPOTrainer):
    """Records what reaches TRL's loss: the advantages it reads, before and after TACO."""

    records: list

    def _compute_loss(self, model, inputs):
        self.records.append({"stored": inputs["advantages"].detach().clone(),
                             "mask": inputs["completion_mask"].detach().clone(),
                             "ids": inputs["completion_ids"].detach().clone()})
        return super()._compute_loss(model, inputs)

    def _calibrate(self, inputs, logps, entropies):
        super()._calibrate(inputs, logps, entropies)
        self.records[-1]["calibrated"] = inputs["advantages"].detach().clone()


def _run(tiny_model, tmp_path, **overrides):
    records: list = []
    cls = type("Rec", (RecordingTrainer,), {"records": records})
    cfg = tiny_config(tiny_model, tmp_path / "run", **overrides)
    summary = train(cfg, trainer_cls=cls, reward_funcs=[contains_digit])
    return cfg, summary, records


@pytest.mark.parametrize("algo", ["grpo", "dapo", "drgrpo"])
@pytest.mark.parametrize("credit", ["none", "ktae", "taco"])
def test_algo_credit_grid(tiny_model, tmp_path, algo, credit):
    cfg, summary, records = _run(tiny_model, tmp_path, algo=algo, credit=credit,
                                 **({"taco_alpha": 0.9, "taco_lambda": 0.9}
                                    if credit == "taco" else {}))
    metrics = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        for key in ("reward", "accuracy", "response_length", "entropy", "clip_fraction",
                    "loss", "generation_rounds", "advantage_seconds", "advantage_share"):
            assert math.isfinite(m[key]), (key, m)
        assert 0 <= m["zero_variance_group_fraction"] <= 1
        if credit == "taco":
            assert 0 <= m["flagged_token_rate"] <= 1
        else:
            assert "flagged_token_rate" not in m
        if algo == "dapo":
            assert m["generation_rounds"] >= 1 and "informative_group_fraction" in m
        else:
            assert m["generation_rounds"] == 1
    assert summary["heldout_before"] is not None and summary["heldout_after"] is not None
    assert (tmp_path / "run" / "plots" / "accuracy.png").stat().st_size > 0
    assert (tmp_path / "run" / "final" / "config.json").exists()
    assert len(records) == 2
    for rec in records:
        adv, mask = rec["stored"], rec["mask"].bool()
        assert adv.shape == mask.shape and torch.isfinite(adv).all()
        assert (adv[~mask] == 0).all()
        spread = torch.stack([(a[m].max() - a[m].min()) if m.any() else a.new_zeros(())
                              for a, m in zip(adv, mask, strict=True)])
        if credit == "ktae":
            # token-level credit, not a broadcast: values differ within responses
            assert (spread > 1e-6).any()
        else:
            assert (spread <= 1e-6).all()
        if credit == "taco":
            cal = rec["calibrated"]
            pos = (adv > 0) & mask
            # TACO only damps positive advantages, by a weight in [1 - lambda, 1]
            assert torch.allclose(cal[~pos], adv[~pos])
            ratio = cal[pos] / adv[pos]
            assert (ratio <= 1 + 1e-6).all() and (ratio >= 1 - cfg.taco_lambda - 1e-6).all()


def test_ktae_values_key_tokens(tiny_model, tmp_path):
    """With "contains a digit" as correctness, digit tokens get higher advantages than the
    response's sequence-level baseline in correct responses (they are the key tokens)."""
    cfg, _, records = _run(tiny_model, tmp_path, algo="grpo", credit="ktae", max_steps=1)
    import ktae

    rec = records[0]
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(cfg.model)
    digit_ids = torch.tensor([tok.convert_tokens_to_ids(str(d)) for d in range(10)])
    ids, mask, adv = rec["ids"], rec["mask"].bool(), rec["stored"]
    is_digit = torch.isin(ids, digit_ids) & mask
    other = ~is_digit & mask
    correct_rows = is_digit.any(dim=1)
    # compare within correct responses: a digit token vs the other tokens of the same response
    diffs = [adv[i][is_digit[i]].mean() - adv[i][other[i]].mean()
             for i in range(len(ids)) if correct_rows[i] and other[i].any()]
    assert diffs and torch.stack(diffs).mean() > 0
    assert "ktae" in ktae.ADVANTAGE_ESTIMATORS.names()


def test_overlong_shaping_reward_is_added(tiny_model, tmp_path):
    """DAPO's overlong penalty is a second reward term: the logged reward drops below the
    accuracy, while correctness (KTAE, dynamic sampling) still comes from the first term."""
    from ktae.train.reward_funcs import make_overlong_reward, make_reward_funcs

    funcs = make_reward_funcs(max_new_tokens=8, overlong_buffer=4, overlong_factor=1.0)
    assert [f.__name__ for f in funcs] == ["accuracy", "overlong"]
    assert len(make_reward_funcs(max_new_tokens=8, overlong_buffer=0, overlong_factor=1.0)) == 1
    overlong = make_overlong_reward(max_length=8, cache_length=4)
    assert overlong(completion_ids=[[1] * 8, [1] * 2, [1] * 6]) == \
        [pytest.approx(-1.0), 0.0, pytest.approx(-0.5)]
    records: list = []
    cls = type("Rec", (RecordingTrainer,), {"records": records})
    cfg = tiny_config(tiny_model, tmp_path / "run", algo="dapo", credit="none", max_steps=1,
                      overlong_buffer=4)
    train(cfg, trainer_cls=cls, reward_funcs=[contains_digit, overlong])
    m = read_jsonl(tmp_path / "run" / "metrics.jsonl")[0]
    assert m["reward"] < m["accuracy"]
