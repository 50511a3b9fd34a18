"""Benchmark prompts against the model's context, checked before anything is generated.

A prompt of P tokens leaves ``context - P`` positions for its response
(:func:`ktae.models.generate.prompt_budget`). A prompt with no room left (``P >= context``)
would get an empty response and score 0 without saying why, so it is never passed on
silently; per benchmark, the rule ``long_prompts`` says what happens to such prompts:

* ``"error"`` (default): refused with one line naming the benchmark, how many prompts do
  not fit, the longest length and the context;
* ``"skip"``: those problems are left out (``n`` counts the rest; a benchmark with none
  left is an error, not an accuracy of 0);
* ``"truncate"``: each is cut to its last ``context - min(max_new_tokens, context // 2)``
  tokens (the start of the prompt goes, its end and the answer cue stay), so it gets a
  budget of ``min(max_new_tokens, context // 2)``.

Every benchmark's ``long_prompts`` report (``rule``, ``count`` of prompts that did not
fit, the ``longest`` prompt in tokens, the ``context``, and ``budget_cut``: prompts that
fit but with fewer than ``max_new_tokens`` positions left, whose responses may be cut
short) goes into ``results.json`` and the printed table.
"""

from __future__ import annotations

from collections.abc import Sequence

from ktae.models.generate import context_length

LONG_PROMPT_RULES = ("error", "skip", "truncate")


def model_context(model, model_path: str | None = None) -> int | None:
    """The model's context in tokens: from the loaded model's config, else (vLLM, where
    no transformers model is loaded) from the config at ``model_path``; None if unknown."""
    if model is not None:
        return context_length(model)
    if model_path is None:
        return None
    try:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(model_path)
    except (OSError, ValueError):
        return None
    return context_length(type("Loaded", (), {"config": config})())


def prompt_lengths(tokenizer, prompts: Sequence[str], *, add_special_tokens: bool) -> list[int]:
    """Token length of each prompt as the generator tokenizes it."""
    return [len(tokenizer(p, add_special_tokens=add_special_tokens,
                       verbose=False)["input_ids"])
            for p in prompts]


def truncate_prompt(prompt: str, tokenizer, keep: int, *, add_special_tokens: bool) -> str:
    """``prompt`` cut from the left to at most ``keep`` tokens (as the generator tokenizes
    it, special tokens included)."""
    special = len(tokenizer("", add_special_tokens=add_special_tokens,
                       verbose=False)["input_ids"])
    ids = tokenizer(prompt, add_special_tokens=False, verbose=False)["input_ids"]
    cut = max(1, keep - special)
    for _ in range(8):  # decoding and re-encoding may merge tokens differently at the cut
        text = tokenizer.decode(ids[-cut:], skip_special_tokens=False)
        if len(tokenizer(text, add_special_tokens=add_special_tokens,
                       verbose=False)["input_ids"]) <= keep \
                or cut == 1:
            return text
        cut -= 1
    return text


def long_prompt_error(name: str, count: int, total: int, longest: int, context: int) -> str:
    return (f"{name}: {count} of {total} prompts do not fit in the model's context "
            f"(longest {longest} tokens, context {context}); evaluate on a model with a longer "
            "context, or pass --long-prompts skip (leave them out) or truncate (cut them)")


def check_prompts(name: str, records: list, prompts: list[str], tokenizer, *,
                  context: int | None, max_new_tokens: int, rule: str = "error",
                  add_special_tokens: bool = True) -> tuple[list, list[str], dict]:
    """Apply ``rule`` to the prompts of benchmark ``name`` that do not fit in ``context``.

    Returns the records and prompts to generate for, and the benchmark's report
    (``{"rule", "count", "longest", "context", "budget_cut"}``; see the module docstring).

    Raises:
        ValueError: ``rule`` is ``"error"`` and some prompt does not fit (one line), or
            ``rule`` is unknown.
    """
    if rule not in LONG_PROMPT_RULES:
        raise ValueError(f"long_prompts: expected one of {', '.join(LONG_PROMPT_RULES)}, "
                         f"got {rule!r}")
    lengths = prompt_lengths(tokenizer, prompts, add_special_tokens=add_special_tokens)
    longest = max(lengths, default=0)
    if context is None:
        return records, prompts, {"rule": rule, "count": 0, "longest": longest,
                                  "context": None, "budget_cut": 0}
    long = [i for i, n in enumerate(lengths) if n >= context]
    report = {"rule": rule, "count": len(long), "longest": longest, "context": context}
    if long and rule == "error":
        raise ValueError(long_prompt_error(name, len(long), len(prompts), longest, context))
    if rule == "skip":
        if len(long) == len(prompts):
            raise ValueError(f"{name}: all {len(prompts)} prompts are longer than the model's "
                             f"context (shortest {min(lengths)} tokens, context {context}); "
                             "nothing is left to evaluate")
        keep = [i for i in range(len(prompts)) if i not in set(long)]
        records = [records[i] for i in keep]
        prompts = [prompts[i] for i in keep]
        lengths = [lengths[i] for i in keep]
    elif rule == "truncate" and long:
        room = context - min(max_new_tokens, context // 2)
        prompts = list(prompts)
        for i in long:
            prompts[i] = truncate_prompt(prompts[i], tokenizer, room,
                                         add_special_tokens=add_special_tokens)
        lengths = prompt_lengths(tokenizer, prompts, add_special_tokens=add_special_tokens)
    report["budget_cut"] = sum(context - n < max_new_tokens for n in lengths)
    return records, prompts, report
