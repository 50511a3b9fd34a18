"""OAR-G (docs/method.md §16): the reshaping against a plain loop written from the released
code, the advantage mass it keeps, the input-gradient importance against central finite
differences on a tiny random Llama, its one-line errors, and one ``ktae train`` step."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from oracle import single_thread  # noqa: F401  (one torch thread for this module)

import ktae
from ktae.core.methods import estimator_credit, parse_method
from ktae.core.oar import oar_weights
from ktae.models.input_grad_importance import (
    append_answer,
    input_grad_importance,
    response_importance,
)


def batch(seed: int = 0, B: int = 6, T: int = 9):
    """Rewards (3 groups of 2), importances spanning orders of magnitude, a ragged mask."""
    g = torch.Generator().manual_seed(seed)
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0], dtype=torch.float64)[:B]
    importance = torch.rand(B, T, generator=g, dtype=torch.float64) ** 4 * 10
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[1, 6:] = False
    mask[2, 1:] = False  # one token
    mask[4, 3:] = False
    importance[3] = 0.7  # all equal: no spread
    return rewards, torch.arange(B) // 2, importance, mask


def slow_weights(scores, threshold, gating_beta, min_weight=0.1, sum_to_length=True):
    """``calculate_oar_hybrid_weights`` of the released code, for one response (numpy)."""
    score_arr = np.array(scores)
    log_score = np.log1p(score_arr)
    min_val, max_val = log_score.min(), log_score.max()
    range_val = max_val - min_val if max_val > min_val else 1.0
    norm = (log_score - min_val) / range_val
    thr = np.quantile(norm, threshold)
    weights = np.ones_like(norm)
    low = norm < thr
    weights[low] = np.maximum(norm[low] / (thr + 1e-8), min_weight)
    high = ~low
    if high.any():
        weights[high] = 1.0 + gating_beta * (norm[high] - thr) / (1.0 - thr + 1e-8)
    if sum_to_length:
        denom = weights.sum()
        weights = np.ones_like(weights) if denom <= 0 else weights * (len(weights) / (denom + 1e-8))
    return weights


OPTIONS = [{}, {"threshold": 0.8, "gating_beta": 0.5}, {"threshold": 0.2, "gating_beta": 3.0},
           {"min_weight": 0.5}, {"sum_to_length": False}, {"threshold": 0.0}, {"threshold": 1.0}]


@pytest.mark.parametrize("options", OPTIONS)
def test_weights_equal_the_released_code(options):
    _, _, importance, mask = batch()
    w = oar_weights(importance, mask, **options)
    full = {"threshold": 0.5, "gating_beta": 1.0, **options}
    for i in range(mask.shape[0]):
        n = int(mask[i].sum())
        expected = slow_weights(importance[i, :n].tolist(), **full)
        np.testing.assert_allclose(w[i, :n].numpy(), expected, rtol=1e-12, atol=1e-12)
        assert (w[i, n:] == 0).all()
    # no spread: every weight is 1 (up to the code's 1e-8 guard)
    torch.testing.assert_close(oar_weights(importance, mask)[3], torch.ones(9, dtype=torch.float64),
                               rtol=0, atol=1e-7)


def test_each_option_takes_effect():
    rewards, group, importance, mask = batch()
    base = ktae.compute_advantages("oar-g", rewards=rewards, group=group, mask=mask,
                                   input_grad_importance=importance)
    for options in OPTIONS[1:5] + [{"base": "rloo"}]:
        other = ktae.compute_advantages("oar-g", rewards=rewards, group=group, mask=mask,
                                        input_grad_importance=importance, **options)
        assert not torch.allclose(base, other), options


@pytest.mark.parametrize("options", [{}, {"threshold": 0.9, "gating_beta": 4.0, "base": "drgrpo"}])
def test_advantage_mass_is_kept_per_response(options):
    rewards, group, importance, mask = batch()
    adv = ktae.compute_advantages("oar-g", rewards=rewards, group=group, mask=mask,
                                  input_grad_importance=importance, **options)
    seq = ktae.compute_advantages(options.get("base", "grpo"), rewards=rewards, group=group)
    lengths = mask.sum(dim=1).double()
    torch.testing.assert_close(adv.sum(dim=1), seq * lengths, rtol=1e-7, atol=1e-12)
    assert (adv[~mask] == 0).all()
    spread = adv[0, mask[0]]
    assert spread.max() - spread.min() > 0.1  # reshaped, not a broadcast


def test_one_line_errors():
    rewards, group, importance, mask = batch()
    kw = dict(rewards=rewards, group=group, mask=mask)
    with pytest.raises(ValueError, match="^input_grad_importance: required by advantage "
                                         "estimator 'oar-g'") as err:
        ktae.compute_advantages("oar-g", **kw)
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="^bogus: unknown option for advantage estimator "
                                         "'oar-g'; expected base, threshold"):
        ktae.compute_advantages("oar-g", input_grad_importance=importance, bogus=1, **kw)
    for key, value in (("threshold", 1.5), ("gating_beta", -1), ("min_weight", 2), ("base", "x"),
                       ("sum_to_length", "yes")):
        with pytest.raises(ValueError, match=f"^{key}: expected"):
            ktae.compute_advantages("oar-g", input_grad_importance=importance,
                                    **{key: value}, **kw)
    with pytest.raises(ValueError, match=r"^input_grad_importance: expected shape \(6, 9\)"):
        ktae.compute_advantages("oar-g", input_grad_importance=importance[:, :3], **kw)
    method = parse_method("oar-g@threshold=0.7")
    assert method.needs_input_grad and method.estimator_options == {"threshold": 0.7}
    with pytest.raises(ValueError, match="^credit: estimator 'oar-g' reads the model's "
                                         "input-gradient importance"):
        estimator_credit(method, token_ids=torch.zeros_like(mask, dtype=torch.long),
                         correct=rewards > 0, **kw)
    with pytest.raises(ValueError, match="bogus"):
        parse_method("oar-g@bogus=1")


def test_compare_arms_set_its_options():
    from ktae.train.cli_compare import parse_arm

    arm = parse_arm("oar-g@gating_beta=2@threshold=0.7@beta=0.05")
    assert arm.credit == "oar-g"
    assert arm.overrides == {"estimator_options": {"gating_beta": 2, "threshold": 0.7},
                             "beta": 0.05}  # beta: the KL coefficient, a train setting
    with pytest.raises(ValueError, match="'bogus'"):
        parse_arm("oar-g@bogus=1")


def test_simulator_refuses_it_in_one_line():
    from ktae.sim.config import SimConfig
    from ktae.sim.run import simulate

    with pytest.raises(ValueError, match="input-gradient importance") as err:
        simulate(SimConfig(horizons=(3,), n_opts=(2,), group_sizes=(4,), actions=6, steps=2,
                           lr=0.5, seeds=1, eval_every=2, audit_groups=0,
                           methods=("broadcast", "oar-g")))
    assert "\n" not in str(err.value)


def test_a_user_rule_can_declare_the_need(clean_registries):
    seen = {}

    @ktae.register_estimator("grad-share", needs=("mask", "input_grad_importance"))
    def grad_share(b: ktae.RuleBatch) -> torch.Tensor:
        seen["importance"] = b.input_grad_importance
        return b.input_grad_importance / b.input_grad_importance.sum(dim=1, keepdim=True)

    rewards, group, importance, mask = batch()
    out = ktae.compute_advantages("grad-share", rewards=rewards, group=group, mask=mask,
                                  input_grad_importance=importance)
    torch.testing.assert_close(seen["importance"], torch.where(mask, importance, 0))
    assert out.shape == mask.shape
    with pytest.raises(ValueError, match="^input_grad_importance: required by advantage "
                                         "estimator 'grad-share'"):
        ktae.compute_advantages("grad-share", rewards=rewards, group=group, mask=mask)
    with pytest.raises(ValueError, match="needs='model' is not an input"):
        ktae.register_estimator("bad", needs=("model",))


# ------------------------------------------------------------------ the importance


def _rms_norm_float64(self, x):
    """transformers' ``LlamaRMSNorm.forward`` in the input's dtype (it rounds to float32,
    which would drown a float64 finite difference)."""
    return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))


def tiny_llama():
    """A random 2-layer Llama (vocabulary 23) computing in float64 throughout: SDPA
    attention and the norms in float64."""
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=23, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                      attn_implementation="sdpa")
    model = LlamaForCausalLM(cfg).double().eval()
    for module in model.modules():
        if isinstance(module, LlamaRMSNorm):
            module.forward = _rms_norm_float64.__get__(module)
    return model


def layout():
    """Equal-length prompts (no left padding), ragged responses and answers."""
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(3, 23, (3, 4), generator=g)
    response = torch.randint(3, 23, (3, 6), generator=g)
    rmask = torch.ones(3, 6, dtype=torch.long)
    rmask[1, 4:] = 0
    rmask[2, 2:] = 0
    answers = [[5, 6, 7], [8], [9, 10]]
    return append_answer(prompt, torch.ones_like(prompt), response, rmask, answers, pad_id=0)


def objective(model, ids, attn, answer, x, e, outcome):
    """``J`` of one row (unbatched), straight from the released code's definitions."""
    L = int(attn.sum())
    ids, answer = ids[:L], answer[:L]
    logits0 = model(inputs_embeds=e[None, :L]).logits[0]
    logits = model(inputs_embeds=x[None, :L]).logits[0]
    pred = [p - 1 for p in range(L) if answer[p]]
    if outcome == "answer_joint":
        def phi(lg):
            lp = torch.log_softmax(lg[pred], dim=-1)
            return lp[torch.arange(len(pred)), ids[[p + 1 for p in pred]]].mean()
        return phi(logits0) - phi(logits)
    if outcome == "last":
        q0, q = logits0[max(pred) + 1], logits[max(pred) + 1]
    else:
        q0, q = logits0[pred].mean(dim=0), logits[pred].mean(dim=0)
    p0 = torch.softmax(q0, dim=-1)
    return torch.sum(p0 * (torch.log(p0 + 1e-12) - torch.log_softmax(q, dim=-1)))


