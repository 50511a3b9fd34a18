"""``ktae audit`` on a real chat model: the ``arith`` word problems, labelled by their claims.

A real model (a tokenizer of 1,000 tokens or more, such as ``smollm2-135m``) is audited on
the task the credit study trains it on (:mod:`ktae.tasks.arith` at level 1,
``configs/smollm2-arith.yaml``):

* prompts: ``--prompts`` problems of the arith ``eval`` split (never trained on; ``ktae
  train`` draws from ``train`` and evaluates on ``test``), drawn with
  :data:`ktae.tasks.arith.EVAL_SEED` at the task's difficulty; prompt set ``K`` is problems
  ``K*P .. (K+1)*P - 1`` of that stream (:func:`prompt_set_problems`), so sets of one size
  are disjoint;
* rendered as the user message of the model's chat template (the question and
  :data:`ktae.tasks.arith.INSTRUCTION`), as ``ktae train --template chat`` renders them;
* sampled at that configuration's temperature (0.7) with at most 64 new tokens, scored by the
  ``number`` reward (the last number of the response equals the answer,
  :func:`ktae.rewards.answer_line.number_check`);
* labelled per token by the claims labeller (:func:`ktae.tasks.claims.claim_token_labels`,
  docs/claims.md): the result tokens of a false claim are wrong, those of a true claim
  right, every other token not labelled; a response that ran out of the budget (no
  end-of-sequence token) is labelled as cut off, so a claim its end leaves open
  (``6 * 6 = 3`` where the budget stopped ``36``) is not labelled.

The recorded rollouts of a ``ktae train`` run on the arith task are labelled the same way
(:func:`run_labels`): the question is read back from the recorded prompt
(:func:`ktae.tasks.arith.problem_in`) and its answer recomputed; a recorded response is cut
off when its last token is not one of the run's stop tokens (:func:`cut_off_rows`).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

from ktae.credit_audit.inputs import AuditGroup, AuditInput
from ktae.credit_audit.progress import quiet_phase
from ktae.groups.input import GroupInput
from ktae.groups.sampling import generation_scores, importance_references
from ktae.models.generate import SamplingConfig, generate_hf
from ktae.rewards.answer_line import number_check
from ktae.rewards.ends import DEFAULT_CUT_OFF, counts_as_right
from ktae.tasks import arith
from ktae.tasks.arith import parse_task_name, problem_in, user_message
from ktae.tasks.claims import claim_token_labels

DEFAULT_TASK = "arith@difficulty=1"
"""The task a real model is audited on by default: the credit study's (configs/smollm2-arith.yaml)."""
DEFAULT_MAX_NEW_TOKENS = 64
"""The recipe's response budget (its responses are a worked line and the number)."""
DEFAULT_TEMPERATURE = 0.7
"""The recipe's sampling temperature."""
SPLIT = "eval"
"""The split the audit prompts come from: never trained on."""
SEQUENCES_PER_BATCH = 32
"""Sequences (prompts x samples) per ``generate`` call: one progress line each."""


def check_task(task: str) -> int | None:
    """The arith difficulty of ``task`` (None for ``embedded``); a one-line ValueError
    naming ``task`` otherwise."""

    if task == "embedded":
        return None
    if not isinstance(task, str):
        raise ValueError(f"task: expected embedded, arith or arith@difficulty=0|1|2|3, got {task!r}")
    difficulty = parse_task_name(task)
    if difficulty is None:
        raise ValueError(f"task: expected embedded, arith or arith@difficulty=0|1|2|3, got {task!r}")
    return difficulty


def prompt_set_problems(prompts: int, prompt_set: int, difficulty: int) -> list:
    """Prompt set ``prompt_set``: problems ``prompt_set * prompts .. (prompt_set + 1) *
    prompts - 1`` of the arith ``eval`` stream at ``difficulty`` (seed
    :data:`ktae.tasks.arith.EVAL_SEED`, distinct while the split lasts)."""

    stream = arith.generate((prompt_set + 1) * prompts, split=SPLIT, seed=arith.EVAL_SEED,
                            difficulty=difficulty, repeats=True)
    return stream[prompt_set * prompts:]


