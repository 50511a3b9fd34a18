"""DelTA (ktae.core.delta_credit): the vectorised weights against a per-token reference
written from the method's steps, a hand-computed case, the authors' own function
(tests/delta_oracle.py), the estimator's options and errors."""

from __future__ import annotations

import math

import pytest
import torch
from delta_oracle import compute_log_prob_h_normal

import ktae
from ktae.core.delta_credit import delta_weights, token_grad_proxy
from ktae.core.methods import Method, check_method


def _sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x)) if x >= 0 else math.exp(x) / (1 + math.exp(x))


def slow_delta_weights(v, adv, mask, K=1, lam_min=0.8, lam_max=1.2):
    """docs/method.md §19, the weights, one token at a time, in Python floats."""
    B, T, H = v.shape
    toks = [(i, t) for i in range(B) for t in range(T) if mask[i][t]]
    vec = {(i, t): [float(v[i, t, k]) for k in range(H)] for i, t in toks}
    a = [float(x) for x in adv]

    def centroid(weight):
        total = sum(weight[x] for x in toks)
        return [sum(weight[x] * vec[x][k] for x in toks) / max(total, 1e-8) for k in range(H)]

    def dist(x, mu):
        return sum((vec[x][k] - mu[k]) ** 2 for k in range(H))

    def margins(mu_p, mu_n):
        mp = {x: dist(x, mu_n) - dist(x, mu_p) for x in toks}
        return mp, {x: -mp[x] for x in toks}

    def scale(m, side):
        vals = [m[x] for x in toks if side(a[x[0]])]
        n = max(len(vals), 1)
        mean = sum(vals) / n
        return math.sqrt(max(sum(u * u for u in vals) / n - mean * mean, 1e-8))

    pos, neg = (lambda s: s > 0), (lambda s: s < 0)
    mu_p = centroid({x: max(a[x[0]], 0) for x in toks})
    mu_n = centroid({x: max(-a[x[0]], 0) for x in toks})
    mp, mn = margins(mu_p, mu_n)
    gp, gn = scale(mp, pos), scale(mn, neg)
    for _ in range(K):
        mu_p = centroid({x: _sigmoid(mp[x] / gp) * max(a[x[0]], 0) for x in toks})
        mu_n = centroid({x: _sigmoid(mn[x] / gn) * max(-a[x[0]], 0) for x in toks})
        gp, gn = scale(mp, pos), scale(mn, neg)
        mp, mn = margins(mu_p, mu_n)
    w = {}
    for x in toks:
        s = a[x[0]]
        if s > 0:
            w[x] = lam_min + (lam_max - lam_min) * _sigmoid(mp[x] / gp)
        elif s < 0:
            w[x] = lam_min + (lam_max - lam_min) * _sigmoid(mn[x] / gn)
        else:
            w[x] = lam_min
    norm = len(toks) / max(sum(w.values()), 1e-8)
    out = torch.zeros(B, T, dtype=torch.float64)
    for x in toks:
        out[x] = w[x] * norm
    return out


def _batch(seed, B=6, T=7, H=5):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(B, T, H, generator=g, dtype=torch.float64)
    logp = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    adv[0] = 0.0
    return h, logp, mask, adv


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(("K", "lam_min", "lam_max"), [(1, 0.8, 1.2), (0, 0.5, 2.0), (3, 0.0, 1.0)])
def test_weights_match_the_per_token_reference(seed, K, lam_min, lam_max):
    h, logp, mask, adv = _batch(seed)
    v = token_grad_proxy(h, logp, mask)
    got = delta_weights(v, adv, mask, K=K, lam_min=lam_min, lam_max=lam_max)
    want = slow_delta_weights(v, adv, mask, K=K, lam_min=lam_min, lam_max=lam_max)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)
    assert got.sum().item() == pytest.approx(mask.sum().item())
    assert (got[~mask] == 0).all()


def test_a_hand_computed_case():
    # H = 1, K = 0: a positive response with v = 1, 3 (A = 1), a negative one with v = -1
    # (A = -1): mu+ = 2, mu- = -1; m+ = (4 - 1, 16 - 1) = (3, 15), gamma+ = std = 6;
    # m- = 9 - 0 = 9, gamma- = sqrt(1e-8) = 1e-4, so its sigmoid is 1
    v = torch.tensor([[[1.0], [3.0]], [[-1.0], [0.0]]], dtype=torch.float64)
    mask = torch.tensor([[True, True], [True, False]])
    w = delta_weights(v, torch.tensor([1.0, -1.0]), mask, K=0)
    raw = [0.8 + 0.4 * _sigmoid(0.5), 0.8 + 0.4 * _sigmoid(2.5), 1.2]
    norm = 3 / sum(raw)
    torch.testing.assert_close(w, torch.tensor([[raw[0] * norm, raw[1] * norm],
                                                [raw[2] * norm, 0.0]], dtype=torch.float64))


