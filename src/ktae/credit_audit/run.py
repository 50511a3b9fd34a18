"""``ktae audit``: does each credit method put its credit on the right tokens?

Groups come with per-token local-error labels (:mod:`ktae.core.credit_metrics`):

* sampled from a model (``--model default``: the shipped tiny model on the embedded
  task's held-out prompts), labelled by :func:`ktae.tasks.label_response`;
* a ``ktae train`` run directory: its saved rollouts (``rollouts.jsonl``), labelled the
  same way, the figures per recorded step;
* a JSONL file of groups with user-given labels: the fields ``ktae explain`` reads
  (``prompt``, ``responses``, ``rewards`` or ``answer``, optional ``correct``, ``id``)
  plus ``"wrong"``: per response a list of ``[start, end)`` character spans that are
  locally wrong, optional ``"checked"`` (spans that were judged at all; default: every
  character) and ``"level"`` (any label to break the figures down by).

Every method is named, parsed and computed by :mod:`ktae.core.methods`, as ``ktae
explain``, ``ktae compare`` and ``ktae train`` do (``CREDIT[@KEY=VALUE...]``, with a run's
own settings through :func:`ktae.runs.credit.credit_method`; the credit through
:func:`ktae.groups.credit.credit_values`, which pads the groups for
:func:`ktae.core.methods.method_credit`, from the scoring policy's log-probs and
entropies). A token a calibration's loss mask removes receives no credit.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ktae.core.calibration import CALIBRATIONS
from ktae.core.credit_metrics import (
    MASS_METRICS,
    METRICS,
    OTHER,
    RIGHT,
    WRONG,
    mass_metrics,
    response_metrics,
    summarise,
    summarise_ratio,
)
from ktae.core.estimators import ADVANTAGE_ESTIMATORS
from ktae.core.needs import CALIBRATION_SCORES, group_calls, load, needs_of
from ktae.credit_audit import arith_input
from ktae.credit_audit.arith_input import check_task, run_labels, run_stop_ids
from ktae.credit_audit.inputs import AuditGroup, AuditInput
from ktae.credit_audit.progress import Phase, quiet_phase
from ktae.credit_audit.report import write_outputs
from ktae.credit_audit.sanity import SANITY_RULES, sanity_credit
from ktae.credit_audit.token_kinds import kind_codes, kind_tensor, mass_by_kind, summarise_kinds
from ktae.groups import input as group_input
from ktae.groups import sampling
from ktae.groups.credit import credit_values
from ktae.groups.input import GroupInput, load_jsonl
from ktae.rewards import math_reward
from ktae.rewards.ends import DEFAULT_CUT_OFF, check_cut_off_rule, require_end
from ktae.runs.credit import credit_method
from ktae.runs.reader import (
    load_tokenizer,
    read_run_rollouts,
    recorded_credit_name,
    run_config,
    run_tokenizer,
)
from ktae.runs.rollouts import ROLLOUTS_FILE
from ktae.tasks import EVAL_SEED, format_prompt, generate, label_response, level_of, question_of, token_labels
from ktae.viz.tokens import token_pieces

DEFAULT_PROMPTS = 200
DEFAULT_SAMPLES = 8
DEFAULT_RESAMPLES = 1000
DEFAULT_MODEL = "default"
REFERENCE = "grpo"
"""The method contamination is compared with, response by response."""
EXTRA = ("chance", "contamination_vs_grpo")
"""Figures besides :data:`METRICS` and :data:`MASS_METRICS`: the chance share of
``lowest`` and the paired difference ``contamination - GRPO's contamination`` on the same
responses."""
_NORM = "_norm"
"""Suffix of a mass figure's per-response denominator in :func:`per_response`."""
_CODES = {"w": WRONG, "r": RIGHT, ".": OTHER}


def default_methods() -> list[str]:
    """Every registered estimator and calibration (on GRPO), ``ktae+taco`` and KTAE over
    spans of 2, 3 and 4 tokens."""
    return [*ADVANTAGE_ESTIMATORS.names(), *CALIBRATIONS.names(), "ktae+taco",
            "ktae@ngram=2", "ktae@ngram=3", "ktae@ngram=4"]


def parse_methods(spec: str | Sequence[str] | None, *, ignore_token_ids=(),
                  train_config=None) -> dict:
    """``"grpo,ktae,ktae@ngram=3"`` (or a list; None: :func:`default_methods`) ->
    ``{name: Method}``; an unknown name is a ValueError naming ``credit``. With a run's
    ``train_config``, a method that is the run's own estimator or calibration keeps its
    settings (h1, alpha, the graded split, ...), as ``ktae explain`` does."""

    names = default_methods() if spec is None else (
        [n.strip() for n in spec.split(",")] if isinstance(spec, str) else list(spec))
    names = [n for n in names if n]
    if not names:
        raise ValueError("credit: expected a comma-separated list of credit methods")
    out = {}
    for name in names:
        if name in out:
            raise ValueError(f"credit: {name!r} is listed twice")
        try:
            out[name] = credit_method(name, ignore_token_ids=ignore_token_ids,
                                      train_config=train_config)
        except ValueError as err:
            text = str(err)
            raise ValueError(text if text.startswith("credit") else f"credit: {name!r}: {text}"
                             ) from None
    return out


def needs_scores(spec) -> bool:
    """The method reads per-token log-probs/entropies (a calibration, GTPO, a rule that
    declares them): :attr:`ktae.core.methods.Method.needs_scores`."""
    return spec.needs_scores


# --------------------------------------------------------------------------- labels


