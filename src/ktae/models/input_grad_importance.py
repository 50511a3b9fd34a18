"""Input-gradient importance: how much each response token's embedding moves the answer.

The need ``input_grad_importance`` of an advantage estimator (``oar-g``,
:mod:`ktae.core.oar`; or a user rule declaring it): per response token, the sensitivity
of the model's answer distribution to that token's input embedding, by one extra
no-grad forward pass and one forward and backward pass through the model. It follows
``calculate_token_importance_gradient`` of the OAR authors' released code
(github.com/Valsure/Outcome-Grounded-Advantage-Reshaping, commit 8dbc478,
``OAR-main.py``), batched here: rows are independent, so the gradient of the summed
objective with respect to a row's embeddings is that row's own.

Layout: each row holds the prompt, the response, then a short concluding text and the
reference answer (:func:`append_answer`; the code's ``before + reasoning + conclude +
answer``). With ``e`` the token embeddings, ``xi`` Gaussian noise of standard deviation
``noise_std`` on the response positions only, and ``q(x)`` the answer summary under
embeddings ``x``::

    answer_mean  (default)  q = softmax(mean of the logits that predict the answer tokens)
                            J = KL(q(e) || q(e + xi))       (q(e) fixed, no gradient)
    last                    q = softmax(logits at the last answer position); J as above
    answer_joint            phi = mean log-probability of the answer tokens
                            J = phi(e) - phi(e + xi)

    s_t = | <dJ/dx_t at x = e + xi , e_t> |           (gradient times input, one number)

for each response position ``t`` (0 elsewhere). The noise matters: the gradient of
``KL(q(e) || q(x))`` vanishes at ``x = e``; the code evaluates it at a nearby point, and
so does this function, with noise drawn from the caller's generator (a fixed generator
gives a fixed importance). The code's defaults: ``answer_mean``, ``noise_std = 1e-3``,
``eps = 1e-12`` inside ``log(q + eps)``. The model's own parameters get no gradient.

The code's caller passes its arguments in an order that does not match the function's
signature (``calculate_token_importance_gradient(model, self.tokenizer, input_segments,
self.args.device)``); this module follows the function's definition.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

from ktae.models.generate import cache_argument

OUTCOMES = ("answer_mean", "last", "answer_joint")
NOISE_STD = 1e-3
KL_EPS = 1e-12
CONCLUDE = "\nThe final answer is "
"""The text put between a response and the reference answer. The released code reads it
from its data (``inputs['conclude']``) and does not show it; this is ktae's choice."""


def _answer_summary(logits: torch.Tensor, input_ids: torch.Tensor, answer_mask: torch.Tensor,
                    outcome: str, columns: torch.Tensor) -> torch.Tensor:
    """``[B, V]`` logits (``answer_mean``, ``last``) or ``[B]`` mean answer log-probability
    (``answer_joint``) from ``[B, len(columns), V]`` logits, those of the sequence positions
    ``columns`` (:func:`_summary_columns`)."""
    predicts = torch.zeros_like(answer_mask)
    predicts[:, :-1] = answer_mask[:, 1:]  # position p predicts the token at p + 1
    if outcome == "last":
        L = answer_mask.shape[1]
        last = torch.where(answer_mask, torch.arange(L, device=logits.device), -1).amax(dim=1)
        at = torch.searchsorted(columns, last)
        return logits[torch.arange(logits.shape[0], device=logits.device), at]
    predicts = predicts[:, columns]
    count = predicts.sum(dim=1).clamp_min(1).to(logits.dtype)
    if outcome == "answer_mean":
        # where, not *: a -inf logit (a masked vocabulary entry) times 0 would be NaN
        return torch.where(predicts[..., None], logits, 0).sum(dim=1) / count[:, None]
    target = torch.roll(input_ids, -1, dims=1)[:, columns]
    token_lp = F.log_softmax(logits, dim=-1).gather(-1, target[..., None]).squeeze(-1)
    return torch.where(predicts, token_lp, 0).sum(dim=1) / count


def _summary_columns(answer_mask: torch.Tensor) -> torch.Tensor:
    """The sequence positions whose logits the answer summary reads (the answer tokens and
    the positions that predict them), in order."""
    predicts = torch.zeros_like(answer_mask)
    predicts[:, :-1] = answer_mask[:, 1:]
    return (predicts | answer_mask).any(dim=0).nonzero().squeeze(1)


