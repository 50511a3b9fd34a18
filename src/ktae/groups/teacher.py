"""The self-teacher pass on scored groups (``ktae explain --model``, ``ktae audit``).

The group provider of the need ``teacher_logprobs`` (:mod:`ktae.core.needs`): each
group's responses scored after their privileged context as the trainer scores them
(:func:`ktae.models.self_teacher.teacher_logprobs`: the same choice of teacher, the same
context, the prompt tokenised as for generation). A response is right where the group
says so (``correct``, else ``reward > 0``); ``teacher_source="reference"`` reads the
group's reference ``answer``.

The responses of a group that share a teacher share their whole privileged context (with
``teacher_choice="first"`` every response but the first right one), so each distinct
context is computed once, its responses continuing its key/value cache
(:func:`ktae.models.input_grad_importance.response_logits`), where the rollout batch's
pass computes every row's context and the output head on every position.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from ktae.groups.input import GroupInput

TEACHER_OPTIONS = {"teacher_choice": "choose", "teacher_source": "source",
                   "teacher_template": "template", "teacher_seed": "seed"}
"""The method options of the pass -> the keywords of the pass."""


def teacher_groups(model, tokenizer, groups: list[GroupInput], *, temperature: float = 1.0,
                   teacher_options: Mapping | None = None,
                   on_group: Callable[[str], None] | None = None) -> None:
    """Set each group's ``teacher_logprobs`` (and its ``logprobs``, the own-context pass,
    where the group lacks them) under ``model``. ``teacher_options``: the method's
    ``teacher_*`` options (defaults: :mod:`ktae.core.self_distill`). A response without a
    teacher gets its own-context log-probs, as the trainer's pass gives it."""
    import torch

    from ktae.core.policy_loss import check_number
    from ktae.groups.scoring import score_groups
    from ktae.models.self_teacher import check_teacher_options

    kw = {TEACHER_OPTIONS[k]: v for k, v in (teacher_options or {}).items()
          if k in TEACHER_OPTIONS}
    check_teacher_options(**kw)
    temperature = check_number(temperature, "temperature", low=0, low_open=True)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    for g in groups:
        if g.logprobs is None:
            score_groups(model, tokenizer, [g], temperature=temperature)
        responses = [list(r) for r in g.responses]
        contexts = privileged_contexts(tokenizer, g, **kw)
        # the student's log-probs as float32, as the trainer's pass holds them
        out = [torch.tensor(lp[:len(r)], dtype=torch.float32).tolist()
               for lp, r in zip(g.logprobs, responses, strict=True)]
        for context, rows in _rows_by_context(contexts).items():
            scored = context_response_logprobs(model, list(context),
                                               [responses[i] for i in rows], pad,
                                               temperature=temperature)
            for i, values in zip(rows, scored, strict=True):
                out[i] = values
        g.teacher_logprobs = out
        if on_group is not None:
            on_group("scores")


def privileged_contexts(tokenizer, group: GroupInput, *, choose: str = "first",
                        source: str = "group", template: str | None = None,
                        seed: int = 0) -> list[list[int] | None]:
    """Each response's privileged context (token ids: the prompt, the template's text
    before the solution, the solution, the text after it), None where no teacher; built
    by :func:`ktae.models.self_teacher.teacher_contexts`, as the trainer's pass builds them."""
    import torch

    from ktae.core.self_distill import SDPO_TEMPLATE
    from ktae.models.self_teacher import teacher_contexts

    responses = [list(r) for r in group.responses]
    B, T = len(responses), max(1, max(len(r) for r in responses))
    ids = torch.tensor([r + [0] * (T - len(r)) for r in responses], dtype=torch.long)
    mask = torch.arange(T)[None] < torch.tensor([len(r) for r in responses])[:, None]
    correct = (torch.tensor(group.correct) if group.correct is not None
               else torch.tensor(group.rewards) > 0)
    answer = group.answer
    prompt = torch.tensor(tokenizer(group.prompt)["input_ids"])[None].repeat(B, 1)
    return teacher_contexts(tokenizer, prompt, torch.ones_like(prompt), ids, mask,
                            correct=correct, group=torch.zeros(B, dtype=torch.long),
                            references=[None if answer is None else str(answer)] * B,
                            choose=choose, source=source,
                            template=SDPO_TEMPLATE if template is None else template, seed=seed)


def _rows_by_context(contexts: list[list[int] | None]) -> dict[tuple, list[int]]:
    """``{context: the rows it teaches}``, in the order of each context's first row; the
    rows without a teacher left out."""
    out: dict[tuple, list[int]] = {}
    for i, context in enumerate(contexts):
        if context is not None:
            out.setdefault(tuple(context), []).append(i)
    return out


ROWS_PER_PASS = 8
"""Responses per forward pass (memory: each pass holds its rows' ``[T, V]`` logits)."""


def context_response_logprobs(model, context: list[int], responses: list[list[int]],
                              pad_id: int, *, temperature: float = 1.0,
                              rows_per_pass: int = ROWS_PER_PASS) -> list[list[float]]:
    """Each response's per-token log-probs at ``temperature`` after the one shared
    ``context`` (no gradient): the context computed once, its key/value cache continued by
    ``rows_per_pass`` responses at a time, the output head on the response positions only."""
    import torch

    from ktae.models.input_grad_importance import prompt_cache, response_logits

    cache = prompt_cache(model, context)
    out = []
    for start in range(0, len(responses), rows_per_pass):
        chunk = responses[start:start + rows_per_pass]
        logits = response_logits(model, context, chunk, pad_id, cache=cache)
        T = logits.shape[1]
        ids = torch.tensor([r + [0] * (T - len(r)) for r in chunk], device=logits.device)
        logp = torch.log_softmax(logits.float() / temperature, dim=-1)
        tok = logp.gather(-1, ids[..., None]).squeeze(-1)
        out += [tok[i, :len(r)].tolist() for i, r in enumerate(chunk)]
    return out
