"""Where ``ktae explain`` gets its groups: a run directory, a JSONL file, or a model.

Each loader returns a :class:`Source`: the groups (:class:`ktae.groups.input.GroupInput`,
keyed by an id the user can pick with ``--group``), the tokenizer that made their
token ids, and the credit the source implies (a run's own credit; KTAE otherwise).
A JSONL file is read by :func:`ktae.groups.input.load_jsonl` (its format is there); a
model samples groups with :mod:`ktae.groups.sampling` and scores them with
:mod:`ktae.groups.scoring`. Their names stay importable from here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ktae.core.methods import Method
from ktae.core.needs import NEEDS
from ktae.groups.input import GroupInput, ignore_ids
from ktae.runs.credit import credit_method
from ktae.runs.reader import (
    read_run_rollouts,
    recorded_credit_name,
    recorded_method,
    run_config,
    run_tokenizer,
)


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


def credit_spec(name: str, *, train_config=None, ignore_token_ids=()) -> Method:
    """Parse ``--credit`` (``ktae``, ``ktae+taco``, ``grpo``, ``taco``, ``ktae@ngram=3``,
    ...) the way ``ktae train`` does, with that run's hyper-parameters when
    ``train_config`` is given: :func:`ktae.runs.credit.credit_method`."""
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
                       entropies=r.get("entropies"), weights=r.get("weights"),
                       flagged=r.get("flagged"), loss_mask=r.get("loss_mask"),
                       **{n.fields[0]: r.get(n.fields[0]) for n in NEEDS.values() if n.recorded})
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