def repeated_problems(problems: list, prompts: int) -> int:
    """How many problems of the last ``prompts`` of ``problems`` (a prompt-set stream from
    its start) repeat the arithmetic (kind and operands) of an earlier one: 0 while the
    split lasts; at difficulty 1 the ``eval`` split holds 115 distinct problems, so
    larger or later sets repeat them (in other wordings)."""
    seen, repeats = set(), 0
    for k, p in enumerate(problems):
        key = (p.kind, p.operands)
        repeats += key in seen and k >= len(problems) - prompts
        seen.add(key)
    return repeats


def chat_prompt(tokenizer, problem) -> str:
    """The prompt of ``problem`` (an arith problem or question) as ``ktae train --template
    chat`` renders it: the user message of the tokenizer's chat template."""

    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("model: the arith task needs a tokenizer with a chat template "
                         "(a chat model such as smollm2-135m)")
    return tokenizer.apply_chat_template([{"role": "user", "content": user_message(problem)}],
                                         tokenize=False, add_generation_prompt=True)


def claims_labels(tokenizer, responses, answer, cut_off=None) -> list[str]:
    """Per response (token ids), one label per token from the claims labeller;
    ``cut_off[i]``: response ``i`` ran out of its token budget (None: none did)."""

    cut_off = [False] * len(responses) if cut_off is None else list(cut_off)
    if len(cut_off) != len(responses):
        raise ValueError(f"cut_off: expected one flag per response ({len(responses)}), "
                         f"got {len(cut_off)}")
    return ["".join(claim_token_labels(tokenizer, ids, answer, cut_off=cut))
            for ids, cut in zip(responses, cut_off, strict=True)]


def cut_off_rows(responses, stop_ids) -> list[bool]:
    """Per recorded response (token ids, its stop token included when it has one): whether
    it was cut at the token budget, i.e. its last token is none of ``stop_ids`` (the
    trainer's rule: :func:`ktae.train.batch_metrics.truncated_rows`). An empty response
    is not cut off."""

    stops = {int(i) for i in stop_ids}
    return [bool(ids) and int(ids[-1]) not in stops for ids in responses]


def run_stop_ids(header: dict, tokenizer) -> list[int]:
    """The stop tokens of a recorded run: its rollouts header's ``ignore_token_ids`` (the
    trainer's EOS and padding ids), else the tokenizer's EOS and padding ids."""

    ids = header.get("ignore_token_ids")
    if not ids:
        ids = [getattr(tokenizer, "eos_token_id", None), getattr(tokenizer, "pad_token_id", None)]
    return [int(i) for i in ids if i is not None]


def progress_printer(total: int, samples: int, stream=None) -> Callable[[int], None]:
    """``on_batch(n)`` for :func:`ktae.models.generate.generate_hf`: one line per batch on
    ``stream`` (stderr) with the prompts done, the time so far and an estimate of the rest."""
    start, done = time.monotonic(), [0]

    def on_batch(n: int) -> None:
        done[0] += n
        elapsed = time.monotonic() - start
        left = elapsed / done[0] * (total - done[0])
        print(f"  sampled {done[0]}/{total} prompts ({done[0] * samples} responses) in "
              f"{elapsed:.0f} s" + (f", about {left:.0f} s left" if done[0] < total else ""),
              file=stream or sys.stderr, flush=True)

    return on_batch