@pytest.mark.parametrize("outcome,noise_std", [("answer_mean", 1e-3), ("last", 1e-2),
                                               ("answer_joint", 0.0)])
def test_importance_equals_central_finite_differences(outcome, noise_std):
    model = tiny_llama()
    ids, attn, positions, answer = layout()
    s = input_grad_importance(model, ids, attn, positions, answer, outcome=outcome,
                              noise_std=noise_std, generator=torch.Generator().manual_seed(7))
    assert s.dtype == torch.float64 and (s[~positions.bool()] == 0).all()
    e_all = model.get_input_embeddings()(ids).detach()
    noise = torch.randn(e_all.shape, generator=torch.Generator().manual_seed(7),
                        dtype=torch.float64) * noise_std
    x_all = e_all + torch.where(positions.bool()[..., None], noise, 0)
    h = 1e-3  # J is tiny near the reference (a KL at the noise scale): a moderate step
    with torch.no_grad():
        for i in range(ids.shape[0]):
            for t in positions[i].nonzero().flatten().tolist():
                step = torch.zeros_like(x_all[i])
                step[t] = e_all[i, t] * h
                up = objective(model, ids[i], attn[i], answer[i], x_all[i] + step, e_all[i], outcome)
                down = objective(model, ids[i], attn[i], answer[i], x_all[i] - step, e_all[i],
                                 outcome)
                fd = abs(float(up - down) / (2 * h))
                assert s[i, t].item() == pytest.approx(fd, rel=1e-4, abs=1e-13), (i, t)
    assert s[positions.bool()].max() > 0
    # the parameters get no gradient from it
    assert all(p.grad is None for p in model.parameters())


