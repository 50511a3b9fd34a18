"""Per-token scores of a group's responses under a model: log-probs and entropies
(:func:`score_groups`) and the input-gradient importance (:func:`importance_groups`)."""

from __future__ import annotations

from collections.abc import Callable

from ktae.core.entropy import categorical_entropy
from ktae.groups.input import GroupInput
from ktae.models.input_grad_importance import answer_tokens, group_importance, response_logits, skip_noise


def score_groups(model, tokenizer, groups: list[GroupInput], *, temperature: float = 1.0,
                 importance: bool = False, on_group: Callable[[str], None] | None = None,
                 reads_importance: Callable[[GroupInput], bool] | None = None,
                 references: dict | None = None) -> None:
    """Fill each group's per-token ``logprobs`` and ``entropies`` under ``model`` (the
    prompt tokenised as for generation and computed once per group, its responses
    continuing it right-padded, the LM head applied to the response positions only when
    the model takes ``logits_to_keep``); with ``importance`` also its
    ``input_grad_importance`` (:func:`importance_groups`), whose clean forward pass gives
    the log-probs and entropies too (a group that holds them already keeps them, and its
    clean pass computes the answer's logits only). ``reads_importance``: as
    :func:`importance_groups` takes it, and ``references``. ``on_group(phase)`` is called after each group
    whose importance is computed (``"importance"``), or scored (``"scores"``): progress."""
    import torch


    def fill(g: GroupInput, logits) -> None:
        logp = torch.log_softmax(logits.float() / temperature, dim=-1)
        T = logits.shape[1]
        ids = torch.tensor([list(r) + [0] * (T - len(r)) for r in g.responses],
                           device=logp.device)
        tok_logp = logp.gather(-1, ids[..., None]).squeeze(-1)
        entropy = categorical_entropy(logp)
        g.logprobs = [tok_logp[i, :len(r)].tolist() for i, r in enumerate(g.responses)]
        g.entropies = [entropy[i, :len(r)].tolist() for i, r in enumerate(g.responses)]

    if importance:
        importance_groups(model, tokenizer, groups, on_logits=fill,
                          on_group=None if on_group is None else lambda: on_group("importance"),
                          reads_importance=reads_importance, references=references)
        return
    pad = tokenizer.pad_token_id or 0
    for g in groups:
        fill(g, response_logits(model, tokenizer(g.prompt)["input_ids"],
                                [list(r) for r in g.responses], pad))
        if on_group is not None:
            on_group("scores")


def importance_groups(model, tokenizer, groups: list[GroupInput], *, seed: int = 0,
                      on_group: Callable[[], None] | None = None,
                      on_logits: Callable[[GroupInput, object], None] | None = None,
                      reads_importance: Callable[[GroupInput], bool] | None = None,
                      references: dict | None = None) -> None:
    """Fill each group's ``input_grad_importance`` under ``model``: each response followed
    by the concluding text and the group's reference answer, as the trainer does
    (:func:`ktae.models.input_grad_importance.group_importance`: the prompt computed once,
    one clean forward pass and one forward and backward pass per group, noise from a
    generator seeded with ``seed``); ``on_logits(group, logits)`` with the clean pass's
    ``[B, T, V]`` logits that predict the responses, for a group without ``logprobs``
    (else the clean pass projects the answer's positions only); ``on_group()`` after each
    group whose importance is computed.

    ``reads_importance(group)`` False: the group's credit does not read the importance
    (OAR-G's ``A * w_t`` where every base advantage ``A`` is 0); its importance is not
    computed and reads 0 on every token, and the noise generator is advanced by that
    group's draw, so every other group's importance is the same as with every group
    computed (its log-probs, when wanted, come from one plain forward pass). None: every
    group's is computed.

    ``references``: ``{id(group): [B, V] tensor}``, a group's clean answer summaries read
    from its sampling's cache (:func:`ktae.models.input_grad_importance.tail_reference`);
    such a group skips the clean forward pass (it must hold its log-probs already)."""
    import torch


    g_noise = torch.Generator().manual_seed(seed)
    pad = tokenizer.pad_token_id or 0
    for g in groups:
        try:
            conclusion, (answer,) = answer_tokens(tokenizer, [g.answer])
        except ValueError:
            raise ValueError(f"{g.label or 'a group'}: the input-gradient importance needs the "
                             "group's reference answer ('answer')") from None
        prompt = tokenizer(g.prompt)["input_ids"]
        if reads_importance is not None and not reads_importance(g):
            skip_noise(g_noise, len(prompt), [list(r) for r in g.responses],
                       len(conclusion) + len(answer), model.get_input_embeddings().weight)
            g.input_grad_importance = [[0.0] * len(r) for r in g.responses]
            if on_logits is not None and g.logprobs is None:  # its scores still wanted
                on_logits(g, response_logits(model, prompt, [list(r) for r in g.responses],
                                             pad))
            continue
        want = on_logits is not None and g.logprobs is None
        ref = None if references is None or want else references.get(id(g))
        out = group_importance(model, prompt, [list(r) for r in g.responses], answer, pad,
                               conclusion=conclusion, generator=g_noise, logits=want,
                               reference=ref)
        s, logits = out if want else (out, None)
        g.input_grad_importance = [s[i, :len(r)].tolist() for i, r in enumerate(g.responses)]
        if want:
            on_logits(g, logits)
        if on_group is not None:
            on_group()