def _logits_at(model, x: torch.Tensor, attention_mask: torch.Tensor,
               columns: torch.Tensor) -> torch.Tensor:
    """``[B, len(columns), V]`` logits at the positions ``columns`` under embeddings ``x``.
    A transformers model that takes ``logits_to_keep`` projects only those positions
    (the answer's few tokens instead of the whole sequence: the LM head over every position
    and its backward were most of the cost); another model projects all and is sliced."""
    if _takes_logits_to_keep(model):
        return model(inputs_embeds=x, attention_mask=attention_mask,
                     logits_to_keep=columns).logits
    return model(inputs_embeds=x, attention_mask=attention_mask).logits[:, columns]


def _takes_logits_to_keep(model) -> bool:
    import inspect

    return "logits_to_keep" in inspect.signature(type(model).forward).parameters



def _objective(outcome: str, ref, out, p0, log_p0):
    """Per-row objective whose input gradient is the importance: the answer's drop
    (``answer_joint``) or the KL from the clean answer distribution, with 0 log 0 = 0
    (an entry of q(e) = 0, a -inf logit, adds nothing, not 0 * inf)."""
    if outcome == "answer_joint":
        return ref - out
    return torch.where(p0 > 0, p0 * (log_p0 - F.log_softmax(out, dim=-1)), 0).sum(dim=-1)

ROWS_PER_PASS = 8
"""Rows of :func:`input_grad_importance` per forward-and-backward pass: the backward pass to
the input embeddings keeps every layer's activations of every row it covers, so the memory
held grows with the rows of a pass (the credit study's recipe runs its update in micro-batches
of 8 rows too).
The pass also freezes the weights (:class:`_no_weight_grad`): a LoRA policy's adapters
would otherwise keep what their own gradients need."""


def input_grad_importance(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                          response_mask: torch.Tensor, answer_mask: torch.Tensor, *,
                          outcome: str = "answer_mean", noise_std: float = NOISE_STD,
                          generator: torch.Generator | None = None,
                          rows_per_pass: int | None = ROWS_PER_PASS) -> torch.Tensor:
    """``[B, L]`` importance ``s_t`` of every response position (module docstring), 0
    elsewhere, float32 (float64 for a float64 model).

    Args:
        model: a causal LM taking ``inputs_embeds`` (a transformers model).
        input_ids: ``[B, L]`` prompt, response, conclusion and reference answer per row.
        attention_mask: ``[B, L]`` 1 on real tokens.
        response_mask: ``[B, L]`` bool, the positions whose importance is wanted.
        answer_mask: ``[B, L]`` bool, the reference answer's tokens (at least one per row).
        outcome: ``answer_mean`` (default), ``last`` or ``answer_joint``.
        noise_std: the standard deviation of the noise on the response embeddings (1e-3).
        generator: the CPU ``torch.Generator`` the noise is drawn from.
        rows_per_pass: rows per pass (:data:`ROWS_PER_PASS`; None: all at once). Rows are
            independent and the noise is drawn for the whole batch first, so this changes
            the memory held, not the values (beyond float rounding).
    """
    if outcome not in OUTCOMES:
        raise ValueError(f"outcome: expected one of {', '.join(OUTCOMES)}, got {outcome!r}")
    if rows_per_pass is not None and (not isinstance(rows_per_pass, int) or rows_per_pass < 1):
        raise ValueError(f"rows_per_pass: expected a positive integer or None, got {rows_per_pass!r}")
    response_mask, answer_mask = response_mask.bool(), answer_mask.bool()
    if not bool(answer_mask.any(dim=1).all()):
        raise ValueError("answer_mask: expected at least one answer token in every row")
    with torch.no_grad():
        e = model.get_input_embeddings()(input_ids).detach()
    noise = torch.randn(e.shape, generator=generator, dtype=e.dtype).to(e.device) * noise_std
    step = rows_per_pass or input_ids.shape[0]
    parts = [_importance_of_rows(model, input_ids[i:i + step], attention_mask[i:i + step],
                                 response_mask[i:i + step], answer_mask[i:i + step],
                                 e[i:i + step], noise[i:i + step], outcome)
             for i in range(0, input_ids.shape[0], step)]
    return torch.cat(parts)


