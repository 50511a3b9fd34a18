"""DelTA's token-gradient proxy on scored groups (``ktae explain --model``, ``ktae audit``).

The group provider of the need ``token_grad_proxy`` (:mod:`ktae.core.needs`): each group's
responses after its prompt (tokenised as for generation), one no-grad pass of the model
over them, ``(1 - p) h`` of each response token
(:func:`ktae.core.delta_credit.token_grad_proxy`), as the trainer computes it on its
rollout batch (:func:`ktae.models.token_grad_proxy.response_token_grad_proxy`). A group's
responses share their prompt, so the pass computes the prompt once
(:func:`ktae.models.input_grad_importance.response_logits`) and the output head on the
response positions only, where the rollout batch's pass computes each row's prompt and
the head on every position.
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

    from ktae.core.delta_credit import token_grad_proxy
    from ktae.core.policy_loss import check_number
    from ktae.models.input_grad_importance import prompt_cache
    from ktae.models.token_grad_proxy import ROWS_PER_PASS

    temperature = check_number(temperature, "temperature", low=0, low_open=True)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    for g in groups:
        prompt = tokenizer(g.prompt)["input_ids"]
        cache = prompt_cache(model, prompt)
        g.token_grad_proxy = []
        for start in range(0, len(g.responses), ROWS_PER_PASS):
            chunk = [list(r) for r in g.responses[start:start + ROWS_PER_PASS]]
            h, logits = _head_inputs(model, prompt, chunk, pad, cache)
            T = logits.shape[1]
            ids = torch.tensor([r + [0] * (T - len(r)) for r in chunk], device=logits.device)
            mask = torch.arange(T, device=ids.device)[None] < torch.tensor(
                [len(r) for r in chunk], device=ids.device)[:, None]
            logp = torch.log_softmax(logits.float() / temperature, dim=-1)
            tok = logp.gather(-1, ids[..., None]).squeeze(-1)
            out = token_grad_proxy(h.float(), tok, mask).cpu()
            g.token_grad_proxy += [out[i, :len(r)].clone() for i, r in enumerate(chunk)]
        if on_group is not None:
            on_group("scores")


def _head_inputs(model, prompt: list[int], responses: list[list[int]], pad_id: int, cache):
    """``([B, T, H] head inputs, [B, T, V] logits)`` at the positions that predict each
    response token after ``prompt`` (no gradient; ``cache``: the prompt's
    :func:`ktae.models.input_grad_importance.prompt_cache`): the head's input ``h`` read
    by a forward pre-hook on the output head, as DelTA's authors read it."""
    from ktae.models.input_grad_importance import response_logits

    head = model.get_output_embeddings()
    if head is None:
        raise ValueError("model: expected a causal LM with an output head "
                         "(get_output_embeddings() is None)")
    captured = []
    hook = head.register_forward_pre_hook(lambda _m, args: captured.append(args[0].detach()))
    try:
        logits = response_logits(model, prompt, responses, pad_id, cache=cache)
    finally:
        hook.remove()
    if len(captured) != 1:
        raise ValueError(f"model: its output head ran {len(captured)} times in one pass, "
                         "expected once")
    h = captured[0]
    if h.shape[:2] != logits.shape[:2]:
        h = h[:, :logits.shape[1]]
    return h, logits
