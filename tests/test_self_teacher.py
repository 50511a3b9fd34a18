"""The self-teacher pass (docs/method.md §17): each response's log-probs after a privileged
context equal a plain forward pass over the concatenated context, row by row; the choice
of the teaching response; a group with no right response; the options and errors."""

from __future__ import annotations

import pytest
import torch
from oracle import single_thread  # noqa: F401  (one torch thread for this module)
from test_oar_g import tiny_llama

from ktae.core.needs import NEEDS, ModelResponses
from ktae.models.need_providers import teacher_logprobs as provider
from ktae.models.self_teacher import choose_teachers, solution_tokens, teacher_logprobs

PAD, EOS = 0, 1


class Tok:
    """Characters to ids 3..22 (the tiny model's vocabulary is 23)."""

    pad_token_id, eos_token_id = PAD, EOS

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [3 + ord(c) % 20 for c in text]}


def layout():
    """Two groups of three: prompts left-padded to 5, responses right-padded to 6 (EOS-ended),
    group 0 with rows 0 and 2 right, group 1 with none."""
    g = torch.Generator().manual_seed(3)
    prompt = torch.randint(3, 23, (6, 5), generator=g)
    pmask = torch.ones(6, 5, dtype=torch.long)
    pmask[3:, :2] = 0  # group 1's prompt is shorter (left padding)
    prompt[3:, :2] = PAD
    prompt[3:] = prompt[3]
    prompt[:3] = prompt[0]
    resp = torch.randint(3, 23, (6, 6), generator=g)
    rmask = torch.ones(6, 6, dtype=torch.long)
    for i, n in enumerate([6, 4, 3, 5, 2, 6]):
        rmask[i, n:] = 0
        resp[i, n:] = PAD
        resp[i, n - 1] = EOS
    correct = torch.tensor([True, False, True, False, False, False])
    group = torch.tensor([0, 0, 0, 1, 1, 1])
    return prompt, pmask, resp, rmask, correct, group


def plain_logprobs(model, context: list[int], response: list[int]) -> torch.Tensor:
    """One unpadded row: the log-probs of ``response`` after ``context``."""
    ids = torch.tensor([context + response])
    logits = model(input_ids=ids).logits[0, len(context) - 1:-1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(response)[:, None]).squeeze(-1)


def student(model, prompt, pmask, resp, rmask):
    out = torch.zeros(resp.shape)
    for i in range(len(resp)):
        n = int(rmask[i].sum())
        out[i, :n] = plain_logprobs(model, prompt[i][pmask[i].bool()].tolist(), resp[i, :n].tolist())
    return out


TEMPLATE = "ab{solution}cd"


@pytest.mark.parametrize("rows_per_pass", [1, 8])
def test_teacher_equals_a_plain_pass_over_the_privileged_context(rows_per_pass):
    model = tiny_llama()
    prompt, pmask, resp, rmask, correct, group = layout()
    stud = student(model, prompt, pmask, resp, rmask)
    got, has = teacher_logprobs(model, Tok(), prompt, pmask, resp, rmask, correct=correct,
                                group=group, student_logprobs=stud, template=TEMPLATE,
                                rows_per_pass=rows_per_pass)
    # row 0 is taught by row 2, rows 1 and 2 by row 0 (never by themselves); group 1: none
    assert has.tolist() == [True, True, True, False, False, False]
    before, after = Tok()("ab")["input_ids"], Tok()("cd")["input_ids"]
    for i, j in [(0, 2), (1, 0), (2, 0)]:
        sol = resp[j][rmask[j].bool()].tolist()[:-1]  # its EOS dropped
        ctx = prompt[i][pmask[i].bool()].tolist() + before + sol + after
        n = int(rmask[i].sum())
        expected = plain_logprobs(model, ctx, resp[i, :n].tolist())
        torch.testing.assert_close(got[i, :n], expected, rtol=1e-5, atol=1e-6)
        assert (got[i, n:] == 0).all()
        assert not torch.allclose(got[i, :n], stud[i, :n])  # the context changed them
    assert torch.equal(got[3:], stud[3:])  # no right response: the student's own


def test_a_group_with_no_right_response_gets_no_teacher_signal():
    model = tiny_llama()
    prompt, pmask, resp, rmask, _, group = layout()
    stud = student(model, prompt, pmask, resp, rmask)
    got, has = teacher_logprobs(model, Tok(), prompt, pmask, resp, rmask,
                                correct=torch.zeros(6, dtype=torch.bool), group=group,
                                student_logprobs=stud)
    assert not has.any() and torch.equal(got, stud)
    # one right response in a group: it has no teacher (never itself), the others do
    one = torch.tensor([False, True, False, False, False, False])
    _, has = teacher_logprobs(model, Tok(), prompt, pmask, resp, rmask, correct=one,
                              group=group, student_logprobs=stud)
    assert has.tolist() == [True, False, True, False, False, False]