def embedded_labels(group, tokenizer, question: str) -> list[str]:
    """Per-token labels of each response of ``group`` (token ids) from
    :func:`ktae.tasks.label_response` on the decoded text."""

    out = []
    for ids in group.responses:
        pieces = [p.text for p in token_pieces(tokenizer, ids)]
        out.append("".join(token_labels(label_response("".join(pieces), question), pieces)))
    return out


# --------------------------------------------------------------------------- sources


def prompt_set_problems(prompts: int, prompt_set: int = 0) -> list:
    """Prompt set ``prompt_set`` of ``prompts`` held-out embedded problems: problems
    ``prompt_set * prompts .. (prompt_set + 1) * prompts - 1`` of the held-out stream
    without repeats (the one ``ktae train`` evaluates on). Set 0 is the stream's first
    ``prompts`` problems, the set every audit drew before prompt sets existed; sets of the
    same size are disjoint while the levels' question spaces last (about 1.5k distinct
    level-1 test questions)."""

    check_prompt_set(prompt_set)
    stream = generate((prompt_set + 1) * prompts, split="test", seed=EVAL_SEED)
    return stream[prompt_set * prompts:]


def check_prompt_set(prompt_set) -> None:
    if isinstance(prompt_set, bool) or not isinstance(prompt_set, int) or prompt_set < 0:
        raise ValueError(f"prompt-set: expected an integer >= 0, got {prompt_set!r}")


def sampled_input(model, tokenizer, path: str, *, prompts: int, samples: int, seed: int,
                  max_new_tokens: int, temperature: float, prompt_set: int = 0,
                  on_batch: Callable[[int], None] | None = None,
                  on_phase: Phase | None = None,
                  references: Callable[[list[float]], bool] | None = None,
                  cut_off: str = DEFAULT_CUT_OFF) -> AuditInput:
    """``prompts`` held-out embedded prompts (:func:`prompt_set_problems`) x ``samples``
    responses from ``model`` (``on_batch``: progress, as :func:`ktae.models.generate.generate_hf`
    calls it; ``references``, ``cut_off``: as
    :func:`ktae.credit_audit.arith_input.sampled_input` takes them)."""

    template = "compact" if len(tokenizer) < 1000 else "qwen-math"
    problems = prompt_set_problems(prompts, prompt_set)
    rows = [{"prompt": format_prompt(p, template), "answer": p.answer} for p in problems]
    tails, on_tail, refs = sampling.importance_references(
        tokenizer, [p.answer for p in problems], references,
        lambda gens, answer: _math_rewards(gens, answer, cut_off))
    sampled = sampling.sample_groups(model, tokenizer, rows, num_generations=samples,
                            max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
                            on_batch=on_batch, scores=temperature, tails=tails,
                            on_tail=on_tail, cut_off=cut_off)

    step = (on_phase or quiet_phase)("labelled", "groups", len(problems))
    groups = []
    for (key, g), p in zip(sampled, problems, strict=True):
        groups.append(AuditGroup(g, embedded_labels(g, tokenizer, p.question), level=p.level,
                                 key=key))
        step(1)
    group_refs = {id(a.group): refs[i] for i, a in enumerate(groups)
                  if refs.get(i) is not None and a.group.logprobs is not None}
    desc = (f"{prompts} held-out embedded prompts (prompt set {prompt_set}) x {samples} "
            f"responses sampled from {path} (temperature {temperature:g}, seed {seed}, at "
            f"most {max_new_tokens} new tokens)")
    return AuditInput(groups, tokenizer, desc, "model", references=group_refs)


def _math_rewards(gens, answer, cut_off: str = DEFAULT_CUT_OFF) -> list[float]:

    return [r.score for r in require_end([math_reward(g.text, answer) for g in gens],
                                          [g.truncated for g in gens], rule=cut_off)]


def run_input(run: Path, *, tokenizer: str | None = None, task: str | None = None,
              model: str | None = None) -> AuditInput:
    """The recorded rollouts of a ``ktae train`` run directory, every recorded step;
    ``task`` is the run's (its ``config.yaml``): an arith run's groups are labelled by
    their claims (:func:`ktae.credit_audit.arith_input.run_labels`), level = the problem's
    kind; other runs by :func:`ktae.tasks.label_response` on their embedded prompts.
    ``model`` is the run's model, the scorer when the run kept no full ``final/`` model."""

    header, records = read_run_rollouts(run)
    tok, tok_path = run_tokenizer(run, header, tokenizer)
    arith = task is not None and _is_arith(task)
    if arith:
        check_task(task)
    groups = []
    for r in records:
        prompt = r["prompt"]
        if arith:
            try:
                labels, level, prompt = run_labels(r["prompt"], r["responses"], tok,
                                                   run_stop_ids(header, tok))
            except ValueError as err:
                raise ValueError(f"INPUT: {run / ROLLOUTS_FILE}: {str(err)[len('INPUT: '):]}"
                                 ) from None
        else:
            question = question_of(r["prompt"])
            if question is None:
                raise ValueError(f"INPUT: {run / ROLLOUTS_FILE}: prompt {r['prompt']!r} is not "
                                 "an embedded-task prompt, so its responses cannot be labelled; "
                                 "audit a JSONL of groups with 'wrong' spans instead")
        g = GroupInput(prompt=prompt, responses=r["responses"], rewards=r["rewards"],
                       correct=r["correct"], label=f"step {r['step']} group {r['group']}",
                       logprobs=r.get("logprobs"), entropies=r.get("entropies"),
                       old_entropies=r.get("old_entropies"),
                       input_grad_importance=r.get("input_grad_importance"),
                       teacher_logprobs=r.get("teacher_logprobs"))
        if not arith:
            labels, level = embedded_labels(g, tok, question), level_of(question)
        groups.append(AuditGroup(g, labels, level=level, step=int(r["step"]),
                                 key=f"{r['step']}:{r['group']}"))
    steps = sorted({g.step for g in groups})
    trained = recorded_credit_name(header)
    final = run / "final"
    scorer = str(final) if (final / "config.json").is_file() else model
    desc = (f"run {run} (trained with {trained}): {len(groups)} recorded groups at steps "
            f"{', '.join(map(str, steps))}")
    meta = [f"tokenizer: {tok_path}"]
    if arith:
        desc += f"; task {task}, labelled by their claims"
        meta.append("labels: ktae.tasks.claims.claim_token_labels")
    return AuditInput(groups, tok, desc, "run", scorer=scorer, meta=meta)