@pytest.mark.parametrize("seed", [0, 3])
@pytest.mark.parametrize("K", [0, 1, 2])
def test_weights_match_the_authors_function(seed, K):
    h, logp, mask, adv = _batch(seed, B=8, T=6, H=4)
    adv[3] = 0.0
    m = mask.to(torch.float64)
    micro = [{"log_probs": logp[i:i + 3], "h": h[i:i + 3], "attention_mask": m[i:i + 3],
              "advantages": (adv[i:i + 3, None] * m[i:i + 3])} for i in range(0, 8, 3)]
    W, b, preds, weights, weighted = compute_log_prob_h_normal(micro, K=K)
    got = delta_weights(token_grad_proxy(h, logp, mask), adv, mask, K=K)
    # the code casts the advantages to float32: agreement to float32's precision
    torch.testing.assert_close(got, weights.to(torch.float64), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(adv.float()[:, None].double() * got,
                               weighted.to(torch.float64), rtol=1e-5, atol=1e-6)


def test_the_estimator_is_the_base_advantage_times_the_weights():
    h, logp, mask, _ = _batch(4, B=6)
    v = token_grad_proxy(h, logp, mask)
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 1.0])
    group = [0, 0, 1, 1, 2, 2]
    out = ktae.compute_advantages("delta", rewards=rewards, group=group, mask=mask,
                                  token_grad_proxy=v, K=2, lam_min=0.5, lam_max=1.5)
    seq = ktae.compute_advantages("grpo", rewards=rewards, group=group)
    w = delta_weights(v, seq.double(), mask, K=2, lam_min=0.5, lam_max=1.5)
    torch.testing.assert_close(out, (seq[:, None].double() * w).float())
    # the options are read: other values give other credit
    other = ktae.compute_advantages("delta", rewards=rewards, group=group, mask=mask,
                                    token_grad_proxy=v)
    assert not torch.allclose(out, other)
    # lam_min = lam_max: every weight is 1, the credit is the base advantage
    flat = ktae.compute_advantages("delta", rewards=rewards, group=group, mask=mask,
                                   token_grad_proxy=v, lam_min=1.0, lam_max=1.0)
    torch.testing.assert_close(flat, torch.where(mask, seq[:, None], 0.0))
    rloo = ktae.compute_advantages("delta", rewards=rewards, group=group, mask=mask,
                                   token_grad_proxy=v, base="rloo", lam_min=1.0, lam_max=1.0)
    seq_rloo = ktae.compute_advantages("rloo", rewards=rewards, group=group)
    torch.testing.assert_close(rloo, torch.where(mask, seq_rloo[:, None], 0.0))


@pytest.mark.parametrize(("options", "message"), [
    ({"K": -1}, "K: expected an integer >= 0"),
    ({"K": 1.5}, "K: expected an integer >= 0"),
    ({"lam_min": 1.3}, r"lam_max: expected >= lam_min \(1.3\)"),
    ({"lam_min": -0.1}, "lam_min"),
    ({"base": "nope"}, "base: expected one of"),
])
def test_bad_options_are_refused_in_one_line(options, message):
    mask = torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match=message):
        ktae.compute_advantages("delta", rewards=torch.tensor([1.0, 0.0]), group=[0, 0],
                                mask=mask, token_grad_proxy=torch.ones(2, 3, 4), **options)


def test_a_missing_or_misshapen_proxy_is_refused():
    mask = torch.ones(2, 3, dtype=torch.bool)
    kw = {"rewards": torch.tensor([1.0, 0.0]), "group": [0, 0], "mask": mask}
    with pytest.raises(ValueError, match="token_grad_proxy: required by advantage estimator"):
        ktae.compute_advantages("delta", **kw)
    with pytest.raises(ValueError, match=r"token_grad_proxy: expected a \[B, T, H\] tensor"):
        ktae.compute_advantages("delta", token_grad_proxy=torch.ones(2, 3), **kw)
    bad = torch.ones(2, 3, 4)
    bad[0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="token_grad_proxy: expected finite values"):
        ktae.compute_advantages("delta", token_grad_proxy=bad, **kw)