def test_importance_noise_and_outcome_take_effect():
    model = tiny_llama()
    ids, attn, positions, answer = layout()

    def run(**kw):
        return input_grad_importance(model, ids, attn, positions, answer,
                                     generator=torch.Generator().manual_seed(3), **kw)

    base = run()
    assert torch.equal(base, run())  # a fixed generator: a fixed importance
    assert not torch.allclose(base, run(noise_std=1e-2))
    assert not torch.allclose(base, run(outcome="answer_joint"))
    assert not torch.allclose(base, run(outcome="last"))
    with pytest.raises(ValueError, match="^outcome: expected one of"):
        run(outcome="mean")
    with pytest.raises(ValueError, match="^answer_mask: expected at least one"):
        input_grad_importance(model, ids, attn, positions, torch.zeros_like(answer))


@pytest.mark.parametrize("outcome", ["answer_mean", "last", "answer_joint"])
def test_importance_in_passes_of_fewer_rows_is_the_same(outcome):
    """Rows are independent and the noise is drawn for the whole batch first: one row or
    two per pass give the one-pass importance; the weights keep ``requires_grad``."""
    model = tiny_llama()
    model.lm_head.weight.requires_grad_(True)
    ids, attn, positions, answer = layout()

    def run(rows):
        return input_grad_importance(model, ids, attn, positions, answer, outcome=outcome,
                                     generator=torch.Generator().manual_seed(5),
                                     rows_per_pass=rows)

    whole = run(None)
    assert whole[positions.bool()].max() > 0
    for rows in (1, 2, 8):
        torch.testing.assert_close(run(rows), whole, rtol=1e-10, atol=1e-15)
    assert all(p.requires_grad for p in model.parameters())
    assert all(p.grad is None for p in model.parameters())
    with pytest.raises(ValueError, match="^rows_per_pass: expected a positive integer"):
        run(0)