def _is_arith(task: str) -> bool:
    return task == "arith" or task.startswith("arith@")


def jsonl_input(path: Path, tokenizer) -> AuditInput:
    """Groups with user-given ``wrong`` spans (see the module docstring), read by
    :func:`ktae.groups.input.load_jsonl`."""

    loaded = load_jsonl(path, tokenizer=tokenizer)
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()
               if line.strip()]  # the same lines, in order (load_jsonl checked them)
    groups = []
    for (key, g), rec in zip(loaded, records, strict=True):
        where = f"INPUT: {path} {g.label}"
        if g.labels is None:
            raise ValueError(f"{where}: expected 'wrong': per response a list of [start, end] "
                             "character spans that are locally wrong ([] when none is)")
        labels = []
        for i, (chars, ids) in enumerate(zip(g.labels, g.responses, strict=True)):
            pieces = [p.text for p in token_pieces(tokenizer, ids)]
            if sum(map(len, pieces)) != len(chars):
                raise ValueError(f"{where} response {i}: the tokenizer does not decode the "
                                 "response back to its text, so character spans cannot be "
                                 "mapped to tokens")
            labels.append("".join(token_labels(chars, pieces)))
        groups.append(AuditGroup(g, labels, level=rec.get("level"), key=key))
    return AuditInput(groups, tokenizer, f"{len(groups)} groups from {path}", "jsonl")


# --------------------------------------------------------------------------- audit


def _label_tensor(labels: list[str], T: int) -> torch.Tensor:
    out = torch.full((len(labels), T), OTHER, dtype=torch.int8)
    for i, row in enumerate(labels):
        if row:
            out[i, :len(row)] = torch.tensor([_CODES[c] for c in row], dtype=torch.int8)
    return out


def _batches(groups: list[AuditGroup]) -> list[list[int]]:
    """Indices of the groups computed together: one batch per recorded step."""
    steps: dict = {}
    for i, g in enumerate(groups):
        steps.setdefault(g.step, []).append(i)
    return list(steps.values())


@dataclass
class _Batch:
    """What every method's figures on one batch share, computed once: the labels, the
    reference's (GRPO's) credit and the token kinds."""

    index: list[int]
    labels: torch.Tensor
    mask: torch.Tensor
    correct: torch.Tensor
    group: torch.Tensor
    reference: torch.Tensor | None
    kinds: torch.Tensor | None


def _credit(chosen: list[AuditGroup], spec):

    values = credit_values([g.group for g in chosen], spec)
    return torch.where(values.in_loss & values.mask, values.final.double(), 0.0), values


def _prepare(groups: list[AuditGroup], reference=None) -> list[_Batch]:

    out = []
    for batch in _batches(groups):
        chosen = [groups[i] for i in batch]
        ref, values = _credit(chosen, reference if reference is not None
                              else parse_methods(REFERENCE)[REFERENCE])
        T = values.mask.shape[1]
        kinds = None
        if all(g.kinds is not None for g in chosen):
            kinds = kind_tensor([row for g in chosen for row in g.kinds], T)
        out.append(_Batch(batch, _label_tensor([row for g in chosen for row in g.labels], T),
                          values.mask, values.correct, values.group,
                          ref if reference is not None else None, kinds))
    return out


RANDOM_DRAWS = 64
"""Independent draws of the ``random`` sanity rule: each response's figures are their mean
over the draws, and the rule's intervals resample the draws with the groups."""
DRAWS = "draws"
"""Key of a rule's per-draw figures in :func:`per_response`'s result."""


def _response_part(credit: torch.Tensor, b: _Batch) -> dict[str, np.ndarray]:
    """One credit's per-response figures on batch ``b`` (see :func:`per_response`)."""

    m = response_metrics(credit, b.labels, b.mask, b.correct, b.group)
    part = {k: getattr(m, k).numpy() for k in (*METRICS, "chance")}
    if b.reference is not None:
        mass = mass_metrics(credit, b.reference, b.labels, b.mask, b.correct, b.group)
        for k in MASS_METRICS:
            num, den = mass.ratio(k)
            part[k], part[k + _NORM] = num.numpy(), den.numpy()
    if b.kinds is not None:
        negative, positive = mass_by_kind(torch.where(b.mask, credit, 0.0), b.kinds)
        part["kind_negative"], part["kind_positive"] = negative.numpy(), positive.numpy()
        ones = torch.where(b.mask, 1.0, 0.0).double()
        part["kind_tokens"] = mass_by_kind(ones, b.kinds)[1].numpy()
    return part


