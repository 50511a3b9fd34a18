"""The self-teacher pass: the policy's log-probs of each response in a privileged context.

The need ``teacher_logprobs`` of SDPO and SDPG (docs/method.md §17). For each response
``y`` of a group the policy scores ``y`` twice: in its own context (prompt, then ``y``:
the need ``logprobs``) and in a privileged one::

    prompt + before + s + after + y          (template = before + "{solution}" + after)

where ``s`` is a verified right response of the same group, never ``y`` itself (SDPO's
``dont_reprompt_on_self_success``), or the row's reference solution (``source =
"reference"``, SDPG's privileged context). The template's default is SDPO's
``solution_template`` inside its ``reprompt_template`` (``lasgroup/SDPO``,
``verl/trainer/config/actor/actor.yaml``). Which right response teaches (``choose``):

* ``"first"``: the first right response of the group other than ``y`` (SDPO's
  ``_get_solution``: ``solution_idxs[0]``);
* ``"random"``: one drawn uniformly from the others, from a generator seeded with
  ``seed`` and the group's index;
* ``"shortest"``: the one with the fewest tokens (ties: the first).

A response without a teacher (its group has no right response but itself, or a row has no
reference solution) gets its own-context log-probs as the teacher's, so that every signal
of the teacher (SDPO's ``teacher - student``, SDPG's KL) is 0 there, as the authors'
``self_distillation_mask`` removes such rows; :func:`teacher_rows` tells which rows have
one.

The privileged text is tokenised around the solution's token ids (``before`` and
``after`` each tokenised alone, the solution inserted as the ids that were generated,
its end-of-sequence and padding tokens dropped) and placed after the prompt's tokens as the
policy saw them (after a chat template's generation prompt). No gradient flows through
the pass; under LoRA the teacher is the same adapted model.
"""

from __future__ import annotations

import torch

from ktae.core.policy_loss import check_number
from ktae.core.self_distill import SDPO_TEMPLATE
from ktae.core.self_distill import check_teacher_options as check

ROWS_PER_PASS = 8
"""Rows per forward pass of the teacher (memory: each pass holds its rows' logits)."""


def check_teacher_options(*, choose: str = "first", source: str = "group",
                          template: str = SDPO_TEMPLATE, seed: int = 0) -> None:
    """One-line ``ValueError`` naming a bad option of the pass (by its method option name)."""
    check(teacher_choice=choose, teacher_source=source, teacher_template=template,
          teacher_seed=seed)


def choose_teachers(correct: torch.Tensor, group: torch.Tensor, lengths: torch.Tensor, *,
                    choose: str = "first", seed: int = 0) -> torch.Tensor:
    """``[B]`` int64: the row whose response teaches each row, -1 where none does (no other
    right response in its group). ``correct``: ``[B]`` bool; ``group``: ``[B]`` group ids;
    ``lengths``: ``[B]`` response lengths (``"shortest"``)."""
    check_teacher_options(choose=choose, seed=seed)
    correct = torch.as_tensor(correct).bool().cpu()
    group = torch.as_tensor(group).cpu()
    lengths = torch.as_tensor(lengths).cpu()
    out = torch.full((len(correct),), -1, dtype=torch.long)
    for k, g in enumerate(torch.unique(group, sorted=True).tolist()):
        rows = (group == g).nonzero().flatten().tolist()
        right = [j for j in rows if correct[j]]
        gen = torch.Generator().manual_seed(seed * 1_000_003 + k)
        for i in rows:
            others = [j for j in right if j != i]
            if not others:
                continue
            if choose == "first":
                out[i] = others[0]
            elif choose == "shortest":
                out[i] = min(others, key=lambda j: (int(lengths[j]), others.index(j)))
            else:
                out[i] = others[int(torch.randint(len(others), (1,), generator=gen))]
    return out


def privileged_prompts(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                       solutions: list[list[int] | None], before: list[int],
                       after: list[int]) -> list[list[int] | None]:
    """Each row's privileged prompt tokens: its real prompt tokens, ``before``, the
    solution, ``after``; None where the solution is None."""
    out: list[list[int] | None] = []
    for i, sol in enumerate(solutions):
        if sol is None:
            out.append(None)
            continue
        prompt = prompt_ids[i][prompt_mask[i].bool()].tolist()
        out.append(prompt + list(before) + list(sol) + list(after))
    return out