def sampled_input(model, tokenizer, path: str, *, difficulty: int, prompts: int, samples: int,
                  seed: int, max_new_tokens: int, temperature: float, prompt_set: int = 0,
                  on_batch: Callable[[int], None] | None = None, on_phase=None,
                  references: Callable[[list[float]], bool] | None = None,
                  cut_off: str = DEFAULT_CUT_OFF):
    """``prompts`` arith problems (:func:`prompt_set_problems`) x ``samples`` responses
    from ``model``, scored by the ``number`` reward (a response cut at ``max_new_tokens``
    is wrong unless ``cut_off="read"``, :mod:`ktae.rewards.ends`) and labelled by their
    claims; an
    :class:`ktae.credit_audit.run.AuditInput` whose groups' level is the problem's kind.
    ``on_phase``: progress of the labelling (:mod:`ktae.credit_audit.progress`).
    ``references(rewards)`` True for a group: its clean answer summaries for the
    input-gradient importance are read from the sampling's cache (each response continued
    by the concluding text and the answer; :class:`AuditInput`'s ``references``)."""

    stream = prompt_set_problems((prompt_set + 1) * prompts, 0, difficulty)
    problems = stream[prompt_set * prompts:]
    repeats = repeated_problems(stream, prompts)
    texts = [chat_prompt(tokenizer, p) for p in problems]
    sampling = SamplingConfig(k=samples, temperature=temperature, max_new_tokens=max_new_tokens,
                              seed=seed)

    tails, on_tail, refs = importance_references(
        tokenizer, [p.answer for p in problems], references,
        lambda gens, answer: [float(counts_as_right(number_check(g.text, answer)[0],
                                                    g.truncated, cut_off)) for g in gens])
    # the log-probs and entropies at the sampling temperature come from the sampling steps
    out = generate_hf(model, tokenizer, texts, sampling, add_special_tokens=False,
                      batch_size=max(1, SEQUENCES_PER_BATCH // samples), on_batch=on_batch,
                      scores=temperature, tails=tails, on_tail=on_tail)
    groups = []
    group_refs: dict[int, object] = {}
    step = (on_phase or quiet_phase)("labelled", "groups (claims labels)", len(problems))
    for i, (p, text, gens) in enumerate(zip(problems, texts, out, strict=True)):
        correct = [counts_as_right(number_check(g.text, p.answer)[0], g.truncated, cut_off)
                   for g in gens]
        g = GroupInput(prompt=text, responses=[list(x.token_ids) for x in gens],
                       rewards=[float(c) for c in correct], correct=correct,
                       label=f"prompt {i}", answer=p.answer, **generation_scores(gens))
        groups.append(AuditGroup(g, claims_labels(tokenizer, g.responses, p.answer,
                                                  [x.truncated for x in gens]),
                                 level=p.kind, key=str(i)))
        if refs.get(i) is not None and g.logprobs is not None:
            group_refs[id(g)] = refs[i]
        step(1)
    desc = (f"{prompts} arith problems (difficulty {difficulty}, {SPLIT} split, prompt set "
            f"{prompt_set}{f'; {repeats} repeat an earlier problem' if repeats else ''}) x "
            f"{samples} responses sampled from {path} (chat template, "
            f"temperature {temperature:g}, seed {seed}, at most {max_new_tokens} new tokens; "
            f"reward number, cut-off responses {'wrong' if cut_off == 'wrong' else 'read'}; "
            "labels: claims)")
    return AuditInput(groups, tokenizer, desc, "model",
                      meta=["labels: ktae.tasks.claims.claim_token_labels"],
                      references=group_refs)


def run_labels(prompt: str, responses, tokenizer, stop_ids=None):
    """``(labels, kind, prompt)`` for a recorded group of an arith run: the claims labels
    of its responses against the answer of the question in ``prompt`` (a response whose
    last token is none of ``stop_ids`` is cut off: :func:`cut_off_rows`; None: the
    tokenizer's EOS and padding ids), the problem's kind,
    and the prompt to score the responses after (the chat-template rendering of the
    question when the recorded prompt is that rendering without its special tokens, else
    the recorded one). A ValueError when ``prompt`` holds no arith question."""

    problem = problem_in(prompt)
    if problem is None:
        raise ValueError(f"INPUT: prompt {prompt[:80]!r} holds no arith question, so its "
                         "responses cannot be labelled")
    scored = prompt
    if getattr(tokenizer, "chat_template", None):
        rendered = chat_prompt(tokenizer, problem)
        ids = tokenizer(rendered, add_special_tokens=False)["input_ids"]
        if tokenizer.decode(ids, skip_special_tokens=True) == prompt:
            scored = rendered
    stops = run_stop_ids({}, tokenizer) if stop_ids is None else stop_ids
    return (claims_labels(tokenizer, responses, problem.answer, cut_off_rows(responses, stops)),
            problem.kind, scored)