def per_response(groups: list[AuditGroup], spec, reference=None, *,
                 batches: list[_Batch] | None = None, sanity_seed: int = 0
                 ) -> dict[str, np.ndarray]:
    """Per-response figures of one method over ``groups`` (NaN where undefined), with
    each response's group index, level and step; with ``reference`` (a method's spec,
    GRPO in the audit) also the terms of the mass figures against its credit
    (:func:`ktae.core.credit_metrics.mass_metrics`). ``spec`` may be the name of a
    sanity rule (:mod:`ktae.credit_audit.sanity`, which needs ``reference``; ``random``
    draws from ``sanity_seed``). ``batches``: what :func:`audit_groups` prepared once for
    every method (labels, the reference's credit, the token kinds); with token kinds,
    also each response's negative and positive credit per kind
    (:mod:`ktae.credit_audit.token_kinds`)."""

    if batches is None:
        batches = _prepare(groups, reference)
    generator = torch.Generator().manual_seed(sanity_seed)
    parts = []
    for b in batches:
        draws = []
        for _ in range(RANDOM_DRAWS if spec == "random" else 1):
            if isinstance(spec, str):
                if b.reference is None:
                    raise ValueError(f"credit: the sanity rule {spec!r} needs the reference's "
                                     "credit")
                credit = sanity_credit(spec, b.labels, b.mask, b.reference, generator=generator)
            else:
                credit, _ = _credit([groups[i] for i in b.index], spec)
            draws.append(_response_part(credit, b))
        # the random rule: each response's figures are their mean over the draws (the
        # rule's expectation), and every draw is kept for the interval (DRAWS)
        part = {k: np.mean([d[k] for d in draws], axis=0) for k in draws[0]}
        if len(draws) > 1:
            part[DRAWS] = {k: np.stack([d[k] for d in draws]) for k in draws[0]}
        part["group"] = torch.tensor(b.index)[b.group].numpy()
        parts.append(part)
    out = {k: np.concatenate([p[k] for p in parts]) for k in parts[0] if k != DRAWS}
    order = np.argsort(out["group"], kind="stable")
    out = {k: v[order] for k, v in out.items()}
    if DRAWS in parts[0]:
        out[DRAWS] = {k: np.concatenate([p[DRAWS][k] for p in parts], axis=1)[:, order]
                      for k in parts[0][DRAWS]}
    return out


def _by_draw(values: dict, keep: np.ndarray, reference: dict) -> tuple[dict, np.ndarray, int]:
    """A rule's per-response figures with one row per (draw, response), each draw's groups
    counted apart (so that the bootstrap over groups also resamples the draws), and
    ``keep`` repeated to match; the figures unchanged when the rule has no draws."""
    if DRAWS not in values:
        return values, keep, 1
    draws = values[DRAWS]
    R = next(iter(draws.values())).shape[0]
    G = int(values["group"].max()) + 1
    out = {k: v.reshape(-1) for k, v in draws.items()}
    out["group"] = (np.arange(R)[:, None] * G + values["group"][None, :]).reshape(-1)
    out["contamination_vs_grpo"] = (draws["contamination"]
                                    - reference["contamination"][None, :]).reshape(-1)
    return out, np.tile(keep, R), R


def check_groups(groups: list[AuditGroup]) -> None:
    """ValueError when no group can be audited (a mixed group with a labelled wrong token
    in a wrong answer, or in a right answer)."""
    if not groups:
        raise ValueError("INPUT: no groups to audit")
    for g in groups:
        lengths = [len(r) for r in g.group.responses]
        if [len(x) for x in g.labels] != lengths:
            raise ValueError(f"labels: group {g.key or g.group.label!r} has labels of "
                             f"{[len(x) for x in g.labels]} tokens for responses of {lengths}")
    for g in groups:
        correct = g.group.correct or [r > 0 for r in g.group.rewards]
        if any(correct) and not all(correct) and any("w" in row for row in g.labels):
            return
    raise ValueError("INPUT: no mixed group (right and wrong answers in one group) holds a "
                     "locally wrong token, so no credit can be audited; sample more prompts "
                     "or responses")


