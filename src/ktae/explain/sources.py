"""Where ``ktae explain`` gets its groups: a run directory, a JSONL file, or a model.

Each loader returns a :class:`Source`: the groups (:class:`ktae.explain.report.GroupInput`,
keyed by an id the user can pick with ``--group``), the tokenizer that made their
token ids, and the credit the source implies (a run's own credit; KTAE otherwise).

JSONL input: one group per line, ``{"prompt": str, "responses": [str, ...]}`` with
``"rewards": [float, ...]`` (one per response) or ``"answer"`` (a reference answer, each
response scored by :func:`ktae.rewards.math_reward`); optional ``"correct"``
(booleans) and ``"id"``. ``"question"``/``"problem"`` are accepted for ``"prompt"``.
Optional ``"wrong"`` (per response, ``[start, end)`` character spans that are locally
wrong) and ``"checked"`` (spans judged at all; default every character) give labels that
the page outlines (and that ``ktae audit`` scores credit against); without them, the
responses to embedded-task prompts are labelled by :func:`ktae.tasks.label_response`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ktae.core.methods import Method
from ktae.explain.report import GroupInput
from ktae.runs.reader import (
    load_tokenizer,
    read_run_rollouts,
    recorded_credit_name,
    recorded_method,
    run_config,
    run_tokenizer,
)

DEFAULT_MODEL = "default"
"""``--model default``: the shipped warm-started tiny model."""


@dataclass
class Source:
    """Groups to explain and how to read them."""

    groups: list[tuple[str, GroupInput]]
    tokenizer: object
    credit: Method
    title: str
    meta: list[str] = field(default_factory=list)
    credit_name: str = "ktae"
    use_recorded: bool = False
    train_config: object = None


# --------------------------------------------------------------------------- helpers


def model_tokenizer_path(model: str | None) -> str:
    """Where MODEL's tokenizer is: a named model's directory (None: ``default``), else MODEL."""
    from ktae.models.named import is_named, named_model_path

    name = DEFAULT_MODEL if model is None else model
    return str(named_model_path(name, progress=False)) if is_named(name) else name


def ignore_ids(tokenizer) -> tuple[int, ...]:
    """Pad and EOS ids: no key-token value, as in training."""
    ids = {getattr(tokenizer, "pad_token_id", None), getattr(tokenizer, "eos_token_id", None)}
    return tuple(sorted(int(i) for i in ids if i is not None))


def credit_spec(name: str, *, train_config=None, ignore_token_ids=()) -> Method:
    """Parse ``--credit`` (``ktae``, ``ktae+taco``, ``grpo``, ``taco``, ``ktae@ngram=3``,
    ...) the way ``ktae train`` does, with that run's hyper-parameters when
    ``train_config`` is given: :func:`ktae.runs.credit.credit_method`."""
    from ktae.runs.credit import credit_method

    return credit_method(name, train_config=train_config, ignore_token_ids=ignore_token_ids)


# --------------------------------------------------------------------------- run directory


def load_run(run: Path, *, step: int | None = None, tokenizer: str | None = None,
             credit: str | None = None) -> Source:
    """The rollouts a ``ktae train`` run kept (:mod:`ktae.runs.rollouts`), of one step
    (default: the latest recorded), read through :mod:`ktae.runs.reader`."""
    header, records = read_run_rollouts(run)
    steps = sorted({r["step"] for r in records})
    if step is None:
        step = steps[-1]
    elif step not in steps:
        raise ValueError(f"step: {step} was not recorded; recorded steps: {steps}")
    tok, tok_path = run_tokenizer(run, header, tokenizer)
    ignore = tuple(header.get("ignore_token_ids", ignore_ids(tok)))
    recorded = recorded_method(header, ignore_token_ids=ignore)
    run_name = recorded_credit_name(header)
    spec, use_recorded, cfg = recorded, True, None
    if credit is not None:
        cfg = run_config(run)  # the run's hyper-parameters (h1, alpha, ...)
        spec = credit_spec(credit, train_config=cfg, ignore_token_ids=ignore)
        use_recorded = (spec.estimator, spec.calibration) == (recorded.estimator,
                                                              recorded.calibration)
        if use_recorded:
            spec = recorded
    groups = []
    for r in (r for r in records if r["step"] == step):
        g = GroupInput(prompt=r["prompt"], responses=r["responses"], rewards=r["rewards"],
                       correct=r["correct"], label=f"step {step} \u00b7 group {r['group']}",
                       trained=r.get("advantages"), logprobs=r.get("logprobs"),
                       entropies=r.get("entropies"), old_entropies=r.get("old_entropies"),
                       input_grad_importance=r.get("input_grad_importance"),
                       weights=r.get("weights"),
                       flagged=r.get("flagged"), loss_mask=r.get("loss_mask"))
        groups.append((str(r["group"]), g))
    meta = [f"run {run}: trained with credit {run_name}; step {step} (recorded steps "
            f"{_ranges(steps)})", f"tokenizer: {tok_path}"]
    return Source(groups=groups, tokenizer=tok, credit=spec, title=f"ktae explain: {run.name}",
                  meta=meta, credit_name=credit or run_name, use_recorded=use_recorded,
                  train_config=cfg)


def _ranges(steps: list[int]) -> str:
    if len(steps) <= 6:
        return ", ".join(map(str, steps))
    return f"{', '.join(map(str, steps[:3]))}, ..., {', '.join(map(str, steps[-2:]))}"


# --------------------------------------------------------------------------- JSONL


def _strings(value, what: str, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{where}: expected {what} as a list of strings")
    return value


def _span_labels(rec: dict, responses: list[str], where: str) -> list[str] | None:
    """Character labels from the optional ``wrong``/``checked`` spans of a record."""
    if "wrong" not in rec:
        return None
    from ktae.viz.labels import span_labels

    wrong, checked = rec["wrong"], rec.get("checked")
    if not isinstance(wrong, list) or len(wrong) != len(responses):
        raise ValueError(f"{where}: expected 'wrong' as {len(responses)} lists of [start, end] "
                         "character spans (one list per response; [] when none is wrong)")
    if checked is not None and (not isinstance(checked, list) or len(checked) != len(responses)):
        raise ValueError(f"{where}: expected 'checked' as {len(responses)} lists of spans")
    return [span_labels(text, wrong[i], None if checked is None else checked[i],
                        f"{where} response {i}") for i, text in enumerate(responses)]


def load_jsonl(path: Path, *, tokenizer) -> list[tuple[str, GroupInput]]:
    """Groups of text responses, tokenised with ``tokenizer`` (see the module docstring)."""
    from ktae.rewards import math_reward

    groups = []
    lines = path.read_text(encoding="utf-8").splitlines()
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"INPUT: {path} line {n}"
        try:
            rec = json.loads(line)
        except ValueError as err:
            raise ValueError(f"{where}: not JSON ({err})") from err
        if not isinstance(rec, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(rec).__name__}")
        prompt = next((rec[k] for k in ("prompt", "question", "problem") if k in rec), None)
        if not isinstance(prompt, str):
            raise ValueError(f"{where}: expected a 'prompt' string")
        if "responses" not in rec:
            raise ValueError(f"{where}: no 'responses' (a list of response texts to explain)")
        responses = _strings(rec["responses"], "'responses'", where)
        if len(responses) < 2:
            raise ValueError(f"{where}: a group needs at least 2 responses to compare, "
                             f"got {len(responses)}")
        correct = rec.get("correct")
        if "rewards" in rec:
            rewards = rec["rewards"]
            if not isinstance(rewards, list) or len(rewards) != len(responses) or not all(
                    isinstance(x, (int, float)) and not isinstance(x, bool) for x in rewards):
                raise ValueError(f"{where}: expected 'rewards' as {len(responses)} numbers "
                                 "(one per response)")
            rewards = [float(x) for x in rewards]
        elif "answer" in rec:
            results = [math_reward(text, rec["answer"]) for text in responses]
            rewards = [r.score for r in results]
            correct = correct if correct is not None else [r.correct for r in results]
        else:
            raise ValueError(f"{where}: expected 'rewards' (one per response) or a reference "
                             "'answer' to score the responses")
        if correct is not None and (not isinstance(correct, list) or len(correct) != len(responses)):
            raise ValueError(f"{where}: expected 'correct' as {len(responses)} booleans")
        ids = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in responses]
        key = str(rec.get("id", len(groups)))
        labels = _span_labels(rec, responses, where)
        groups.append((key, GroupInput(labels=labels,
            prompt=prompt, responses=ids, rewards=rewards,
            correct=[bool(c) for c in correct] if correct is not None else None,
            label=f"{key} (line {n})" if "id" in rec else f"line {n}",
            answer=None if rec.get("answer") is None else str(rec["answer"]))))
    if not groups:
        raise ValueError(f"INPUT: {path} holds no groups")
    return groups


# --------------------------------------------------------------------------- model


def load_model(name: str):
    """``(model, tokenizer, path)``; a name of :mod:`ktae.models.named` (``default``, the
    shipped tiny model; ``smollm2-135m``) is that model."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from ktae.models.named import is_named, named_model_path

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
        from ktae.tasks import EVAL_SEED, format_prompt, generate

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
                  on_batch=None) -> list[tuple[str, GroupInput]]:
    """``num_generations`` sampled responses per prompt, scored by ``math_reward``; groups
    are keyed and labelled by prompt index (``first_index`` for ``rows[0]``); ``on_batch``
    as :func:`ktae.models.generate.generate_hf` takes it (progress)."""
    from ktae.models.generate import SamplingConfig, generate_hf
    from ktae.rewards import math_reward

    sampling = SamplingConfig(k=num_generations, temperature=temperature,
                              max_new_tokens=max_new_tokens, seed=seed)
    out = generate_hf(model, tokenizer, [r["prompt"] for r in rows], sampling, on_batch=on_batch)
    groups = []
    for i, (row, gens) in enumerate(zip(rows, out, strict=True), first_index):
        results = [math_reward(g.text, row["answer"]) for g in gens]
        groups.append((str(i), GroupInput(
            prompt=row["prompt"], responses=[list(g.token_ids) for g in gens],
            rewards=[r.score for r in results], correct=[r.correct for r in results],
            label=f"prompt {i}", answer=row["answer"])))
    return groups


