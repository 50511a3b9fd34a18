"""Groups sampled from a model: the model a name loads (:func:`load_model`), the prompts
(:func:`prompt_rows`: a JSONL file or the embedded task's held-out split) and
``num_generations`` responses to each, scored by :func:`ktae.rewards.math_reward`
(:func:`sample_groups`)."""

from __future__ import annotations

import json
from pathlib import Path

from ktae.groups.input import GroupInput
from ktae.models.generate import SamplingConfig, generate_hf
from ktae.models.input_grad_importance import answer_tokens, tail_reference
from ktae.models.named import is_named, named_model_path
from ktae.rewards import math_reward
from ktae.rewards.ends import DEFAULT_CUT_OFF, require_end
from ktae.runs.reader import load_tokenizer
from ktae.tasks import EVAL_SEED, format_prompt, generate

DEFAULT_MODEL = "default"
"""``--model default``: the shipped warm-started tiny model."""


def model_tokenizer_path(model: str | None) -> str:
    """Where MODEL's tokenizer is: a named model's directory (None: ``default``), else MODEL."""

    name = DEFAULT_MODEL if model is None else model
    return str(named_model_path(name, progress=False)) if is_named(name) else name



def load_model(name: str):
    """``(model, tokenizer, path)``; a name of :mod:`ktae.models.named` (``default``, the
    shipped tiny model; ``smollm2-135m``) is that model."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging


    path = str(named_model_path(name, progress=False)) if is_named(name) else name
    bar = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # no "Loading weights" bar between our own lines
    try:
        model = AutoModelForCausalLM.from_pretrained(path)
    except Exception as err:
        raise ValueError(f"model: cannot load a model from {name!r} ({err})") from err
    finally:
        if bar:
            hf_logging.enable_progress_bar()
    tok = load_tokenizer(path)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    model.eval()
    return model, tok, path


def prompt_rows(prompts: Path | None, tokenizer, n: int) -> list[dict]:
    """``[{"prompt", "answer"}]``: from a JSONL file, or the embedded task's held-out split."""
    if prompts is None:

        template = "compact" if len(tokenizer) < 1000 else "qwen-math"
        return [{"prompt": format_prompt(p, template), "answer": p.answer}
                for p in generate(n, split="test", seed=EVAL_SEED)]
    if not prompts.is_file():
        raise ValueError(f"prompts: file not found: {prompts}")
    rows = []
    for i, line in enumerate(prompts.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError as err:
            raise ValueError(f"prompts: {prompts} line {i}: not JSON ({err})") from err
        prompt = next((rec.get(k) for k in ("prompt", "question", "problem") if k in rec), None) \
            if isinstance(rec, dict) else None
        if not isinstance(prompt, str) or "answer" not in rec:
            raise ValueError(f"prompts: {prompts} line {i}: expected a 'prompt' string and an "
                             "'answer'")
        answer = rec["answer"]  # a list: accepted alternatives, as the rewards read it
        rows.append({"prompt": prompt, "answer": answer if isinstance(answer, list)
                     else str(answer)})
    if not rows:
        raise ValueError(f"prompts: {prompts} holds no prompts")
    return rows[:n]


def sample_groups(model, tokenizer, rows: list[dict], *, num_generations: int,
                  max_new_tokens: int, temperature: float, seed: int, first_index: int = 0,
                  on_batch=None, scores: float | None = None, tails=None,
                  on_tail=None, cut_off: str = DEFAULT_CUT_OFF) -> list[tuple[str, GroupInput]]:
    """``num_generations`` sampled responses per prompt, scored by ``math_reward`` (a
    response cut at ``max_new_tokens`` is wrong unless ``cut_off="read"``,
    :mod:`ktae.rewards.ends`); groups
    are keyed and labelled by prompt index (``first_index`` for ``rows[0]``); ``on_batch``
    as :func:`ktae.models.generate.generate_hf` takes it (progress). ``scores``: a
    temperature at which each group's ``logprobs`` and ``entropies`` are read from the
    sampling steps (:func:`ktae.models.generate.generate_hf`; left None where the model's
    generation config changes the logits first). ``tails``, ``on_tail``: as
    :func:`ktae.models.generate.generate_hf` takes them (``on_tail``'s index counts from
    ``rows[0]``)."""

    sampling = SamplingConfig(k=num_generations, temperature=temperature,
                              max_new_tokens=max_new_tokens, seed=seed)
    out = generate_hf(model, tokenizer, [r["prompt"] for r in rows], sampling, on_batch=on_batch,
                      scores=scores, tails=tails, on_tail=on_tail)
    groups = []
    for i, (row, gens) in enumerate(zip(rows, out, strict=True), first_index):
        results = require_end([math_reward(g.text, row["answer"]) for g in gens],
                              [g.truncated for g in gens], rule=cut_off)
        groups.append((str(i), GroupInput(
            prompt=row["prompt"], responses=[list(g.token_ids) for g in gens],
            rewards=[r.score for r in results], correct=[r.correct for r in results],
            label=f"prompt {i}", answer=row["answer"], **generation_scores(gens))))
    return groups


def generation_scores(gens) -> dict:
    """``{"logprobs", "entropies"}`` of a group's generations when the sampling recorded
    them (:func:`ktae.models.generate.generate_hf`'s ``scores``), else ``{}``."""
    if not gens or any(g.logprobs is None for g in gens):
        return {}
    return {"logprobs": [list(g.logprobs) for g in gens],
            "entropies": [list(g.entropies) for g in gens]}


def importance_references(tokenizer, answers: list, references, rewards_of):
    """``(tails, on_tail, refs)`` for :func:`ktae.models.generate.generate_hf`: each
    prompt's tail (the concluding text and its reference answer) and a callback that keeps,
    in ``refs[i]``, the clean answer summaries of prompt ``i``'s responses when
    ``references(rewards_of(gens, answers[i]))`` says its credit reads the importance;
    ``(None, None, {})`` when ``references`` is None."""
    refs: dict[int, object] = {}
    if references is None:
        return None, None, refs

    conclusion, ids = answer_tokens(tokenizer, answers)

    def on_tail(i, gens, logits):
        if references(rewards_of(gens, answers[i])):
            refs[i] = tail_reference(logits, conclusion, ids[i])

    return [conclusion + a for a in ids], on_tail, refs