def audit_groups(groups: list[AuditGroup], methods: dict, *, resamples: int = DEFAULT_RESAMPLES,
                 seed: int = 0, on_phase: Phase | None = None) -> dict:
    """Every method's figures: ``{"methods": {name: {"all": {figure: summary},
    "levels": {level: {...}}, "steps": {step: {...}}}}, "sanity_rules": {rule: the
    same}, "levels": [...], "steps": [...]}`` with the figures :data:`METRICS`,
    :data:`EXTRA` and :data:`MASS_METRICS` (summaries as
    :func:`ktae.core.credit_metrics.summarise` and ``summarise_ratio``). The sanity
    rules (:mod:`ktae.credit_audit.sanity`) are scored as the methods are, on the same
    responses, as reference rows. When every group carries token kinds, also
    ``"credit_by_kind"``: per method and rule the shares of its negative and positive
    credit by kind of token (:mod:`ktae.credit_audit.token_kinds`). ``on_phase``:
    progress of the credit and of the bootstrap (:mod:`ktae.credit_audit.progress`)."""

    on_phase = on_phase or quiet_phase
    check_groups(groups)
    levels = sorted({g.level for g in groups if g.level is not None}, key=str)
    steps = sorted({g.step for g in groups if g.step is not None})
    result: dict = {"methods": {}, "sanity_rules": {}, "levels": [str(x) for x in levels],
                    "steps": steps}

    def summaries(values: dict, keep: np.ndarray) -> dict:
        values, keep, draws = _by_draw(values, keep, reference)
        out = {k: summarise(np.where(keep, values[k], np.nan), values["group"],
                            resamples=resamples, seed=seed) for k in (*METRICS, *EXTRA)}
        for k in MASS_METRICS:
            out[k] = summarise_ratio(np.where(keep, values[k], np.nan), values[k + _NORM],
                                     values["group"], resamples=resamples, seed=seed)
        for figure in out.values():  # counts of responses and groups, not of draws
            figure["responses"] //= draws
            figure["groups"] //= draws
        return out

    grpo = parse_methods(REFERENCE)[REFERENCE]
    batches = _prepare(groups, grpo)
    rows = [*((n, "methods", s) for n, s in methods.items()),
            *((n, "sanity_rules", n) for n in SANITY_RULES)]
    step = on_phase("computed", "credit methods and sanity rules", len(rows))
    values = {}
    for name, where, spec in rows:
        values[where, name] = per_response(groups, spec, grpo, batches=batches,
                                           sanity_seed=seed)
        step(1)
    reference = values.get(("methods", REFERENCE)) or per_response(groups, grpo, grpo,
                                                                   batches=batches)
    first = next(iter(values.values()))
    level = np.array([str(groups[i].level) for i in first["group"]])
    at = np.array([groups[i].step if groups[i].step is not None else -1
                   for i in first["group"]])
    every = np.ones(len(level), dtype=bool)
    step = on_phase("summarised", f"credit methods and sanity rules ({resamples} bootstrap "
                    "draws per interval)", len(rows))
    by_kind: dict = {}
    for (where, name), v in values.items():
        # paired with GRPO on the same response (NaN where either is undefined)
        v["contamination_vs_grpo"] = v["contamination"] - reference["contamination"]
        result[where][name] = {
            "all": summaries(v, every),
            "levels": {str(lv): summaries(v, level == str(lv)) for lv in levels},
            "steps": {str(s): summaries(v, at == s) for s in steps}}
        if "kind_negative" in v:
            by_kind[name] = summarise_kinds(v["kind_negative"], v["kind_positive"],
                                            v["kind_tokens"], ~np.isnan(v["blame"]))
        step(1)
    if by_kind:
        result["credit_by_kind"] = by_kind
    return result


def audit(input=None, *, model: str | None = None, credit=None, prompts: int = DEFAULT_PROMPTS,
          samples: int = DEFAULT_SAMPLES, seed: int = 0, max_new_tokens: int | None = None,
          temperature: float | None = None, tokenizer: str | None = None,
          resamples: int = DEFAULT_RESAMPLES, threads: int | None = None,
          output_dir: str | Path | None = None, prompt_set: int = 0, task: str | None = None,
          announce: Callable[[str], None] | None = None,
          on_batch: Callable[[int], None] | None = None,
          on_phase: Phase | None = None, cut_off: str = DEFAULT_CUT_OFF) -> dict:
    """Audit credit methods on labelled groups (see the module docstring); what
    ``ktae audit`` computes, as the ``audit.json`` dictionary.

    Args:
        input: a ``ktae train`` run directory or a JSONL file of labelled groups; None
            samples from ``model``.
        model: model to sample from (no ``input``) or to score responses with for the
            methods that read log-probs/entropies; ``"default"`` is the shipped model.
        credit: comma list (or list) of credit methods; None: :func:`default_methods`.
        prompts, samples, seed, max_new_tokens, temperature: the sampling (no ``input``);
            ``max_new_tokens`` None: 40 for a character-level tokenizer, 64 on the arith
            task, 256 for the embedded task with another tokenizer; ``temperature`` None:
            0.7 on the arith task (the recipe's), else 1 (also the scoring temperature; a
            run directory: its own).
        tokenizer: tokenizer directory for a JSONL input (default: the model's).
        resamples: bootstrap draws of every interval (0: none).
        threads: torch CPU threads (None: unchanged).
        output_dir: also write ``audit.md``, ``audit.json`` and the PNGs there.
        prompt_set: which held-out prompts are sampled (no ``input``;
            :func:`prompt_set_problems`; 0, the default, is the set of every earlier
            audit), so that a study can hold a set aside. Recorded as ``prompt_set``
            (None for a run directory or JSONL input).
        task: what ``model`` is sampled on (no ``input``): ``embedded`` or ``arith``
            / ``arith@difficulty=N`` (:mod:`ktae.credit_audit.arith_input`); None: the
            embedded task for a character-level tokenizer, else ``arith@difficulty=1``.
        announce: called once with a line saying what is sampled, before sampling.
        on_batch: called with the number of prompts after each sampled batch (progress).
        on_phase: the progress of every phase after sampling (labelling, scoring, each
            method's credit, the bootstrap; :mod:`ktae.credit_audit.progress`).
        cut_off: how a sampled response cut at ``max_new_tokens`` is scored: ``"wrong"``
            (never a right answer), or ``"read"`` from its text (:mod:`ktae.rewards.ends`).
            Recorded as ``cut_off_answers`` (None for a run directory or JSONL input, whose
            correctness is recorded).

    Raises:
        ValueError: bad arguments or input (one line naming what was expected).
    """
    _check_audit_arguments(input=input, model=model, prompts=prompts, samples=samples,
                           resamples=resamples, temperature=temperature,
                           max_new_tokens=max_new_tokens, prompt_set=prompt_set,
                           cut_off=cut_off, task=task)
    if threads is not None:
        torch.set_num_threads(threads)
    methods = parse_methods(credit)
    clock = _Clock()
    path = None if input is None else Path(input)
    if path is not None and path.is_dir():
        source = _read_run_dir(path, credit, methods, tokenizer=tokenizer,
                               temperature=temperature)
    elif path is not None:
        tok = load_tokenizer(tokenizer or sampling.model_tokenizer_path(model))
        source = _Source(jsonl_input(path, tok), methods, temperature)
    else:
        source = _sample_from_model(
            model, methods, clock, task=task, prompts=prompts, samples=samples, seed=seed,
            max_new_tokens=max_new_tokens, temperature=temperature, prompt_set=prompt_set,
            cut_off=cut_off, announce=announce, on_batch=on_batch, on_phase=on_phase)
    clock.lap("sampling" if path is None else "reading")
    data = source.data
    ignore = group_input.ignore_ids(data.tokenizer)
    methods = {n: _with_ignore(s, ignore) for n, s in source.methods.items()}
    check_groups(data.groups)
    scored = _score_missing_needs(source, methods, model, clock, on_phase=on_phase)
    result, result_rates = _credit_figures(data, methods, resamples=resamples,
                                           on_phase=on_phase)
    clock.lap("credit and bootstrap")
    result.update(seconds=clock.seconds, cpu_seconds=clock.cpu_seconds,
                  input=data.description, kind=data.kind, scored_with=scored,
                  prompt_set=prompt_set if data.kind == "model" else None,
                  cut_off_answers=cut_off if data.kind == "model" else None,
                  resamples=resamples, counts=_counts(data.groups), meta=data.meta,
                  credit={n: _describe(s) for n, s in methods.items()},
                  right_answer_wrong_tokens=result_rates)
    if output_dir is not None:
        result["files"] = write_outputs(result, Path(output_dir))
    return result