def test_the_start_up_check_runs_the_method_and_names_a_bad_option():
    check_method(Method("delta"))
    assert [n.name for n in Method("delta").model_needs] == ["token_grad_proxy"]
    with pytest.raises(ValueError, match=r"estimator_options \(delta\): K: expected"):
        check_method(Method("delta", estimator_options={"K": -2}))


def test_token_grad_proxy_is_one_minus_p_times_h():
    h = torch.tensor([[[1.0, -2.0], [3.0, 0.5]]])
    logp = torch.log(torch.tensor([[0.25, 0.9]]))
    v = token_grad_proxy(h, logp, torch.tensor([[True, False]]))
    torch.testing.assert_close(v, torch.tensor([[[0.75, -1.5], [0.0, 0.0]]]))


# ------------------------------------------------------------------ from a model


def _tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=23, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                      attn_implementation="eager")
    return LlamaForCausalLM(cfg).eval()


def test_the_model_proxy_is_one_minus_p_times_the_head_input():
    pytest.importorskip("transformers")
    from ktae.models.token_grad_proxy import response_token_grad_proxy

    model = _tiny_llama()
    g = torch.Generator().manual_seed(2)
    prompt = torch.randint(3, 23, (3, 4), generator=g)
    pmask = torch.ones(3, 4, dtype=torch.long)
    pmask[1, :2] = 0  # a left-padded prompt
    comp = torch.randint(3, 23, (3, 5), generator=g)
    cmask = torch.ones(3, 5, dtype=torch.long)
    cmask[2, 3:] = 0
    got = response_token_grad_proxy(model, prompt, pmask, comp, cmask, temperature=0.7,
                                    rows_per_pass=2)
    assert got.shape == (3, 5, 16)
    for i in range(3):  # one row at a time, without its padding, from the body's output
        ids = torch.cat([prompt[i][pmask[i].bool()], comp[i][cmask[i].bool()]])[None]
        P, n = int(pmask[i].sum()), int(cmask[i].sum())
        with torch.no_grad():
            h = model.model(input_ids=ids).last_hidden_state[0, P - 1:P + n - 1]
            logp = torch.log_softmax(model.lm_head(h) / 0.7, dim=-1)
        p = logp.gather(-1, ids[0, P:, None]).exp()
        torch.testing.assert_close(got[i, :n], (1 - p) * h, rtol=1e-4, atol=1e-5)
        assert (got[i, n:] == 0).all()
    other = response_token_grad_proxy(model, prompt, pmask, comp, cmask, temperature=1.0)
    assert not torch.allclose(got, other)  # the temperature is read
    with pytest.raises(ValueError, match="temperature"):
        response_token_grad_proxy(model, prompt, pmask, comp, cmask, temperature=0)


@pytest.mark.slow
@pytest.mark.parametrize("algo,extra", [("grpo", {"max_steps": 2}),
                                        ("dapo", {"max_steps": 2, "max_generation_rounds": 3})])