def score_groups(model, tokenizer, groups: list[GroupInput], *, temperature: float = 1.0,
                 importance: bool = False, on_group: Callable[[str], None] | None = None
                 ) -> None:
    """Fill each group's per-token ``logprobs`` and ``entropies`` under ``model`` (the
    prompt tokenised as for generation and computed once per group, its responses
    continuing it right-padded, the LM head applied to the response positions only when
    the model takes ``logits_to_keep``); with ``importance`` also its
    ``input_grad_importance`` (:func:`importance_groups`), whose clean forward pass gives
    the log-probs and entropies too. ``on_group(phase)`` is called after each group
    (``"importance"`` with ``importance``, else ``"scores"``): progress."""
    import torch

    from ktae.core.entropy import categorical_entropy
    from ktae.models.input_grad_importance import response_logits

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
                          on_group=None if on_group is None else lambda: on_group("importance"))
        return
    pad = tokenizer.pad_token_id or 0
    for g in groups:
        fill(g, response_logits(model, tokenizer(g.prompt)["input_ids"],
                                [list(r) for r in g.responses], pad))
        if on_group is not None:
            on_group("scores")


def importance_groups(model, tokenizer, groups: list[GroupInput], *, seed: int = 0,
                      on_group: Callable[[], None] | None = None,
                      on_logits: Callable[[GroupInput, object], None] | None = None) -> None:
    """Fill each group's ``input_grad_importance`` under ``model``: each response followed
    by the concluding text and the group's reference answer, as the trainer does
    (:func:`ktae.models.input_grad_importance.group_importance`: the prompt computed once,
    one clean forward pass and one forward and backward pass per group, noise from a
    generator seeded with ``seed``); ``on_logits(group, logits)`` with the clean pass's
    ``[B, T, V]`` logits that predict the responses; ``on_group()`` after each group."""
    import torch

    from ktae.models.input_grad_importance import answer_tokens, group_importance

    g_noise = torch.Generator().manual_seed(seed)
    pad = tokenizer.pad_token_id or 0
    for g in groups:
        try:
            conclusion, (answer,) = answer_tokens(tokenizer, [g.answer])
        except ValueError:
            raise ValueError(f"{g.label or 'a group'}: the input-gradient importance needs the "
                             "group's reference answer ('answer')") from None
        out = group_importance(model, tokenizer(g.prompt)["input_ids"],
                               [list(r) for r in g.responses], answer, pad,
                               conclusion=conclusion, generator=g_noise,
                               logits=on_logits is not None)
        s, logits = out if on_logits is not None else (out, None)
        g.input_grad_importance = [s[i, :len(r)].tolist() for i, r in enumerate(g.responses)]
        if on_logits is not None:
            on_logits(g, logits)
        if on_group is not None:
            on_group()
