"""Named rewards of ``ktae train --reward NAME``: one entry per answer format.

A reward scores a batch of completions against their reference answers and returns one
:class:`~ktae.rewards.RewardResult` per completion: ``score`` is what the policy is
trained on, ``correct`` the correctness signal of KTAE, dynamic sampling and the
held-out accuracy. Entries:

* ``boxed`` (default): the strict last-``\\boxed{}`` reward (:func:`ktae.rewards.math_reward`,
  scores 1 / 0; symbolic checks in verifier processes with a hard deadline).
* ``dapo``: the last ``Answer: ...`` line, normalised and compared as verl's ``math_dapo``
  scorer does (:mod:`ktae.rewards.answer_line`; scores +1 / -1, as DAPO trains).
* ``gsm8k``: the last ``#### N``, as verl's strict GSM8K scorer (1 / 0).
* ``number``: the last number of the response equals the answer (1 / 0), the format a small
  chat model answers word problems in (the ``arith`` task, :mod:`ktae.tasks.arith`).
* ``digits``: the boxed answer, with partial credit for its right digits when it is wrong
  (:mod:`ktae.rewards.graded`; scores 1, or 0.4 x the share of right digits): a graded
  reward for the embedded task, e.g. for KTAE's ``split=graded``.
* ``auto``: per row by its ``data_source``, as verl's ``default_compute_score`` dispatches
  (:func:`auto_reward_name`); rows without one get ``boxed``.

Every check (the answer-line scorers too) runs in a verifier process under a hard time
limit (:mod:`ktae.rewards.pool`).

A response cut at the token budget without ending is wrong under every reward
(:func:`score_responses`, :mod:`ktae.rewards.ends`), unless the caller's
``cut_off="read"`` says otherwise.

Adding a reward is one :class:`Reward` in :data:`REWARDS`: a name, a one-line summary
(shown by ``ktae train --help`` and in error messages), a batch ``score`` function with
the signature of :func:`score_boxed` and, when it is not 0, its wrong score.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ktae.rewards.batch import batch_math_reward, batch_scorer_reward
from ktae.rewards.ends import DEFAULT_CUT_OFF, require_end
from ktae.rewards.graded import score_digits
from ktae.rewards.verify import RewardResult

ScoreFn = Callable[..., list[RewardResult]]
"""``score(completions, answers, *, timeout, num_workers, data_sources) -> results``."""


@dataclass(frozen=True)
class Reward:
    """One named reward: ``score`` maps B completions and B answers to B results."""

    name: str
    summary: str
    score: ScoreFn
    template: str | None = None
    """The prompt template that asks for this reward's answer format (None: any)."""
    check_source: Callable[[str | None], None] | None = None
    """Called with each row's ``data_source`` before training; raises ValueError for a row
    this reward cannot score (None: every row can be scored)."""
    prompt_marker: str | None = None
    """Text a prompt must mention for the model to know the answer format this reward
    reads (``dapo``: ``Answer:``); None: no check."""
    wrong_score: float = 0.0
    """The score of a wrong response: what a response cut at the budget gets
    (:mod:`ktae.rewards.ends`)."""


def score_boxed(completions: Sequence[str], answers: Sequence, *, timeout: float = 5.0,
                num_workers: int | None = 1, data_sources: Sequence | None = None
                ) -> list[RewardResult]:
    """The strict boxed reward of each completion (1.0 when its last box is equivalent to
    the answer, else 0.0). ``data_sources`` is ignored."""
    return batch_math_reward(list(completions), list(answers), timeout=timeout,
                             num_workers=num_workers)


def _scorer(name: str) -> ScoreFn:
    def score(completions, answers, *, timeout=5.0, num_workers=1, data_sources=None):
        return batch_scorer_reward(list(completions), list(answers), scorer=name,
                                   timeout=timeout, num_workers=num_workers)

    score.__name__ = f"score_{name}"
    return score


# data_source -> reward, as verl's default_compute_score dispatches (lighteval MATH and
# the numina sets are boxed there too; ktae checks boxes with its own verifier)
AUTO_SOURCES = {
    "openai/gsm8k": "gsm8k",
    "lighteval/MATH": "boxed", "DigitalLearningGmbH/MATH-lighteval": "boxed",
    "HuggingFaceH4/MATH-500": "boxed",
    "math_dapo": "dapo", "math": "dapo", "math_dapo_reasoning": "dapo",
    **{f"numina_{s}": "boxed" for s in ("aops_forum", "synthetic_math", "amc_aime",
                                         "synthetic_amc", "cn_k12", "olympiads")},
}
AUTO_PREFIXES = {"aime": "dapo"}
"""data_source prefixes (``aime2024``, ``aime25``) -> reward."""