def _check_audit_arguments(*, input, model, prompts, samples, resamples, temperature,
                           max_new_tokens, prompt_set, cut_off, task) -> None:
    """The one-line errors of :func:`audit`'s arguments, before anything is read."""
    check_arguments(input=input, model=model, prompts=prompts, samples=samples,
                    resamples=resamples, temperature=temperature, max_new_tokens=max_new_tokens)
    check_prompt_set(prompt_set)
    check_cut_off_rule(cut_off, "cut_off")
    if task is not None:
        if input is not None:
            raise ValueError("task: only when sampling from --model with no INPUT (a run "
                             "directory's config.yaml names its task)")
        arith_input.check_task(task)


@dataclass
class _Source:
    """The audited groups and what reading or sampling them settled."""

    data: AuditInput
    methods: dict
    """The methods, with a run directory's own settings where it has them."""
    temperature: float | None
    """The scoring temperature (None: 1)."""
    loaded: tuple | None = None
    """``(model, tokenizer, where)`` when a model was loaded to sample the groups."""


def _read_run_dir(path: Path, credit, methods: dict, *, tokenizer: str | None,
                  temperature: float | None) -> _Source:
    """The groups of a ``ktae train`` run directory, with its own method settings and
    temperature where its ``config.yaml`` gives them."""
    run_settings = run_config(path)
    data = run_input(path, tokenizer=tokenizer,
                     task=None if run_settings is None else run_settings.task,
                     model=None if run_settings is None else run_settings.model)
    if run_settings is not None:  # the run's own settings for its methods
        methods = parse_methods(credit, train_config=run_settings)
        if temperature is None:
            temperature = run_settings.temperature
    return _Source(data, methods, temperature)


@dataclass(frozen=True)
class _SamplingPlan:
    """What the audit samples from a model when it has no INPUT."""

    model: str
    task: str
    difficulty: int | None
    """The arith task's difficulty; None: the embedded task."""
    prompts: int
    samples: int
    seed: int
    max_new_tokens: int
    temperature: float
    prompt_set: int

    def announcement(self) -> str:
        """The line that says what is sampled (before sampling)."""
        what = ("embedded held-out prompts" if self.difficulty is None else
                f"{self.task} problems ({arith_input.SPLIT} split, chat template, reward "
                "number, claims labels)")
        return (f"ktae audit: sampling {self.prompts} prompts x {self.samples} responses from "
                f"{self.model} on {what}, prompt set {self.prompt_set}, seed "
                f"{self.seed}, temperature {self.temperature:g}, at most "
                f"{self.max_new_tokens} new tokens "
                f"(budget: {self.prompts * self.samples * self.max_new_tokens} new tokens)")


def _sampling_plan(tok, model: str | None, *, task: str | None, max_new_tokens: int | None,
                   temperature: float | None, prompts: int, samples: int, seed: int,
                   prompt_set: int) -> _SamplingPlan:
    """The task, budget and temperature to sample with: the ones given, else the
    defaults for the model's tokenizer ``tok`` and the task (see :func:`audit`)."""
    char_level = len(tok) < 1000
    task = task or ("embedded" if char_level else arith_input.DEFAULT_TASK)
    difficulty = arith_input.check_task(task)
    if difficulty is None:
        max_new = max_new_tokens or (40 if char_level else 256)
        temperature = 1.0 if temperature is None else temperature
    else:
        max_new = max_new_tokens or arith_input.DEFAULT_MAX_NEW_TOKENS
        if temperature is None:
            temperature = arith_input.DEFAULT_TEMPERATURE
    return _SamplingPlan(model or DEFAULT_MODEL, task, difficulty, prompts, samples, seed,
                         max_new, temperature, prompt_set)