def test_choice_of_the_teaching_response():
    correct = torch.tensor([True, True, False, True, False, True, True])
    group = torch.tensor([0, 0, 0, 0, 1, 1, 1])
    lengths = torch.tensor([5, 3, 2, 3, 4, 4, 1])
    assert choose_teachers(correct, group, lengths).tolist() == [1, 0, 0, 0, 5, 6, 5]
    assert choose_teachers(correct, group, lengths, choose="shortest").tolist() == \
        [1, 3, 1, 1, 6, 6, 5]
    draws = {tuple(choose_teachers(correct, group, lengths, choose="random", seed=s).tolist())
             for s in range(12)}
    assert len(draws) > 1  # the seed changes the draw
    for d in draws:
        assert d[0] in (1, 3) and d[2] in (0, 1, 3) and d[1] in (0, 3) and d[4] in (5, 6)
        assert all(d[i] != i for i in range(7))
    same = choose_teachers(correct, group, lengths, choose="random", seed=4)
    assert torch.equal(same, choose_teachers(correct, group, lengths, choose="random", seed=4))


def test_reference_source_and_the_provider_reads_the_method_options():
    model = tiny_llama()
    prompt, pmask, resp, rmask, correct, group = layout()
    stud = student(model, prompt, pmask, resp, rmask)
    rows = [{"solution": "xyz"}] * 3 + [{"solution": None}] * 3
    responses = ModelResponses(
        model=model, tokenizer=Tok(), prompt_ids=prompt, prompt_mask=pmask,
        completion_ids=resp, completion_mask=rmask, rows=rows, correct=correct, group=group,
        policy_pass=lambda: (stud, torch.zeros_like(stud)),
        options={"teacher_source": "reference", "teacher_template": "[{solution}]"})
    got = provider(responses)
    ctx = prompt[0][pmask[0].bool()].tolist() + Tok()("[xyz]")["input_ids"]
    n = int(rmask[1].sum())
    torch.testing.assert_close(got[1, :n], plain_logprobs(model, ctx, resp[1, :n].tolist()),
                               rtol=1e-5, atol=1e-6)
    assert torch.equal(got[3:], stud[3:])
    responses.options = {"teacher_choice": "shortest"}
    by_group = provider(responses)
    assert not torch.allclose(by_group[:3], got[:3])
    assert NEEDS["teacher_logprobs"].provider.endswith("need_providers:teacher_logprobs")


def test_solution_tokens_drop_the_end_of_sequence():
    ids = torch.tensor([[5, 6, EOS, PAD]])
    assert solution_tokens(ids, torch.tensor([[1, 1, 1, 0]]), 0, {EOS, PAD}) == [5, 6]


@pytest.mark.parametrize("kw,match", [
    ({"choose": "best"}, "teacher_choice: expected one of first, random, shortest"),
    ({"source": "data"}, "teacher_source: expected one of group, reference"),
    ({"template": "no slot"}, "teacher_template: expected a text holding"),
    ({"seed": 1.5}, "teacher_seed: expected an integer"),
    ({"source": "reference"}, "teacher_source='reference': needs one reference solution"),
])
def test_one_line_errors(kw, match):
    prompt, pmask, resp, rmask, correct, group = layout()
    with pytest.raises(ValueError, match=match) as err:
        teacher_logprobs(None, Tok(), prompt, pmask, resp, rmask, correct=correct, group=group,
                         student_logprobs=torch.zeros(resp.shape), **kw)
    assert "\n" not in str(err.value)


def test_under_lora_the_teacher_is_the_adapted_model_without_gradient():
    peft = pytest.importorskip("peft")
    model = tiny_llama()
    cfg = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                          init_lora_weights=False)  # random B: the adapters change the output
    adapted = peft.get_peft_model(model, cfg).double()
    prompt, pmask, resp, rmask, correct, group = layout()
    stud = student(adapted, prompt, pmask, resp, rmask)
    got, has = teacher_logprobs(adapted, Tok(), prompt, pmask, resp, rmask, correct=correct,
                                group=group, student_logprobs=stud, template=TEMPLATE)
    assert not got.requires_grad
    assert all(p.grad is None for p in adapted.parameters())
    ctx = prompt[1][pmask[1].bool()].tolist() + Tok()("ab")["input_ids"] \
        + resp[0][rmask[0].bool()].tolist()[:-1] + Tok()("cd")["input_ids"]
    n = int(rmask[1].sum())
    expected = plain_logprobs(adapted, ctx, resp[1, :n].tolist())
    torch.testing.assert_close(got[1, :n], expected.detach(), rtol=1e-5, atol=1e-6)
    with adapted.disable_adapter():
        base = plain_logprobs(adapted, ctx, resp[1, :n].tolist())
    assert not torch.allclose(base, expected)  # the adapters took part
