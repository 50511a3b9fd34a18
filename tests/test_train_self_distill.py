"""``ktae train`` with the self-teacher (docs/method.md §17): ``--credit sdpo`` reads the
teacher pass of each generated batch with the method's options, and the
``--self-distill`` terms equal the authors' functions on logits from plain row-by-row
forward passes over the row's own and privileged contexts."""

from __future__ import annotations

import pytest
import self_distill_oracle as authors
import torch
from test_train_helpers import contains_digit, read_jsonl, tiny_config

import ktae
from ktae.core.self_distill import SDPO_TEMPLATE, SelfDistill
from ktae.models.self_teacher import choose_teachers, solution_tokens, teacher_logprobs
from ktae.train.dynamic_sampling import need_key
from ktae.train.self_distill import HAS_TEACHER
from ktae.train.session import train
from ktae.train.trainer import KTAEGRPOTrainer

pytestmark = pytest.mark.slow


def _verdicts(trainer, b):
    per_func = trainer._last_rewards_per_func[trainer._local_slice(b)]
    return per_func[:, 0].cpu() > 0.5, torch.arange(b) // trainer.num_generations


def test_sdpo_credit_reads_the_teacher_pass_with_its_options(tiny_model, tmp_path):
    seen = []

    class Rec(KTAEGRPOTrainer):
        def _rollout_needs(self, batch, inputs):
            out = super()._rollout_needs(batch, inputs)
            b = batch["completion_ids"].shape[0]
            correct, group = _verdicts(self, b)
            student = out[need_key("logprobs")]
            expected, has = teacher_logprobs(
                self.model, self._tokenizer, batch["prompt_ids"], batch["prompt_mask"],
                batch["completion_ids"], batch["completion_mask"], correct=correct,
                group=group, student_logprobs=student, choose="shortest",
                template="<{solution}>", temperature=self.temperature)
            seen.append({"got": out[need_key("teacher_logprobs")].clone(), "expected": expected,
                         "has": has, "student": student.clone()})
            return out

        def _finish_batch(self, batch, rewards, correct, mode, **kwargs):
            entry = seen[-1]
            mask = batch["ktae_token_mask"].bool()
            out = super()._finish_batch(batch, rewards, correct, mode, **kwargs)
            entry["advantages"] = out["advantages"].clone()
            entry["check"] = ktae.compute_advantages(
                "sdpo", rewards=rewards, group=torch.arange(len(rewards)) // 4, mask=mask,
                logprobs=entry["student"], teacher_logprobs=entry["got"], lam=0.5).float() * mask
            return out

    cfg = tiny_config(tiny_model, tmp_path / "run", algo="grpo", max_steps=1, temperature=0.8,
                      credit="sdpo@lam=0.5@teacher_choice=shortest@teacher_template=<{solution}>",
                      rollout_every=1, rollout_groups=4)
    train(cfg, trainer_cls=Rec, reward_funcs=[contains_digit])
    (entry,) = seen
    from ktae.runs.rollouts import read_rollouts

    _, records = read_rollouts(tmp_path / "run" / "rollouts.jsonl")
    assert len(records) == 4
    recorded = [row for rec in records for row in rec["teacher_logprobs"]]
    for row, want in zip(recorded, entry["got"], strict=True):
        torch.testing.assert_close(torch.tensor(row), want[:len(row)], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(entry["got"], entry["expected"])
    assert entry["has"].any() and not entry["has"].all()
    assert torch.equal(entry["got"][~entry["has"]], entry["student"][~entry["has"]])
    assert (entry["got"][entry["has"]] != entry["student"][entry["has"]]).any()
    torch.testing.assert_close(entry["advantages"], entry["check"])


def _row_logits(model, context, completion):
    ids = torch.tensor([context + completion])
    return model(input_ids=ids).logits[0, len(context) - 1:-1].double()


def _expected_term(trainer, inputs, settings):
    """The term from plain row-by-row passes and the authors' functions."""
    o = settings.options
    tok, T = trainer._tokenizer, inputs["completion_ids"].shape[1]
    b = inputs["completion_ids"].shape[0]
    ids, cmask = inputs["completion_ids"], inputs["completion_mask"]
    has = inputs[HAS_TEACHER].bool()
    before, _, after = o["teacher_template"].partition("{solution}")

    def enc(text):
        return tok(text, add_special_tokens=False)["input_ids"] if text else []

    s_logits = torch.zeros(b, T, trainer.model.config.vocab_size, dtype=torch.float64)
    t_logits = torch.zeros_like(s_logits)
    teachers = trainer._teachers_of_micro_batch
    with torch.no_grad():
        for i in range(b):
            n = int(cmask[i].sum())
            own = inputs["prompt_ids"][i][inputs["prompt_mask"][i].bool()].tolist()
            comp = ids[i, :n].tolist()
            s_logits[i, :n] = _row_logits(trainer.model, own, comp)
            if has[i]:
                ctx = own + enc(before) + teachers[i] + enc(after)
                t_logits[i, :n] = _row_logits(trainer.model, ctx, comp)
    temp = trainer.temperature
    logp = torch.log_softmax(s_logits / temp, -1).gather(-1, ids[..., None]).squeeze(-1)
    mask = cmask.double()
    if settings.kind == "sdpg":
        kl = authors.sdpg_kl_per_token(s_logits, t_logits, temp) * has[:, None]
        beta = authors._compute_effective_beta(o["beta"], trainer.state.global_step,
                                               trainer.state.max_steps, o["warmup_steps"],
                                               o["decay_steps"])
        term = beta * kl
        if o["positive_only"]:
            adv = inputs["advantages"]
            term = term * ((adv[:, None] if adv.dim() == 1 else adv) > 0)
        return authors.agg_loss(term, mask, "token-mean")
    cfg = type("C", (), {"full_logit_distillation": settings.kind == "sdpo", "alpha": 1.0,
                         "is_clip": o["is_clip"]})()
    if settings.kind == "sdpo":
        cfg.alpha, cfg.distillation_topk, cfg.distillation_add_tail = (o["alpha"], o["topk"],
                                                                       o["add_tail"])
    s_all = torch.log_softmax(s_logits / temp, -1)
    t_all = torch.log_softmax(t_logits / temp, -1)
    kw = {}
    if settings.kind == "sdpo":
        idx = torch.topk(s_logits / temp, o["topk"], dim=-1).indices
        kw = {"student_topk_log_probs": s_all.gather(-1, idx),
              "teacher_topk_log_probs": t_all.gather(-1, idx)}
    q = t_all.gather(-1, ids[..., None]).squeeze(-1)
    return o["coef"] * authors.compute_self_distillation_loss(
        logp, q, mask, cfg, old_log_probs=logp, self_distillation_mask=has.double(), **kw)


@pytest.mark.parametrize("kind,options", [
    ("sdpg", {"teacher_source": "group", "beta": 0.5, "decay_steps": 2}),
    ("sdpg", {"teacher_source": "group", "beta": 0.5, "warmup_steps": 2, "positive_only": True,
              "teacher_template": "[{solution}]"}),
    ("sdpo", {"topk": 5, "alpha": 0.3, "coef": 0.7, "is_clip": 1.5}),
    ("sdpo-token", {"coef": 2.0, "teacher_choice": "shortest"}),
])
def test_self_distill_terms_equal_the_authors_on_plain_passes(tiny_model, tmp_path, kind,
                                                              options):
    checks = []

    class Rec(KTAEGRPOTrainer):
        def _teacher_prompts(self, batch, inputs):
            out = super()._teacher_prompts(batch, inputs)
            b = batch["completion_ids"].shape[0]
            correct, group = _verdicts(self, b)
            o = self.credit.self_distill.options
            chosen = choose_teachers(correct, group, batch["completion_mask"].sum(1),
                                     choose=o["teacher_choice"], seed=o["teacher_seed"])
            drop = {self._tokenizer.eos_token_id, self._tokenizer.pad_token_id}
            sols = [None if j < 0 else solution_tokens(batch["completion_ids"],
                                                       batch["completion_mask"], j, drop)
                    for j in chosen.tolist()]
            # each row's teaching solution, found again by the row's completion
            self._solutions = {tuple(batch["completion_ids"][i].tolist()): s
                               for i, s in enumerate(sols)}
            return out

        def _self_distill_term(self, model, inputs):
            got = super()._self_distill_term(model, inputs)
            self._teachers_of_micro_batch = [self._solutions[tuple(r.tolist())]
                                             for r in inputs["completion_ids"]]
            scale = self.current_gradient_accumulation_steps
            expected = _expected_term(self, inputs, self.credit.self_distill) / scale
            checks.append((got.detach().double(), expected, self.state.global_step))
            return got

    cfg = tiny_config(tiny_model, tmp_path / "run", algo="dapo", dynamic_sampling=False,
                      max_steps=2, temperature=0.7, credit="grpo", self_distill=kind,
                      self_distill_options=options)
    train(cfg, trainer_cls=Rec, reward_funcs=[contains_digit])
    assert len(checks) >= 2
    for got, expected, _ in checks:
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-7)
    assert any(abs(float(g)) > 0 for g, _, _ in checks)
    metrics = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert all("self_distill_term" in m and 0 < m["teacher_row_fraction"] < 1 for m in metrics)
    if kind == "sdpg":
        beta = [m["beta_effective"] for m in metrics]
        assert beta == ([0.5, 0.25] if "decay_steps" in options else [0.0, 0.25])