def test_append_answer_places_each_answer_after_its_response():
    prompt = torch.tensor([[0, 1, 2], [3, 4, 5]])
    pmask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    resp = torch.tensor([[6, 7, 0], [8, 9, 10]])
    rmask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    ids, attn, positions, answer = append_answer(prompt, pmask, resp, rmask, [[20, 21], [22]],
                                                 pad_id=0, conclusion=[19])
    assert ids.tolist() == [[0, 1, 2, 6, 7, 19, 20, 21, 0], [3, 4, 5, 8, 9, 10, 19, 22, 0]]
    assert attn.tolist() == [[0, 1, 1, 1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1, 1, 1, 0]]
    assert positions.long().tolist() == [[0, 0, 0, 1, 1, 0, 0, 0, 0], [0, 0, 0, 1, 1, 1, 0, 0, 0]]
    # the answer's tokens only, not the conclusion's (the code's separate segments)
    assert answer.long().tolist() == [[0, 0, 0, 0, 0, 0, 1, 1, 0], [0, 0, 0, 0, 0, 0, 0, 1, 0]]
    model = tiny_llama()
    s = response_importance(model, prompt, pmask, resp, rmask, [[20, 21], [22]], 0,
                            conclusion=[19], generator=torch.Generator().manual_seed(0))
    assert s.shape == (2, 3) and s[0, 2] == 0 and (s[rmask.bool()] > 0).all()
    other = response_importance(model, prompt, pmask, resp, rmask, [[20, 21], [22]], 0,
                                generator=torch.Generator().manual_seed(0))
    assert not torch.allclose(s, other)  # the conclusion is read


def test_answer_tokens_split_the_conclusion_from_the_answer():
    from ktae.models.input_grad_importance import CONCLUDE, answer_tokens

    def tok(text, add_special_tokens=False):
        return {"input_ids": [ord(c) for c in text]}

    conclusion, answers = answer_tokens(tok, ["64", [" 8", "eight"]])
    assert conclusion == [ord(c) for c in CONCLUDE] and answers == [[54, 52], [56]]
    for bad in (None, "  ", []):
        with pytest.raises(ValueError, match="^answer: row 1 has no reference answer"):
            answer_tokens(tok, ["1", bad])


# ------------------------------------------------------------------ commands


@pytest.mark.slow
@pytest.mark.parametrize("algo,extra", [("grpo", {"max_steps": 1}),
                                        ("dapo", {"max_steps": 2, "max_generation_rounds": 3})])
def test_train_steps(tiny_model, tmp_path, algo, extra):
    """What the estimator read is the importance of each kept row's own generation round
    (DAPO's refill rounds each get their pass), and the advantages are OAR-G's on it."""
    from test_train_helpers import contains_digit, read_jsonl, tiny_config

    from ktae.train.dynamic_sampling import need_key
    from ktae.train.session import train
    from ktae.train.trainer import KTAEGRPOTrainer

    seen, rounds = [], []

    class Rec(KTAEGRPOTrainer):
        def _rollout_needs(self, batch, inputs):
            out = super()._rollout_needs(batch, inputs)
            rounds.append(out[need_key("input_grad_importance")].clone())
            return out

        def _finish_batch(self, batch, rewards, correct, mode, **kwargs):
            entry = {"rewards": rewards.clone(), "mask": batch["ktae_token_mask"].bool(),
                     "importance": batch[need_key("input_grad_importance")].clone()}
            out = super()._finish_batch(batch, rewards, correct, mode, **kwargs)
            entry["advantages"] = out["advantages"].clone()
            seen.append(entry)
            return out

    cfg = tiny_config(tiny_model, tmp_path / "run", algo=algo, credit="oar-g",
                      estimator_options={"gating_beta": 2}, **extra)
    train(cfg, trainer_cls=Rec, reward_funcs=[contains_digit])
    metrics = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [m["step"] for m in metrics] == list(range(1, extra["max_steps"] + 1))
    assert len(rounds) == sum(m["generation_rounds"] for m in metrics)
    for entry in seen:
        mask, B = entry["mask"], entry["rewards"].numel()
        # (a token with a zero embedding, the pad token ending a response, has importance 0)
        assert (entry["importance"][mask] > 0).float().mean() > 0.8
        assert (entry["importance"][~mask] == 0).all()
        expected = ktae.compute_advantages(
            "oar-g", rewards=entry["rewards"], group=torch.arange(B) // cfg.num_generations,
            mask=mask, input_grad_importance=entry["importance"], gating_beta=2)
        torch.testing.assert_close(entry["advantages"], expected.float() * mask)
        for row, m in zip(entry["importance"], mask, strict=True):
            n = int(m.sum())
            assert any(torch.equal(row[:n], r[:n]) for rnd in rounds for r in rnd
                       if r.shape[0] >= n)
    if algo == "dapo":
        assert max(m["generation_rounds"] for m in metrics) > 1  # rows from several rounds