def _sample_from_model(model: str | None, methods: dict, clock: _Clock, *, task, prompts,
                       samples, seed, max_new_tokens, temperature, prompt_set, cut_off,
                       announce, on_batch, on_phase) -> _Source:
    """Load ``model`` and sample the audited groups from it (:func:`_sampling_plan`)."""
    loaded = sampling.load_model(model or DEFAULT_MODEL)
    clock.lap("loading")
    m, tok, where = loaded
    plan = _sampling_plan(tok, model, task=task, max_new_tokens=max_new_tokens,
                          temperature=temperature, prompts=prompts, samples=samples,
                          seed=seed, prompt_set=prompt_set)
    if announce is not None:
        announce(plan.announcement())
    # a need beyond the plain scoring (the importance) reads its clean pass from the
    # sampling's cache
    grad = [s for s in methods.values() if any(n.group_options for n in s.model_needs)]
    reads = _reads_importance(grad)
    refs = (lambda r: reads(_Rewards(r))) if grad else None
    common = dict(prompts=prompts, samples=samples, seed=seed,
                  max_new_tokens=plan.max_new_tokens, temperature=plan.temperature,
                  prompt_set=prompt_set, on_batch=on_batch, on_phase=on_phase,
                  references=refs, cut_off=cut_off)
    if plan.difficulty is None:
        data = sampled_input(m, tok, where, **common)
    else:
        data = arith_input.sampled_input(m, tok, where, difficulty=plan.difficulty, **common)
    return _Source(data, methods, plan.temperature, loaded)


def _score_missing_needs(source: _Source, methods: dict, model: str | None, clock: _Clock,
                         *, on_phase: Phase | None) -> str:
    """Score what the methods read and the groups do not hold (loading a model if none
    is loaded yet); returns what scored them (``"recorded"``: nothing needed)."""
    data = source.data
    todo = _todo_needs(methods.values(), [g.group for g in data.groups])
    if not todo:
        return "recorded"
    loaded = source.loaded
    if loaded is None:
        loaded = sampling.load_model(model or data.scorer or DEFAULT_MODEL)
        clock.lap("loading")
    _score(loaded[0], data, methods, todo,
           temperature=1.0 if source.temperature is None else source.temperature,
           on_phase=on_phase or quiet_phase)
    clock.lap("scoring")
    return loaded[2]


def _credit_figures(data: AuditInput, methods: dict, *, resamples: int,
                    on_phase: Phase | None) -> tuple[dict, dict]:
    """``(figures per method, right answers with wrong tokens)``: each token's kind
    labelled, then every method's credit measured with its bootstrap intervals."""
    for g in data.groups:
        g.kinds = kind_codes(data.tokenizer, g.group.responses, g.labels)
    result = audit_groups(data.groups, methods, resamples=resamples, seed=0,
                          on_phase=on_phase)
    return result, right_answer_wrong_tokens(data.groups, resamples=resamples)


def _todo_needs(specs, inputs) -> list:
    """The needs from a model (:mod:`ktae.core.needs`) that some method of ``specs`` reads
    and not every group holds: each estimator's own, and a calibration's log-probs and
    entropies of the current policy."""

    out = []
    for spec in specs:
        wanted = [*spec.model_needs,
                  *(needs_of(CALIBRATION_SCORES) if spec.calibration is not None else ())]
        out += [n for n in wanted if n not in out and not _held(inputs, n)]
    return out


def _held(groups, need) -> bool:
    """Whether every group holds ``need`` on every response, in one of its fields."""
    return any(all(getattr(g, f, None) is not None
                   and all(r is not None for r in getattr(g, f)) for g in groups)
               for f in need.fields)


def _teacher_options(methods: dict) -> dict:
    """The ``teacher_*`` options of the audited methods that read the self-teacher pass
    (one pass serves them all, so they must agree)."""
    chosen: dict | None = None
    for name, spec in methods.items():
        if not any(n.name == "teacher_logprobs" for n in spec.model_needs):
            continue
        mine = {k: v for k, v in spec.estimator_options.items() if k.startswith("teacher_")}
        if chosen is not None and mine != chosen:
            raise ValueError(f"credit: {name} sets the self-teacher's options {mine}, another "
                             f"method {chosen}; audit them separately")
        chosen = mine
    return chosen or {}


def _score(model, data: AuditInput, methods: dict, todo: list, *, temperature: float,
           on_phase: Phase) -> None:
    """Fill the groups' needs ``todo`` under ``model``: each group provider called once
    (:func:`ktae.core.needs.group_calls`), with the audit's progress and, where the
    provider takes them, which groups' credit reads each need (:func:`_reads`) and the
    references read from the sampling's cache."""
    inputs = [g.group for g in data.groups]
    for provider, options in group_calls(todo).items():
        fn = load(provider)
        mine = [n for n in todo if n.group_provider == provider]
        costly = [n for n in mine if n.group_options]  # a pass beyond the plain scoring
        readers = [name for name, s in methods.items() if any(n in s.model_needs
                                                             for n in costly)]
        reads = _reads([methods[name] for name in readers], costly)
        read = sum(reads(g) for g in inputs) if costly else len(inputs)
        cached = costly and all(id(g) in data.references for g in inputs if reads(g))
        unscored = any(g.logprobs is None for g in inputs)
        if costly:
            passes = ("a forward and backward pass each, the clean pass read from the "
                      "sampling's cache" if cached else "a forward pass, then a forward and "
                      "backward pass, each")
            what = (f"groups ({', '.join(n.what.split(' (')[0] for n in costly)}, for "
                    f"{', '.join(readers)}, of the {read} of {len(inputs)} groups whose credit "
                    f"reads it; {'with log-probs and entropies; ' if unscored else ''}{passes})")
        else:
            names = (n.name.replace("logprobs", "log-probs") for n in mine)
            what = f"groups ({' and '.join(names)})"
        step = on_phase("scored", what, read)
        extra = {"on_group": lambda _phase, step=step: step(1), "reads_importance": reads,
                 "references": data.references, "teacher_options": _teacher_options(methods)}
        takes = inspect.signature(fn).parameters
        fn(model, data.tokenizer, inputs, temperature=temperature, **options,
           **{k: v for k, v in extra.items() if k in takes})