def auto_reward_name(data_source: str | None) -> str:
    """The reward ``auto`` gives a row of ``data_source`` (None or ``""``: ``boxed``).

    Raises:
        ValueError: a data source with no scorer here (code, geometry, QA sets of verl).
    """
    if data_source is None or data_source == "":
        return "boxed"
    if not isinstance(data_source, str):
        raise ValueError(f"data_source: expected a string, got {type(data_source).__name__}")
    if data_source in AUTO_SOURCES:
        return AUTO_SOURCES[data_source]
    for prefix, name in AUTO_PREFIXES.items():
        if data_source.startswith(prefix):
            return name
    raise ValueError(f"reward auto: no scorer for data_source {data_source!r}; known: "
                     f"{', '.join(AUTO_SOURCES)}, aime*; or choose --reward boxed|dapo")


def score_auto(completions: Sequence[str], answers: Sequence, *, timeout: float = 5.0,
               num_workers: int | None = 1, data_sources: Sequence | None = None
               ) -> list[RewardResult]:
    """Each completion scored by the reward of its row's data source
    (:func:`auto_reward_name`); without ``data_sources`` every row is ``boxed``."""
    completions, answers = list(completions), list(answers)
    sources = [None] * len(completions) if data_sources is None else list(data_sources)
    if len(sources) != len(completions):
        raise ValueError(f"data_sources: expected {len(completions)} (one per completion), "
                         f"got {len(sources)}")
    by_reward: dict[str, list[int]] = {}
    for i, source in enumerate(sources):
        by_reward.setdefault(auto_reward_name(source), []).append(i)
    out: list = [None] * len(completions)
    for name, rows in by_reward.items():
        scored = REWARDS[name].score([completions[i] for i in rows], [answers[i] for i in rows],
                                     timeout=timeout, num_workers=num_workers)
        for i, result in zip(rows, scored, strict=True):
            out[i] = result
    return out


REWARDS: dict[str, Reward] = {r.name: r for r in (
    Reward("boxed", "the strict last \\boxed{} answer, checked for equivalence (1 / 0)",
           score_boxed),
    Reward("dapo", "the last 'Answer: ...' line, normalised as verl's math_dapo (+1 / -1)",
           _scorer("dapo"), template="dapo", prompt_marker="Answer:", wrong_score=-1.0),
    Reward("gsm8k", "the last '#### N', as verl's strict GSM8K scorer (1 / 0)",
           _scorer("gsm8k")),
    Reward("number", "the last number of the response (commas allowed), equal to the answer "
           "(1 / 0)", _scorer("number")),
    Reward("digits", "the boxed answer; a wrong one gets 0.4 x its share of right digits "
           "(graded)", score_digits),
    Reward("auto", "by each row's data_source, as verl dispatches (none: boxed)", score_auto,
           check_source=auto_reward_name),
)}
"""Every reward ``--reward`` accepts, by name."""

DEFAULT_REWARD = "boxed"


def warn_if_prompts_miss_the_format(reward: str, prompts: Sequence[str],
                                    template: str | None = None) -> bool:
    """Warn once (and return True) when no prompt mentions the answer format ``reward``
    reads: every response would then score as wrong (``dapo``: -1 for all, a constant
    reward with nothing to learn from)."""
    import warnings

    marker = get_reward(reward).prompt_marker
    if marker is None or not prompts or any(marker in p for p in prompts):
        return False
    warnings.warn(f"--reward {reward} reads the last {marker!r} line, but no prompt asks for "
                  f"one (template {template or 'as given'}); every response will score as "
                  f"wrong. Use --template {get_reward(reward).template or 'dapo'} or rows "
                  "whose prompts ask for it", stacklevel=2)
    return True


def wrong_scores(name: str, n: int, data_sources: Sequence | None = None) -> list[float]:
    """The wrong score of each of ``n`` responses under the reward ``name`` (``auto``: the
    reward of each row's data source)."""
    if name != "auto":
        return [get_reward(name).wrong_score] * n
    sources = [None] * n if data_sources is None else list(data_sources)
    return [REWARDS[auto_reward_name(s)].wrong_score for s in sources]


def score_responses(name: str, completions: Sequence[str], answers: Sequence, *,
                    truncated: Sequence[bool] | None, cut_off: str = DEFAULT_CUT_OFF,
                    timeout: float = 5.0, num_workers: int | None = 1,
                    data_sources: Sequence | None = None) -> list[RewardResult]:
    """The reward ``name`` of each completion, a completion cut at its token budget
    (``truncated``) counted wrong unless ``cut_off == "read"`` (:mod:`ktae.rewards.ends`).

    ``truncated=None`` says that no response was cut (text from a source that does not
    record it); pass the flags wherever the generator gave them.
    """
    results = get_reward(name).score(list(completions), list(answers), timeout=timeout,
                                     num_workers=num_workers, data_sources=data_sources)
    if truncated is None:
        return results
    return require_end(results, truncated, rule=cut_off,
                       wrong_score=wrong_scores(name, len(results), data_sources))


def get_reward(name: str) -> Reward:
    """The reward called ``name``.

    Raises:
        ValueError: an unknown name (the message lists the known ones).
    """
    if name not in REWARDS:
        raise ValueError(f"reward: expected one of {', '.join(REWARDS)}, got {name!r}")
    return REWARDS[name]