def test_self_distill_settings_errors():
    for kind, options, match in [
        ("sdpx", {}, "self_distill: expected one of none, sdpo, sdpo-token, sdpg"),
        ("sdpg", {"alpha": 0.5}, "'alpha' is not an option of sdpg"),
        ("sdpo", {"topk": 0}, "topk: expected a positive integer or none"),
        ("sdpg", {"warmup_steps": -1}, "warmup_steps: expected a non-negative integer"),
        ("sdpg", {"positive_only": "maybe"}, "positive_only: expected true or false"),
        ("sdpo", {"teacher_source": "x"}, "teacher_source: expected one of"),
        ("none", {"beta": 1}, "self_distill_options: given without --self-distill"),
    ]:
        with pytest.raises(ValueError, match=match) as err:
            SelfDistill.parse(kind, options)
        assert "\n" not in str(err.value)
    s = SelfDistill.parse("sdpg", {"beta": "0.01", "positive_only": "true"})
    assert s.options["beta"] == 0.01 and s.options["positive_only"] is True
    assert s.options["teacher_source"] == "reference"
    assert SelfDistill.parse("sdpo", {}).options["teacher_template"] == SDPO_TEMPLATE


def test_command_line_flags_reach_the_term(tmp_path):
    """``ktae train --self-distill sdpg --self-distill-option ...`` on the shipped model."""
    from ktae.cli import main

    run = tmp_path / "run"
    assert main(["train", "--model", "default", "--credit", "grpo", "--self-distill", "sdpg",
                 "--self-distill-option", "beta=0.01", "--self-distill-option",
                 "teacher_source=group", "--max-steps", "1", "--num-prompts", "2",
                 "--num-generations", "4", "--max-new-tokens", "12", "--eval-size", "4",
                 "--eval-every", "0", "--train-size", "16", "--save-every", "0",
                 "--no-progress", "--algo", "grpo", "--output-dir", str(run)]) == 0
    (m,) = read_jsonl(run / "metrics.jsonl")
    assert m["beta_effective"] == 0.01 and "self_distill_term" in m