def _reads(specs, needs) -> Callable:
    """``reads(group)``: whether the credit of any of ``specs`` reads the group's ``needs``;
    an estimator may say where it does not (``reads_need(need, rewards, **options)`` on its
    function: OAR-G's importance, not where every base advantage is 0), else it reads
    every group's."""
    rules = []
    for spec in specs:
        rule = getattr(ADVANTAGE_ESTIMATORS.get(spec.estimator), "reads_need", None)
        if rule is None:
            return lambda g: True
        rules.append((rule, dict(spec.estimator_options)))
    return lambda g: any(rule(n.name, g.rewards, **options) for rule, options in rules
                         for n in needs)


@dataclass
class _Rewards:
    """A group's rewards alone, as :func:`_reads`' rules read a group."""

    rewards: list[float]


class _Clock:
    """Wall-clock and CPU seconds of the audit's phases, in order (``seconds``,
    ``cpu_seconds``: ``{phase: s}``; the model's loading counts in the phase that loads it).
    The CPU seconds are this process's (every thread's): on a shared machine they hold
    where the wall clock moves with the other work."""

    def __init__(self):
        import time

        self._now, self._cpu = time.monotonic, time.process_time
        self._last, self._last_cpu = self._now(), self._cpu()
        self.seconds: dict[str, float] = {}
        self.cpu_seconds: dict[str, float] = {}

    def lap(self, phase: str) -> None:
        now, cpu = self._now(), self._cpu()
        self.seconds[phase] = round(now - self._last, 3)
        self.cpu_seconds[phase] = round(cpu - self._last_cpu, 3)
        self._last, self._last_cpu = now, cpu


def _reads_importance(specs) -> Callable:
    """``reads(group)``: whether the credit of any of ``specs`` reads the group's
    model-computed needs (:func:`_reads` over their needs)."""
    needs = [n for s in specs for n in s.model_needs]
    return _reads(specs, needs)


def right_answer_wrong_tokens(groups: list[AuditGroup], *, resamples: int = DEFAULT_RESAMPLES,
                              seed: int = 0) -> dict:
    """The share of right answers that hold a locally wrong token (on the arith task: a
    false claim), over every right answer (mixed groups or not), with its bootstrap 95%
    interval over groups (:func:`ktae.core.credit_metrics.summarise`): ``{"all":
    summary, "levels": {level: summary}, "steps": {step: summary}}``."""
    values, group, level, step = [], [], [], []
    for k, g in enumerate(groups):
        correct = g.group.correct or [r > 0 for r in g.group.rewards]
        for row, c in zip(g.labels, correct, strict=True):
            values.append(float("w" in row) if c else np.nan)
            group.append(k)
            level.append(str(g.level))
            step.append(g.step if g.step is not None else -1)
    values, group = np.array(values, dtype=np.float64), np.array(group)
    level, step = np.array(level), np.array(step)

    def of(keep):
        return summarise(np.where(keep, values, np.nan), group, resamples=resamples, seed=seed)

    levels = sorted({str(g.level) for g in groups if g.level is not None})
    steps = sorted({g.step for g in groups if g.step is not None})
    return {"all": of(np.ones(len(values), dtype=bool)),
            "levels": {lv: of(level == lv) for lv in levels},
            "steps": {str(s): of(step == s) for s in steps}}


def _with_ignore(spec, ignore):
    import dataclasses

    return dataclasses.replace(spec, ignore_token_ids=tuple(ignore))


def _describe(spec) -> str:
    return spec.describe()


def _counts(groups: list[AuditGroup]) -> dict:
    responses = [(row, c) for g in groups for row, c in zip(
        g.labels, g.group.correct or [r > 0 for r in g.group.rewards], strict=True)]
    mixed = with_right = taught = 0
    for g in groups:
        correct = g.group.correct or [r > 0 for r in g.group.rewards]
        mixed += bool(any(correct) and not all(correct))
        with_right += any(correct)
        # a self-teacher (teacher_source=group) needs a right response other than its own
        taught += sum(sum(correct) - c > 0 for c in correct)
    return {"groups": len(groups), "mixed_groups": mixed, "groups_with_right_answer": with_right,
            "responses_with_teacher": taught, "responses": len(responses),
            "wrong_answers": sum(not c for _, c in responses),
            "responses_with_wrong_tokens": sum("w" in row for row, _ in responses),
            "right_answers_with_wrong_tokens": sum("w" in row and c for row, c in responses),
            "tokens": {"wrong": sum(r.count("w") for r, _ in responses),
                       "right": sum(r.count("r") for r, _ in responses),
                       "other": sum(r.count(".") for r, _ in responses)}}


def check_arguments(*, input, model, prompts, samples, resamples, temperature,
                    max_new_tokens) -> None:
    """The one-line errors of bad arguments (before any model loads)."""
    for name, value, low in (("prompts", prompts, 1), ("samples", samples, 2),
                             ("resamples", resamples, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name}: expected an integer >= {low}, got {value!r}")
    if max_new_tokens is not None and (not isinstance(max_new_tokens, int) or max_new_tokens < 1):
        raise ValueError(f"max-new-tokens: expected a positive integer, got {max_new_tokens!r}")
    if temperature is not None and not (isinstance(temperature, (int, float)) and temperature > 0):
        raise ValueError(f"temperature: expected > 0, got {temperature!r}")
    if input is not None and not Path(input).exists():
        raise ValueError(f"INPUT: no such file or directory: {input}")
    if input is None and model is None:
        raise ValueError("INPUT: give a run directory or a JSONL file of labelled groups, or "
                         "--model (e.g. --model default) to sample responses")