def test_train_steps(tiny_model, tmp_path, algo, extra):
    """``ktae train --credit delta``: the estimator reads the proxy of the trained rows (DAPO's
    refill rounds merged), and the advantages are DelTA's on it."""
    from test_train_helpers import contains_digit, read_jsonl, tiny_config

    from ktae.train.dynamic_sampling import need_key
    from ktae.train.session import train
    from ktae.train.trainer import KTAEGRPOTrainer

    seen = []

    class Rec(KTAEGRPOTrainer):
        def _finish_batch(self, batch, rewards, correct, mode, **kwargs):
            entry = {"rewards": rewards.clone(), "mask": batch["ktae_token_mask"].bool(),
                     "proxy": batch[need_key("token_grad_proxy")].clone()}
            out = super()._finish_batch(batch, rewards, correct, mode, **kwargs)
            entry["advantages"] = out["advantages"].clone()
            seen.append(entry)
            return out

    cfg = tiny_config(tiny_model, tmp_path / "run", algo=algo, credit="delta",
                      estimator_options={"K": 2, "lam_min": 0.5}, **extra)
    train(cfg, trainer_cls=Rec, reward_funcs=[contains_digit])
    metrics = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [m["step"] for m in metrics] == list(range(1, extra["max_steps"] + 1))
    assert seen
    for entry in seen:
        mask, B = entry["mask"], entry["rewards"].numel()
        assert entry["proxy"].dim() == 3 and (entry["proxy"][~mask] == 0).all()
        assert (entry["proxy"][mask].abs().sum(dim=-1) > 0).all()
        expected = ktae.compute_advantages(
            "delta", rewards=entry["rewards"], group=torch.arange(B) // cfg.num_generations,
            mask=mask, token_grad_proxy=entry["proxy"], K=2, lam_min=0.5)
        torch.testing.assert_close(entry["advantages"], expected.float() * mask)
    # a batch with signal, whose tokens DelTA weighted unequally (not GRPO's broadcast)
    assert any(not torch.allclose(e["advantages"], torch.where(e["mask"], ktae.compute_advantages(
        "grpo", rewards=e["rewards"], group=torch.arange(e["rewards"].numel())
        // cfg.num_generations)[:, None], 0.0)) for e in seen)
    if algo == "dapo":
        assert max(m["generation_rounds"] for m in metrics) > 1  # rows from several rounds


def test_the_verl_plugin_refuses_it_in_one_line():
    """verl computes advantages on the driver, away from the actor's hidden states."""
    from ktae.integrations.verl.options import estimator_settings

    with pytest.raises(ValueError, match=r"^algorithm\.adv_estimator=delta: .*"
                                         r"needs=token_grad_proxy.*use ktae train$") as err:
        estimator_settings("delta", {})
    assert "\n" not in str(err.value)


def test_the_group_provider_is_the_model_proxy_of_each_response():
    """``ktae explain``/``ktae audit``'s pass: each group's responses after its prompt, as
    the trainer's batch computes them."""
    pytest.importorskip("transformers")
    from test_self_teacher import Tok

    from ktae.groups.grad_proxy import grad_proxy_groups
    from ktae.groups.input import GroupInput
    from ktae.models.token_grad_proxy import response_token_grad_proxy

    model = _tiny_llama()
    responses = [[5, 6, 7, 1], [8, 9, 1], [10, 11, 12, 13, 1]]
    g = GroupInput(prompt="ab", responses=responses, rewards=[1.0, 0.0, 1.0])
    seen = []
    grad_proxy_groups(model, Tok(), [g], temperature=0.8, on_group=seen.append)
    assert seen == ["scores"]
    ids = torch.tensor([r + [0] * (5 - len(r)) for r in responses])
    mask = (torch.arange(5)[None] < torch.tensor([len(r) for r in responses])[:, None]).long()
    prompt = torch.tensor([Tok()("ab")["input_ids"]] * 3)
    expected = response_token_grad_proxy(model, prompt, torch.ones_like(prompt), ids, mask,
                                         temperature=0.8)
    for i, r in enumerate(responses):
        assert g.token_grad_proxy[i].shape == (len(r), 16)
        torch.testing.assert_close(g.token_grad_proxy[i], expected[i, :len(r)])


def _groups_file(tmp_path):
    import json

    src = tmp_path / "groups.jsonl"
    rows = [{"prompt": "Q:5+3 A:", "answer": "8", "rewards": [1, 0, 1, 0],
             "responses": ["8", "9 is it", "8 yes", "7"], "wrong": [[], [[0, 1]], [], [[0, 1]]]},
            {"prompt": "Q:2*3 A:", "answer": "6", "rewards": [0, 1, 1, 0],
             "responses": ["5", "6", "6 ok", "12"], "wrong": [[[0, 1]], [], [], [[0, 2]]]}]
    src.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return src


@pytest.mark.slow
def test_explain_and_audit_compute_it_with_the_model(tmp_path, capsys):
    from ktae.cli import main

    src = _groups_file(tmp_path)
    page = tmp_path / "p.html"
    assert main(["explain", str(src), "--credit", "delta", "-o", str(page)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "token-gradient proxy" in err and "--model" in err, err
    assert main(["explain", str(src), "--credit", "delta@K=2", "--model", "default",
                 "-o", str(page)]) == 0
    assert 'id="view-token"' in page.read_text(encoding="utf-8")
    result = ktae.audit(src, credit="grpo,delta,delta@lam_min=0.5", resamples=0)
    assert result["scored_with"]
    m = {name: v["all"] for name, v in result["methods"].items()}
    assert m["delta"]["tokens_changed"]["mean"] > 0 and m["grpo"]["tokens_changed"]["mean"] == 0
    assert m["delta"]["mass_gap"] != m["delta@lam_min=0.5"]["mass_gap"]


def test_the_simulator_refuses_it_in_one_line():
    from ktae.sim.credit import parse_method

    with pytest.raises(ValueError, match=r"^methods: 'delta' reads .*needs=token_grad_proxy"):
        parse_method("delta")