GROUPS = [
    {"prompt": "Q:37+45-18 A:", "answer": "64", "rewards": [1, 0, 0, 1],
     "responses": ["37+45=82. 82-18=64. \\boxed{64}", "37+45=72. 72-18=54. \\boxed{54}",
                   "37+45=82. 82-18=74. \\boxed{74}", "37+45=72. 72-18=64. \\boxed{64}"],
     "wrong": [[], [[6, 8]], [[16, 18]], [[6, 8], [16, 18]]]},
    {"prompt": "Q:5+3 A:", "answer": "8", "rewards": [1, 0, 0],
     "responses": ["5+3=8. \\boxed{8}", "5+3=9. \\boxed{9}", "5+3=8. \\boxed{7}"],
     "wrong": [[], [[4, 5]], [[14, 15]]]},
]


def _jsonl(path, records):
    import json

    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


@pytest.mark.slow
def test_explain_and_audit_compute_it_with_the_model(tmp_path, capsys):
    from ktae.cli import main

    src = _jsonl(tmp_path / "groups.jsonl", GROUPS)
    out = tmp_path / "page.html"
    assert main(["explain", str(src), "--credit", "oar-g", "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "needs the model's input-gradient importance" in err, err
    assert main(["explain", str(src), "--credit", "oar-g@gating_beta=3", "--model", "default",
                 "-o", str(out)]) == 0
    assert 'id="view-token"' in out.read_text(encoding="utf-8")
    result = ktae.audit(src, credit="grpo,oar-g", resamples=0)
    assert result["scored_with"] and set(result["methods"]) == {"grpo", "oar-g"}
    assert result["methods"]["oar-g"]["all"] != result["methods"]["grpo"]["all"]
    no_answer = _jsonl(tmp_path / "no_answer.jsonl",
                       [{k: v for k, v in g.items() if k != "answer"} for g in GROUPS])
    with pytest.raises(ValueError, match="needs the group's reference answer"):
        ktae.audit(no_answer, credit="oar-g", resamples=0)


@pytest.mark.slow
def test_shipped_model_train_step_then_explain_and_audit_the_run(tmp_path, capsys):
    """``ktae train --credit oar-g`` on ``--model default``: the recorded importance is what
    the estimator read, and ``ktae explain`` / ``ktae audit`` of the run use it (no model)."""
    from ktae.cli import main
    from ktae.runs.rollouts import read_rollouts

    run = tmp_path / "run"
    assert main(["train", "--model", "default", "--credit", "oar-g", "--estimator-option",
                 "threshold=0.8", "--max-steps", "1", "--num-prompts", "8",
                 "--num-generations", "4", "--max-new-tokens", "40", "--eval-size", "4",
                 "--eval-every", "0", "--train-size", "64", "--save-every", "0",
                 "--no-progress", "--algo", "grpo", "--rollout-every", "1",
                 "--rollout-groups", "8", "--output-dir", str(run)]) == 0
    header, records = read_rollouts(run / "rollouts.jsonl")
    assert header["estimator"] == "oar-g" and len(records) == 8
    for rec in records:
        lengths = [len(r) for r in rec["responses"]]
        T = max(lengths)
        mask = torch.arange(T)[None] < torch.tensor(lengths)[:, None]
        pad = [x + [0.0] * (T - len(x)) for x in rec["input_grad_importance"]]
        expected = ktae.compute_advantages(
            "oar-g", rewards=torch.tensor(rec["rewards"]), group=[0] * len(lengths), mask=mask,
            input_grad_importance=torch.tensor(pad), threshold=0.8)
        got = torch.tensor([x + [0.0] * (T - len(x)) for x in rec["advantages"]])
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)  # 6 digits stored
    out = tmp_path / "page.html"
    assert main(["explain", str(run), "-o", str(out)]) == 0
    assert "trained with credit oar-g" in out.read_text(encoding="utf-8")
    result = ktae.audit(run, credit="grpo,oar-g", resamples=0)
    assert result["scored_with"] == "recorded" and "oar-g" in result["methods"]