@torch.no_grad()
def context_logprobs(model, contexts: list[list[int]], completion_ids: torch.Tensor,
                     completion_mask: torch.Tensor, *, pad_id: int, temperature: float = 1.0,
                     rows_per_pass: int = ROWS_PER_PASS) -> torch.Tensor:
    """``[b, T]`` log-probs of each row's response tokens after ``contexts[i]`` (each left
    padded to a common length, positions counted from the first real token), 0 on padding.
    No gradient; ``rows_per_pass`` rows at a time."""
    b, T = completion_ids.shape
    out = torch.zeros(b, T, dtype=torch.float32, device=completion_ids.device)
    device = next(model.parameters()).device
    for start in range(0, b, rows_per_pass):
        rows = range(start, min(start + rows_per_pass, b))
        P = max(len(contexts[i]) for i in rows)
        ids = torch.full((len(rows), P + T), pad_id, dtype=torch.long)
        attn = torch.zeros(len(rows), P + T, dtype=torch.long)
        for r, i in enumerate(rows):
            ctx = contexts[i]
            ids[r, P - len(ctx):P] = torch.tensor(ctx, dtype=torch.long)
            attn[r, P - len(ctx):P] = 1
            ids[r, P:] = completion_ids[i].cpu()
            attn[r, P:] = completion_mask[i].cpu().long()
        pos = (attn.cumsum(dim=1) - 1).clamp_min(0)
        logits = model(input_ids=ids.to(device), attention_mask=attn.to(device),
                       position_ids=pos.to(device)).logits[:, P - 1:P + T - 1].float()
        logp = torch.log_softmax(logits / temperature, dim=-1)
        tok = logp.gather(-1, ids[:, P:].to(device)[..., None]).squeeze(-1)
        m = completion_mask[start:start + len(rows)].bool().to(device)
        out[start:start + len(rows)] = torch.where(m, tok, 0).to(out.device)
    return out


def solution_tokens(completion_ids: torch.Tensor, completion_mask: torch.Tensor, row: int,
                    drop: set[int]) -> list[int]:
    """Row ``row``'s real response tokens, its trailing end-of-sequence/padding ids dropped."""
    ids = completion_ids[row][completion_mask[row].bool()].tolist()
    while ids and ids[-1] in drop:
        ids.pop()
    return ids


def teacher_contexts(tokenizer, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                     completion_ids: torch.Tensor, completion_mask: torch.Tensor, *,
                     correct: torch.Tensor | None, group: torch.Tensor | None,
                     references: list | None, choose: str, source: str, template: str,
                     seed: int) -> list[list[int] | None]:
    """Each row's privileged context (token ids: its prompt, the template's text before the
    solution, the solution, the text after it), or None where the row has no teacher: the
    contexts of :func:`teacher_logprobs`, whose arguments these are (validated there)."""
    before_text, _, after_text = template.partition("{solution}")
    enc = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"] if text else []  # noqa: E731
    if source == "group":
        teachers = choose_teachers(correct, group, completion_mask.sum(dim=1), choose=choose,
                                   seed=seed)
        drop = {i for i in (tokenizer.eos_token_id, tokenizer.pad_token_id) if i is not None}
        solutions = [None if j < 0 else solution_tokens(completion_ids, completion_mask, j, drop)
                     for j in teachers.tolist()]
    else:
        solutions = [None if r is None or r == "" else enc(str(r)) for r in references]
    return privileged_prompts(prompt_ids, prompt_mask, solutions, enc(before_text),
                              enc(after_text))


def teacher_logprobs(model, tokenizer, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                     completion_ids: torch.Tensor, completion_mask: torch.Tensor, *,
                     correct: torch.Tensor | None, group: torch.Tensor | None,
                     student_logprobs: torch.Tensor, references: list | None = None,
                     choose: str = "first", source: str = "group",
                     template: str = SDPO_TEMPLATE, seed: int = 0, temperature: float = 1.0,
                     rows_per_pass: int = ROWS_PER_PASS) -> tuple[torch.Tensor, torch.Tensor]:
    """``([b, T] teacher log-probs, [b] bool has_teacher)``: the module docstring's pass.

    ``student_logprobs`` (``[b, T]``, the own-context log-probs) fill the rows without a
    teacher. ``source="group"`` needs ``correct`` and ``group`` (``[b]``); ``"reference"``
    needs ``references`` (one text or None per row)."""
    check_teacher_options(choose=choose, source=source, template=template, seed=seed)
    temperature = check_number(temperature, "temperature", low=0, low_open=True)
    b = completion_ids.shape[0]
    if source == "group" and (correct is None or group is None):
        raise ValueError("teacher_source='group': needs each response's verdict and group")
    if source != "group" and (references is None or len(references) != b):
        raise ValueError(f"teacher_source='reference': needs one reference solution per row "
                         f"(dataset column 'solution'), got {references!r:.80}")
    contexts = teacher_contexts(tokenizer, prompt_ids, prompt_mask, completion_ids,
                                completion_mask, correct=correct, group=group,
                                references=references, choose=choose, source=source,
                                template=template, seed=seed)
    has = torch.tensor([c is not None for c in contexts], dtype=torch.bool)
    out = student_logprobs.detach().to(torch.float32).clone()
    idx = has.nonzero().flatten().tolist()
    if idx:
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        got = context_logprobs(model, [contexts[i] for i in idx], completion_ids[idx],
                               completion_mask[idx], pad_id=pad, temperature=temperature,
                               rows_per_pass=rows_per_pass)
        out[idx] = got.to(out.device)
    return out, has