def _importance_of_rows(model, input_ids, attention_mask, response_mask, answer_mask,
                        e: torch.Tensor, noise: torch.Tensor, outcome: str) -> torch.Tensor:
    """:func:`input_grad_importance` of some rows, their embeddings ``e`` and noise given."""
    columns = _summary_columns(answer_mask)
    dtype = torch.promote_types(e.dtype, torch.float32)  # the code's logits.float()
    with torch.no_grad():
        ref = _answer_summary(_logits_at(model, e, attention_mask, columns).to(dtype),
                              input_ids, answer_mask, outcome, columns)
        p0 = log_p0 = None  # read only by the distribution outcomes
        if outcome != "answer_joint":
            p0 = F.softmax(ref, dim=-1)
            log_p0 = torch.log(p0 + KL_EPS)
    x = (e + torch.where(response_mask[..., None], noise, 0)).requires_grad_(True)
    with torch.enable_grad(), _no_weight_grad(model):
        out = _answer_summary(_logits_at(model, x, attention_mask, columns).to(dtype),
                              input_ids, answer_mask, outcome, columns)
        (grad,) = torch.autograd.grad(_objective(outcome, ref, out, p0, log_p0).sum(), x)
    saliency = (grad.to(dtype) * e.to(dtype)).sum(dim=-1).abs()
    return torch.where(response_mask, saliency, 0).detach()


def append_answer(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                  response_ids: torch.Tensor, response_mask: torch.Tensor,
                  answers: list[list[int]], pad_id: int, conclusion: list[int] = ()):
    """The importance's inputs for left-padded prompts and right-padded responses:
    ``(input_ids, attention_mask, response_positions, answer_positions)``, ``[B, P + T +
    K]``, each row's ``conclusion + answers[i]`` tokens (K the longest) placed right after
    its last real response token; ``answer_positions`` marks the answer's tokens only (the
    code's ``token_ids_answer``, apart from its ``token_ids_conclude``). Response token
    ``j`` sits at column ``P + j`` (:func:`response_importance` reads it back from there).
    """
    B, P = prompt_ids.shape
    T = response_ids.shape[1]
    if len(answers) != B or any(len(a) == 0 for a in answers):
        raise ValueError(f"answers: expected {B} non-empty token lists, one per row")
    tails = [list(conclusion) + list(a) for a in answers]
    K = max(len(a) for a in tails)
    dev = prompt_ids.device
    tail = torch.full((B, K), pad_id, dtype=torch.long, device=dev)
    valid = torch.zeros((B, K), dtype=torch.bool, device=dev)
    for i, a in enumerate(tails):
        tail[i, :len(a)] = torch.tensor(a, dtype=torch.long)
        valid[i, :len(a)] = True
    is_answer = valid & (torch.arange(K, device=dev)[None] >= len(conclusion))
    resp = response_mask.bool()
    ids = torch.cat([prompt_ids, torch.where(resp, response_ids, pad_id),
                     torch.full((B, K), pad_id, dtype=torch.long, device=dev)], dim=1)
    attn = torch.cat([prompt_mask.bool(), resp, torch.zeros((B, K), dtype=torch.bool,
                                                           device=dev)], dim=1)
    at = P + resp.sum(dim=1, keepdim=True) + torch.arange(K, device=dev)[None]
    ids.scatter_(1, at, torch.where(valid, tail, pad_id))
    attn.scatter_(1, at, valid)
    answer = torch.zeros_like(attn).scatter_(1, at, is_answer)
    positions = torch.zeros_like(attn)
    positions[:, P:P + T] = resp
    return ids, attn.long(), positions, answer


def response_importance(model, prompt_ids, prompt_mask, response_ids, response_mask,
                        answers: list[list[int]], pad_id: int, *, conclusion: list[int] = (),
                        generator: torch.Generator | None = None, **options) -> torch.Tensor:
    """``[B, T]`` importance of each response token (0 on padding): :func:`append_answer`,
    then :func:`input_grad_importance` (``options``: ``outcome``, ``noise_std``)."""
    ids, attn, positions, answer = append_answer(prompt_ids, prompt_mask, response_ids,
                                                 response_mask, answers, pad_id, conclusion)
    s = input_grad_importance(model, ids, attn, positions, answer, generator=generator,
                              **options)
    P, T = prompt_ids.shape[1], response_ids.shape[1]
    return s[:, P:P + T]


