"""DelTA's token-gradient proxy on scored groups (``ktae explain --model``, ``ktae audit``).

The group provider of the need ``token_grad_proxy`` (:mod:`ktae.core.needs`): each group's
responses after its prompt (tokenised as for generation), one no-grad pass of the model
over them (:func:`ktae.models.token_grad_proxy.response_token_grad_proxy`), as the trainer
computes it on its rollout batch.
"""

from __future__ import annotations

from collections.abc import Callable

from ktae.groups.input import GroupInput


def grad_proxy_groups(model, tokenizer, groups: list[GroupInput], *, temperature: float = 1.0,
                      on_group: Callable[[str], None] | None = None) -> None:
    """Set each group's ``token_grad_proxy``: per response a ``[len, H]`` float32 tensor of
    ``(1 - p) h`` under ``model`` at ``temperature``; ``on_group("scores")`` after each
    group (progress)."""
    import torch

    from ktae.models.token_grad_proxy import response_token_grad_proxy

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    for g in groups:
        B, T = len(g.responses), max(len(r) for r in g.responses)
        prompt = torch.tensor(tokenizer(g.prompt)["input_ids"])[None].repeat(B, 1)
        ids = torch.full((B, T), pad, dtype=torch.long)
        mask = torch.zeros(B, T, dtype=torch.long)
        for i, r in enumerate(g.responses):
            ids[i, :len(r)] = torch.tensor(r, dtype=torch.long)
            mask[i, :len(r)] = 1
        out = response_token_grad_proxy(model, prompt, torch.ones_like(prompt), ids, mask,
                                        temperature=temperature)
        g.token_grad_proxy = [out[i, :len(r)].clone() for i, r in enumerate(g.responses)]
        if on_group is not None:
            on_group("scores")
