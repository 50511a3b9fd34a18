"""SDPO's EMA teacher (docs/method.md §17): the average follows the authors' update rule,
the teacher's pass runs on the averaged weights, and ``ktae train`` steps and checkpoints it."""

from __future__ import annotations

import copy

import pytest
import self_distill_oracle as authors
import torch
from test_train_helpers import contains_digit, tiny_config

from ktae.core.self_distill import SelfDistill, ema_update_, sdpo_token_loss
from ktae.train.ema_teacher import FILE, EmaTeacher
from ktae.train.self_distill import HAS_TEACHER, TEACHER_IDS, TEACHER_MASK, distill_term


def _net(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Embedding(11, 6), torch.nn.Linear(6, 11))
    net[0].weight.requires_grad_(False)  # a frozen parameter: its average is itself
    return net


def test_the_average_follows_the_authors_update_rule():
    student = _net()
    ours = EmaTeacher(student, 0.05)
    theirs = copy.deepcopy(student)  # the authors' teacher module starts as the reference
    gen = torch.Generator().manual_seed(1)
    for _ in range(4):
        with torch.no_grad():
            for p in student.parameters():
                if p.requires_grad:
                    p.add_(torch.randn(p.shape, generator=gen))
        ours.update(student)
        authors.update_teacher(theirs, student, 0.05)
    trained = dict(theirs.named_parameters())
    assert set(ours.weights) == {"1.weight", "1.bias"}
    for name, w in ours.weights.items():
        torch.testing.assert_close(w, trained[name].detach())
        assert not torch.equal(w, dict(student.named_parameters())[name])
    # the frozen embedding: the authors' average of an unchanged parameter is unchanged
    torch.testing.assert_close(trained["0.weight"], student[0].weight)


def test_the_teachers_pass_runs_on_the_averaged_weights():
    model = _net()
    ema = EmaTeacher(model, 0.5)
    with torch.no_grad():
        model[1].weight.add_(1.0)
    ema.update(model)
    own = {n: p.detach().clone() for n, p in model.named_parameters()}
    teacher = copy.deepcopy(model)
    teacher[1].weight.data.copy_(ema.weights["1.weight"])
    teacher[1].bias.data.copy_(ema.weights["1.bias"])
    x = torch.tensor([[1, 2, 3]])
    with ema.applied(model) as m:
        torch.testing.assert_close(m(x), teacher(x))
    for n, p in model.named_parameters():  # its own weights again after the block
        assert torch.equal(p, own[n])
    with pytest.raises(RuntimeError), ema.applied(model):
        raise RuntimeError("a failing teacher pass")
    assert all(torch.equal(p, own[n]) for n, p in model.named_parameters())


class _LM(torch.nn.Module):
    """A causal LM shape for :func:`distill_term`: ``model(input_ids=...).logits``."""

    def __init__(self):
        super().__init__()
        self.net = _net()

    def forward(self, input_ids, attention_mask=None, position_ids=None):
        return type("Out", (), {"logits": self.net(input_ids)})


def test_the_loss_term_reads_the_ema_teacher():
    model = _LM()
    ema = EmaTeacher(model, 0.3)
    with torch.no_grad():
        model.net[1].weight.mul_(-2.0)
    ema.update(model)
    inputs = {"prompt_ids": torch.tensor([[1, 2], [3, 4]]), "prompt_mask": torch.ones(2, 2),
              "completion_ids": torch.tensor([[5, 6, 7], [8, 9, 10]]),
              "completion_mask": torch.ones(2, 3), TEACHER_IDS: torch.tensor([[1, 2, 4], [3, 4, 1]]),
              TEACHER_MASK: torch.ones(2, 3), HAS_TEACHER: torch.tensor([True, True])}
    settings = SelfDistill.parse("sdpo-token", {"teacher_update_rate": "0.3"})
    got, _ = distill_term(settings, model, inputs, temperature=1.0, loss_type="bnpo", step=0,
                          total_steps=1, teacher=ema.applied)
    plain, _ = distill_term(settings, model, inputs, temperature=1.0, loss_type="bnpo", step=0,
                            total_steps=1)

    def logps(lm, prompt):
        ids = torch.cat([prompt, inputs["completion_ids"]], 1)
        logits = lm(input_ids=ids).logits[:, prompt.shape[1] - 1:-1]
        return torch.log_softmax(logits, -1).gather(-1, inputs["completion_ids"][..., None])[..., 0]

    teacher = copy.deepcopy(model)
    for n, p in teacher.named_parameters():
        if n in ema.weights:
            p.data.copy_(ema.weights[n])
    s = logps(model, inputs["prompt_ids"])
    expected = sdpo_token_loss(s, logps(teacher, inputs[TEACHER_IDS]).detach(),
                               torch.ones(2, 3, dtype=torch.bool), old_logprobs=s.detach(),
                               is_clip=2.0)
    torch.testing.assert_close(got, expected)
    assert not torch.allclose(got, plain)