def prompt_cache(model, prompt: list[int]):
    """The key/value cache of ``prompt[:-1]`` for one row (None for a one-token prompt),
    computed without gradient: the shared prefix of a group's rows, computed once
    (:func:`group_importance`, :func:`response_logits`)."""
    if len(prompt) < 2:
        return None
    device = model.get_input_embeddings().weight.device
    with torch.no_grad():
        out = model(input_ids=torch.tensor([prompt[:-1]], device=device), use_cache=True,
                    **({"logits_to_keep": 1} if _takes_logits_to_keep(model) else {}))
    return out[_cache_name(model)]


def _cache_name(model) -> str:
    """The forward's cache argument (:func:`ktae.models.generate.cache_argument`)."""
    return cache_argument(model)


def _continue(model, cache, rows: int, x: torch.Tensor, attention_mask: torch.Tensor,
              columns: torch.Tensor | None):
    """Logits at the segment positions ``columns`` (all when None) of ``rows`` rows that
    continue the one-row ``cache`` with embeddings ``x`` ``[rows, S, H]``;
    ``attention_mask`` ``[rows, S]`` covers the segment (the prefix is all real tokens).
    The cache is copied: a forward pass appends to the one it is given."""
    past = None
    if cache is not None:
        past = copy.deepcopy(cache)
        past.batch_repeat_interleave(rows)
        prefix = past.get_seq_length()
        attention_mask = torch.cat([attention_mask.new_ones((rows, prefix)), attention_mask],
                                   dim=1)
    keep = columns is not None and _takes_logits_to_keep(model)
    kwargs = {"logits_to_keep": columns} if keep else {}
    if past is not None:
        kwargs[_cache_name(model)] = past
    logits = model(inputs_embeds=x, attention_mask=attention_mask, use_cache=past is not None,
                   **kwargs).logits
    return logits if columns is None or keep else logits[:, columns]


