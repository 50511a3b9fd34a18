"""The self-teacher pass on scored groups (``ktae explain --model``, ``ktae audit``).

The group provider of the need ``teacher_logprobs`` (:mod:`ktae.core.needs`): each
group's responses scored after their privileged context as the trainer scores them
(:func:`ktae.models.self_teacher.teacher_logprobs`), the prompt tokenised as for
generation. A response is right where the group says so (``correct``, else ``reward >
0``); ``teacher_source="reference"`` reads the group's reference ``answer``.
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
    ``teacher_*`` options (defaults: :mod:`ktae.core.self_distill`)."""
    import torch

    from ktae.groups.scoring import score_groups
    from ktae.models.self_teacher import teacher_logprobs

    kw = {TEACHER_OPTIONS[k]: v for k, v in (teacher_options or {}).items()
          if k in TEACHER_OPTIONS}
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    for g in groups:
        if g.logprobs is None:
            score_groups(model, tokenizer, [g], temperature=temperature)
        B, T = len(g.responses), max(len(r) for r in g.responses)
        prompt = torch.tensor(tokenizer(g.prompt)["input_ids"])[None].repeat(B, 1)
        ids = torch.full((B, T), pad, dtype=torch.long)
        mask = torch.zeros(B, T, dtype=torch.long)
        student = torch.zeros(B, T)
        for i, r in enumerate(g.responses):
            ids[i, :len(r)] = torch.tensor(r, dtype=torch.long)
            mask[i, :len(r)] = 1
            student[i, :len(r)] = torch.tensor(g.logprobs[i][:len(r)], dtype=torch.float32)
        correct = (torch.tensor(g.correct) if g.correct is not None
                   else torch.tensor(g.rewards) > 0)
        out, _ = teacher_logprobs(model, tokenizer, prompt, torch.ones_like(prompt), ids, mask,
                                  correct=correct, group=torch.zeros(B, dtype=torch.long),
                                  student_logprobs=student, references=[g.answer] * B,
                                  temperature=temperature, **kw)
        g.teacher_logprobs = [out[i, :len(r)].tolist() for i, r in enumerate(g.responses)]
        if on_group is not None:
            on_group("scores")