def test_bad_rates_and_checkpoints_are_one_line(tmp_path):
    with pytest.raises(ValueError, match=r"^teacher_update_rate: expected a number in \(0, 1\]"):
        EmaTeacher(_net(), 0)
    with pytest.raises(ValueError, match="^teacher_update_rate: expected a finite number >= 0 "
                                         "and <= 1"):
        SelfDistill.parse("sdpo", {"teacher_update_rate": "1.5"})
    with pytest.raises(ValueError, match="'teacher_update_rate' is not an option of sdpg"):
        SelfDistill.parse("sdpg", {"teacher_update_rate": "0.05"})
    with pytest.raises(ValueError, match="^teacher: expected 1 tensors"):
        ema_update_([], [torch.zeros(2)], 0.1)
    ema = EmaTeacher(_net(), 0.05)
    with pytest.raises(ValueError, match="^resume: .* holds no EMA teacher"):
        ema.load(tmp_path)
    ema.weights["1.bias"].fill_(3.0)
    ema.save(tmp_path)
    again = EmaTeacher(_net(), 0.05)
    again.load(tmp_path)
    assert torch.equal(again.weights["1.bias"], torch.full((11,), 3.0))


@pytest.mark.slow
def test_training_steps_the_average_and_saves_it(tiny_model, tmp_path):
    from ktae.train.session import train
    from ktae.train.trainer import KTAEGRPOTrainer

    seen = {}

    class Rec(KTAEGRPOTrainer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            model = self.accelerator.unwrap_model(self.model)
            seen["start"] = {n: p.detach().clone() for n, p in model.named_parameters()
                             if p.requires_grad}
            seen["steps"] = []
            trainer = self

            class Capture(torch.nn.Module):  # a callback: the policy after each step
                def on_step_end(self, args, state, control, **kwargs):
                    m = trainer.accelerator.unwrap_model(trainer.model)
                    seen["steps"].append({n: p.detach().clone() for n, p in m.named_parameters()
                                          if p.requires_grad})

            for name in ("on_init_end", "on_train_begin", "on_train_end", "on_epoch_begin",
                         "on_epoch_end", "on_step_begin", "on_substep_end", "on_pre_optimizer_step",
                         "on_optimizer_step", "on_evaluate", "on_predict", "on_save", "on_log",
                         "on_prediction_step", "on_push_begin"):
                setattr(Capture, name, lambda self, *a, **k: None)
            self.add_callback(Capture())

    cfg = tiny_config(tiny_model, tmp_path / "run", max_steps=2, save_every=2, credit="grpo",
                      self_distill="sdpo-token", self_distill_options={"teacher_update_rate": 0.25})
    train(cfg, trainer_cls=Rec, reward_funcs=[contains_digit])
    expected = {n: w.clone() for n, w in seen["start"].items()}
    for step in seen["steps"]:
        for n, w in expected.items():
            w.mul_(0.75).add_(step[n], alpha=0.25)
    assert len(seen["steps"]) == 2
    saved = torch.load(tmp_path / "run" / "checkpoint-2" / FILE, weights_only=True)
    assert set(saved) == set(expected)
    for n, w in expected.items():
        torch.testing.assert_close(saved[n], w)
        assert not torch.equal(saved[n], seen["steps"][-1][n])
    # resumed for a third step: the average goes on from the one step 2 saved
    cfg = tiny_config(tiny_model, tmp_path / "run", max_steps=3, save_every=3, credit="grpo",
                      self_distill="sdpo-token", self_distill_options={"teacher_update_rate": 0.25},
                      resume=True)
    train(cfg, trainer_cls=Rec, reward_funcs=[contains_digit])
    assert len(seen["steps"]) == 1
    third = torch.load(tmp_path / "run" / "checkpoint-3" / FILE, weights_only=True)
    for n, w in saved.items():
        torch.testing.assert_close(third[n], 0.75 * w + 0.25 * seen["steps"][0][n])