def _segment(prompt: list[int], responses: list[list[int]], tail: list[int], pad_id: int,
             device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(ids, attention, response)`` ``[B, 1 + T + len(tail)]``: each row the prompt's
    last token, its response, then ``tail``, right-padded; ``response`` marks the
    response's tokens."""
    B, T, K = len(responses), max(1, max(len(r) for r in responses)), len(tail)
    ids = torch.full((B, 1 + T + K), pad_id, dtype=torch.long)
    attn = torch.zeros_like(ids)
    resp = torch.zeros_like(ids, dtype=torch.bool)
    for i, r in enumerate(responses):
        n = 1 + len(r) + K
        ids[i, :n] = torch.tensor([prompt[-1], *r, *tail], dtype=torch.long)
        attn[i, :n] = 1
        resp[i, 1:1 + len(r)] = True
    return ids.to(device), attn.to(device), resp.to(device)


class _no_weight_grad:
    """The model's parameters without ``requires_grad`` for a block: the backward pass
    to the input embeddings then neither computes nor keeps what a weight gradient needs."""

    def __init__(self, model):
        self.params = [p for p in model.parameters() if p.requires_grad]

    def __enter__(self):
        for p in self.params:
            p.requires_grad_(False)

    def __exit__(self, *exc):
        for p in self.params:
            p.requires_grad_(True)


SPLIT_SAVING = 0.15
"""A group's rows are computed in two sub-batches, the shorter responses apart, when that
saves at least this share of the padded positions (:func:`length_chunks`)."""


def length_chunks(lengths: list[int], tail: int = 0) -> list[list[int]]:
    """The rows of a group in one or two sub-batches: the rows sorted by length and cut
    where ``sum(rows x (longest + 1 + tail))`` is least, when that saves at least
    :data:`SPLIT_SAVING` of one batch's positions (a batch is padded to its longest row, so
    a few long responses would make every short one pay for their length)."""
    B = len(lengths)
    if B < 2:
        return [list(range(B))]
    order = sorted(range(B), key=lambda i: (lengths[i], i))
    width = [max(1, lengths[i]) + 1 + tail for i in order]
    whole = B * width[-1]
    best, cut = whole, B
    for k in range(1, B):
        cost = k * width[k - 1] + (B - k) * width[-1]
        if cost < best:
            best, cut = cost, k
    if cut == B or best > (1 - SPLIT_SAVING) * whole:
        return [list(range(B))]
    return [sorted(order[:cut]), sorted(order[cut:])]


def group_importance(model, prompt: list[int], responses: list[list[int]],
                     answer: list[int], pad_id: int, *, conclusion: list[int] = (),
                     outcome: str = "answer_mean", noise_std: float = NOISE_STD,
                     generator: torch.Generator | None = None,
                     logits: bool = False, reference: torch.Tensor | None = None,
                     split: bool = True):
    """``[B, T]`` importance of each response token to one prompt (0 on padding), equal to
    :func:`response_importance` with the prompt repeated on every row and the same
    generator (the same noise), computed with the prompt's cache computed once: the
    prompt is not noised, so it is the same in both passes, and the gradient is wanted at
    the response's positions only. With ``logits``, ``(importance, logits)``: also the
    ``[B, T, V]`` logits of the clean pass that predict each response token (a response's
    log-probabilities and entropies, without another forward pass). ``reference``: the
    clean pass's answer summary of every row (:func:`tail_reference`, from the sampling's
    own cache), which then is not computed again (and ``logits`` cannot be asked).
    ``split``: rows of very different lengths in two sub-batches (:func:`length_chunks`;
    rows are independent and the noise is drawn for the whole group first, so only the
    padding changes)."""
    if outcome not in OUTCOMES:
        raise ValueError(f"outcome: expected one of {', '.join(OUTCOMES)}, got {outcome!r}")
    if not answer:
        raise ValueError("answer: expected at least one answer token")
    if reference is not None and logits:
        raise ValueError("logits: not with a reference (no clean pass is run)")
    embed = model.get_input_embeddings()
    tail = [*conclusion, *answer]
    B, T = len(responses), max(1, max(len(r) for r in responses))
    # the noise of the whole row (prompt included) as response_importance draws it
    P = len(prompt)
    noise = torch.randn((B, P - 1 + 1 + T + len(tail), embed.weight.shape[-1]),
                        generator=generator, dtype=embed.weight.dtype)[:, P - 1:] * noise_std
    cache = prompt_cache(model, prompt)
    chunks = (length_chunks([len(r) for r in responses], len(tail)) if split
              else [list(range(B))])
    s = kept = None
    for rows in chunks:
        part_s, part_kept = _importance_rows(
            model, cache, prompt, [responses[i] for i in rows], tail, len(conclusion),
            pad_id, outcome, noise[rows], None if reference is None else reference[rows],
            logits)
        if s is None:
            s = part_s.new_zeros((B, T))
            kept = None if part_kept is None else part_kept.new_zeros((B, T, *part_kept.shape[2:]))
        s[rows, :part_s.shape[1]] = part_s
        if kept is not None:
            kept[rows, :part_kept.shape[1]] = part_kept
    return (s, kept) if logits else s


def _importance_rows(model, cache, prompt: list[int], responses: list[list[int]],
                     tail: list[int], n_conclusion: int, pad_id: int, outcome: str,
                     noise: torch.Tensor, reference: torch.Tensor | None, logits: bool):
    """:func:`group_importance` on some of a group's rows, their noise given (``[b, S', H]``,
    ``S'`` at least this sub-batch's segment): ``([b, T_b] importance, [b, T_b, V] clean
    logits or None)``, ``T_b`` their longest response."""
    embed = model.get_input_embeddings()
    device = embed.weight.device
    ids, attn, response = _segment(prompt, responses, tail, pad_id, device)
    B, S = ids.shape
    T = S - 1 - len(tail)
    after = response.sum(dim=1, keepdim=True) + 1 + n_conclusion
    col = torch.arange(S, device=device)[None]
    answer_mask = (col >= after) & (col < after + len(tail) - n_conclusion)
    columns = _summary_columns(answer_mask)
    with torch.no_grad():
        e = embed(ids).detach()
        dtype = torch.promote_types(e.dtype, torch.float32)
        kept = None
        if reference is not None:
            ref = reference.to(device=device, dtype=dtype)
        else:
            clean = _continue(model, cache, B, e, attn, None if logits else columns)
            kept = clean if logits else None
            ref = _answer_summary((clean[:, columns] if logits else clean).to(dtype), ids,
                                  answer_mask, outcome, columns)
        p0 = log_p0 = None  # read only by the distribution outcomes
        if outcome != "answer_joint":
            p0 = F.softmax(ref, dim=-1)
            log_p0 = torch.log(p0 + KL_EPS)
    noise = noise[:, :S].to(device)
    x = (e + torch.where(response[..., None], noise, 0)).requires_grad_(True)
    with torch.enable_grad(), _no_weight_grad(model):
        out = _answer_summary(_continue(model, cache, B, x, attn, columns).to(dtype), ids,
                              answer_mask, outcome, columns)
        (grad,) = torch.autograd.grad(_objective(outcome, ref, out, p0, log_p0).sum(), x)
    saliency = (grad.to(dtype) * e.to(dtype)).sum(dim=-1).abs()
    s = torch.where(response, saliency, 0).detach()[:, 1:1 + T]
    return s, (None if kept is None else kept[:, :T])


def tail_reference(logits: torch.Tensor, conclusion: list[int], answer: list[int], *,
                   outcome: str = "answer_mean") -> torch.Tensor | None:
    """The clean answer summary of :func:`group_importance` (``ref``) from ``[B, K, V]``
    logits at the positions of the tail ``conclusion + answer`` after each response (as
    :func:`ktae.models.generate.generate_hf` gives them with ``tails``): ``[B, V]``
    (``answer_mean``, ``last``) or ``[B]`` (``answer_joint``). None without a conclusion:
    the first answer token is then predicted from the response's last position, which the
    tail does not hold."""
    if outcome not in OUTCOMES:
        raise ValueError(f"outcome: expected one of {', '.join(OUTCOMES)}, got {outcome!r}")
    if not conclusion:
        return None
    B, K = logits.shape[:2]
    if K != len(conclusion) + len(answer):
        raise ValueError(f"logits: expected {len(conclusion) + len(answer)} tail positions, "
                         f"got {K}")
    ids = torch.tensor([[*conclusion, *answer]] * B, device=logits.device)
    answer_mask = torch.zeros((B, K), dtype=torch.bool, device=logits.device)
    answer_mask[:, len(conclusion):] = True
    dtype = torch.promote_types(logits.dtype, torch.float32)
    return _answer_summary(logits.to(dtype), ids, answer_mask, outcome,
                           torch.arange(K, device=logits.device))


def skip_noise(generator: torch.Generator | None, prompt_len: int,
               responses: list[list[int]], tail_len: int, weight: torch.Tensor) -> None:
    """Advance ``generator`` as :func:`group_importance` would for this group (its one noise
    draw), without computing anything: a caller that skips a group leaves every later
    group's noise, and so its importance, as it would be."""
    B, T = len(responses), max(1, max(len(r) for r in responses))
    S = 1 + T + tail_len
    torch.randn((B, prompt_len - 1 + S, weight.shape[-1]), generator=generator,
                dtype=weight.dtype)


def response_logits(model, prompt: list[int], responses: list[list[int]], pad_id: int,
                    cache=None) -> torch.Tensor:
    """``[B, T, V]`` logits that predict each response token after ``prompt`` (no
    gradient), the prompt computed once (``cache``: its :func:`prompt_cache`)."""
    embed = model.get_input_embeddings()
    ids, attn, _ = _segment(prompt, responses, [], pad_id, embed.weight.device)
    cache = prompt_cache(model, prompt) if cache is None else cache
    with torch.no_grad():
        columns = torch.arange(ids.shape[1] - 1, device=ids.device)  # not the last token
        return _continue(model, cache, len(responses), embed(ids), attn, columns)


def answer_tokens(tokenizer, answers: list) -> tuple[list[int], list[list[int]]]:
    """``(conclusion, answers)`` as token ids: :data:`CONCLUDE` and each reference answer
    (the first of a list of accepted alternatives) tokenised apart, as the code's segments;
    a missing or empty answer is a ``ValueError`` naming its row."""
    out = []
    for i, answer in enumerate(answers):
        if isinstance(answer, (list, tuple)):
            answer = answer[0] if answer else None
        ids = [] if answer is None else tokenizer(str(answer).strip(),
                                                 add_special_tokens=False)["input_ids"]
        if not ids:
            raise ValueError(f"answer: row {i} has no reference answer, which the "
                             "input-gradient importance needs")
        out.append(list(ids))
    return list(tokenizer(CONCLUDE, add_special_tokens=False)["input_ids"]), out
