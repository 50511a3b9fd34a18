"""The model passes of the audit's group providers (:mod:`ktae.groups`): the token-gradient
proxy and the self-teacher pass compute what the trainer's rollout-batch passes compute,
with a group's shared prompt (or a shared privileged context) computed once and the
output head on the response positions only. Counted on a tiny float64 Llama, where the
trainer's pass is the reference to float rounding."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from test_oar_g import tiny_llama  # noqa: E402
from test_self_teacher import Tok  # noqa: E402

from ktae.groups.input import GroupInput  # noqa: E402


class Counter:
    """Positions (rows x tokens) through the first decoder layer and the output head."""

    def __init__(self, model):
        self.layer, self.head = 0, 0
        self.hooks = [
            model.model.layers[0].register_forward_pre_hook(self._on_layer, with_kwargs=True),
            model.get_output_embeddings().register_forward_pre_hook(self._on_head)]

    def _on_layer(self, _module, args, kwargs):
        x = args[0] if args else kwargs["hidden_states"]
        self.layer += x.shape[0] * x.shape[1]

    def _on_head(self, _module, args):
        self.head += args[0].shape[0] * args[0].shape[1]

    def remove(self):
        for h in self.hooks:
            h.remove()


def padded(responses):
    T = max(len(r) for r in responses)
    ids = torch.tensor([r + [0] * (T - len(r)) for r in responses])
    mask = (torch.arange(T)[None] < torch.tensor([len(r) for r in responses])[:, None]).long()
    return ids, mask


def test_grad_proxy_computes_the_prompt_once_and_the_head_on_response_positions():
    from ktae.groups.grad_proxy import grad_proxy_groups
    from ktae.models.token_grad_proxy import ROWS_PER_PASS, response_token_grad_proxy

    model = tiny_llama()
    # 10 responses: two passes of ROWS_PER_PASS and 2 rows, one prompt cache for both
    responses = [[5 + i % 7, 6, 7, 1][:2 + i % 3] for i in range(10)]
    g = GroupInput(prompt="abcdefg", responses=responses, rewards=[1.0, 0.0] * 5)
    count = Counter(model)
    grad_proxy_groups(model, Tok(), [g], temperature=0.8)
    count.remove()
    P = len(Tok()("abcdefg")["input_ids"])
    chunks = [responses[:ROWS_PER_PASS], responses[ROWS_PER_PASS:]]
    T = [max(map(len, c)) for c in chunks]
    # the prompt once (its cache, the head on its last position), then each chunk's rows
    # from the prompt's last token on, the head on the positions that predict a response
    assert count.layer == (P - 1) + sum(len(c) * (1 + t) for c, t in zip(chunks, T, strict=True))
    assert count.head == 1 + sum(len(c) * t for c, t in zip(chunks, T, strict=True))
    ids, mask = padded(responses)
    prompt = torch.tensor([Tok()("abcdefg")["input_ids"]] * len(responses))
    expected = response_token_grad_proxy(model, prompt, torch.ones_like(prompt), ids, mask,
                                         temperature=0.8)
    for i, r in enumerate(responses):
        torch.testing.assert_close(g.token_grad_proxy[i], expected[i, :len(r)])


@pytest.mark.parametrize(("correct", "options", "contexts"), [
    ([False, True, False, False], {}, 1),  # every row but the right one: its context
    ([True, False, True, False], {}, 2),  # row 0 taught by row 2, the others by row 0
    ([True, False, True, False], {"teacher_choice": "shortest"}, 2),
    ([False, False, True, False], {"teacher_source": "reference"}, 1),
], ids=["one-right", "two-right", "shortest", "reference"])
def test_teacher_pass_computes_each_shared_context_once(correct, options, contexts):
    from ktae.groups.teacher import TEACHER_OPTIONS, privileged_contexts, teacher_groups
    from ktae.models.self_teacher import teacher_logprobs

    model = tiny_llama()
    responses = [[5, 6, 7, 1], [8, 9, 1], [10, 11, 12, 13, 1], [14, 15, 1]]
    student = [[-0.5 - 0.1 * j for j in range(len(r))] for r in responses]
    g = GroupInput(prompt="abcde", responses=responses, rewards=[float(c) for c in correct],
                   correct=correct, answer="8", logprobs=student)
    count = Counter(model)
    teacher_groups(model, Tok(), [g], temperature=0.7, teacher_options=options)
    count.remove()
    kw = {TEACHER_OPTIONS[k]: v for k, v in options.items()}  # the pass's keywords
    built = privileged_contexts(Tok(), g, **kw)
    distinct = {tuple(c): [i for i, x in enumerate(built) if x == c]
                for c in built if c is not None}
    assert len(distinct) == contexts
    expected_layer = sum(len(c) - 1 + len(rows) * (1 + max(len(responses[i]) for i in rows))
                         for c, rows in distinct.items())
    assert count.layer == expected_layer  # each context once; its rows continue it
    ids, mask = padded(responses)
    prompt = torch.tensor([Tok()("abcde")["input_ids"]] * 4)
    # the trainer's pass over the same rows: every row its whole context, the head on
    # every position
    want, has = teacher_logprobs(model, Tok(), prompt, torch.ones_like(prompt), ids, mask,
                                 correct=torch.tensor(correct), group=torch.zeros(4).long(),
                                 student_logprobs=torch.tensor(
                                     [s + [0.0] * (5 - len(s)) for s in student]),
                                 references=["8"] * 4, temperature=0.7, **kw)
    assert [c is not None for c in built] == has.tolist()
    for i, r in enumerate(responses):
        torch.testing.assert_close(torch.tensor(g.teacher_logprobs[i]), want[i, :len(r)])
