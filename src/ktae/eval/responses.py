"""``ktae eval --responses FILE``: grade responses generated elsewhere, without a model.

Inputs (one file, or a directory of ``samples_*.jsonl``):

* ktae's own ``samples_<benchmark>.jsonl`` (written by ``ktae eval``): one row per sample
  with ``index``, ``sample``, ``completion``, ``answer``, ``response_tokens`` and
  ``truncated``; the benchmark is the file's name (or the rows' ``benchmark``). A
  directory (a ``ktae eval`` output directory) gives every ``samples_*.jsonl`` in it.
* JSON (a list) or JSONL records, one per problem or per response, each with a
  benchmark name (``benchmark``, ``task_name``, ``task`` or ``data_source``; default: the
  file's stem), a reference (``answer``, ``reference``, ``ground_truth`` or ``gt``) and a
  response (``response``, ``completion``, ``model_output`` or ``output``: a string, or a
  list of a problem's k samples). The KTAE authors' ``eval_result/*.json`` files are of
  this kind: their ``gt`` repeats the reference once per sample, so a ``gt`` list as long
  as the response list, of equal entries, is read as that one reference (a list inside
  it: accepted alternatives). Optional: ``response_tokens`` (a number, or one per
  sample), ``truncated``.

Every benchmark needs the same number of samples per problem. Response lengths that the
file does not give count as 0 tokens (the table's ``len`` and ``max`` are then 0).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ktae.data.sources import read_json
from ktae.eval.benchmarks import BenchmarkRecord
from ktae.eval.graders import get_grader
from ktae.eval.results import benchmark_metrics, sample_rows, summarize
from ktae.eval.runner import verify_responses, vote_classes
from ktae.models.generate import Generation
from ktae.rewards import reward_stats
from ktae.rewards.ends import DEFAULT_CUT_OFF, check_cut_off_rule

BENCHMARK_KEYS = ("benchmark", "task_name", "task", "data_source")
REFERENCE_KEYS = ("answer", "reference", "ground_truth", "gt")
RESPONSE_KEYS = ("response", "completion", "model_output", "output")


@dataclass(frozen=True)
class GradedProblem:
    """One problem's reference and its k responses (with lengths where known)."""

    id: str
    prompt: str
    answer: object
    responses: tuple[str, ...]
    tokens: tuple[int, ...]
    truncated: tuple[bool, ...]


def _first(rec: dict, keys: Sequence[str]):
    return next((k for k in keys if rec.get(k) is not None), None)


def _per_sample(value, k: int, where: str, what: str, default) -> tuple:
    if value is None:
        return (default,) * k
    if isinstance(value, list):
        if len(value) != k:
            raise ValueError(f"{where}: {what}: expected {k} entries (one per response), "
                             f"got {len(value)}")
        return tuple(value)
    return (value,) * k


def _reference(rec: dict, key: str, k: int, where: str):
    value = rec[key]
    if key == "gt" and isinstance(value, list) and k > 0 and len(value) == k \
            and all(v == value[0] for v in value):
        return value[0]  # the authors' files repeat the reference once per sample
    return value


def _samples_file(path: Path) -> dict[str, list[GradedProblem]]:
    """ktae's ``samples_<benchmark>.jsonl``: rows grouped by problem ``index``."""
    rows = read_json(path)
    default = path.stem.removeprefix("samples_")
    recs = rows.dicts()
    out: dict[str, dict[int, list]] = {}
    for i, rec in enumerate(recs):
        name = rec.get("benchmark") or default
        out.setdefault(name, {}).setdefault(rec["index"], []).append((rec, rows.where(i)))
    problems: dict[str, list[GradedProblem]] = {}
    for name, by_index in out.items():
        problems[name] = []
        for index in sorted(by_index):
            samples = sorted(by_index[index], key=lambda rw: rw[0].get("sample", 0))
            first, where = samples[0]
            if not isinstance(first.get("completion"), str):
                raise ValueError(f"{where}: completion: expected a string")
            problems[name].append(GradedProblem(
                id=str(first.get("id", index)), prompt=str(first.get("prompt", "")),
                answer=first["answer"],
                responses=tuple(r["completion"] for r, _ in samples),
                tokens=tuple(int(r.get("response_tokens") or 0) for r, _ in samples),
                truncated=tuple(bool(r.get("truncated", False)) for r, _ in samples)))
    return problems


def _records_file(path: Path) -> dict[str, list[GradedProblem]]:
    rows = read_json(path)
    problems: dict[str, list[GradedProblem]] = {}
    for i, rec in enumerate(rows.dicts()):
        where = rows.where(i)
        response_key = _first(rec, RESPONSE_KEYS)
        reference_key = _first(rec, REFERENCE_KEYS)
        if response_key is None or reference_key is None:
            missing = "a response" if response_key is None else "a reference"
            keys = RESPONSE_KEYS if response_key is None else REFERENCE_KEYS
            raise ValueError(f"{where}: expected {missing} under one of {', '.join(keys)}")
        responses = rec[response_key]
        responses = [responses] if isinstance(responses, str) else responses
        if not isinstance(responses, list) or not responses \
                or not all(isinstance(r, str) for r in responses):
            raise ValueError(f"{where}: {response_key}: expected a string or a list of "
                             "strings")
        k = len(responses)
        name_key = _first(rec, BENCHMARK_KEYS)
        name = str(rec[name_key]) if name_key else path.stem
        tokens = _per_sample(rec.get("response_tokens"), k, where, "response_tokens", 0)
        truncated = _per_sample(rec.get("truncated"), k, where, "truncated", False)
        problems.setdefault(name, []).append(GradedProblem(
            id=str(rec.get("id", len(problems.get(name, ())))),
            prompt=str(rec.get("prompt", "")),
            answer=_reference(rec, reference_key, k, where), responses=tuple(responses),
            tokens=tuple(int(t or 0) for t in tokens),
            truncated=tuple(bool(t) for t in truncated)))
    return problems


def read_responses(path: str | Path) -> dict[str, list[GradedProblem]]:
    """Benchmark -> problems of a responses file or ``ktae eval`` output directory.

    Raises:
        ValueError: a missing file, a directory without ``samples_*.jsonl``, a record
            without a response or reference, or a benchmark whose problems have different
            numbers of responses (each one line naming the file and record).
    """
    path = Path(path)
    if path.is_dir():
        files = sorted(path.glob("samples_*.jsonl"))
        if not files:
            raise ValueError(f"--responses: {path} is a directory without samples_*.jsonl")
    elif path.is_file():
        files = [path]
    else:
        raise ValueError(f"--responses: {path}: no such file")
    out: dict[str, list[GradedProblem]] = {}
    for file in files:
        rows = read_json(file)
        is_samples = rows.has("completion") and rows.has("index")
        for name, problems in (_samples_file(file) if is_samples
                               else _records_file(file)).items():
            out.setdefault(name, []).extend(problems)
    for name, problems in out.items():
        ks = {len(p.responses) for p in problems}
        if len(ks) != 1:
            raise ValueError(f"--responses: benchmark {name!r}: problems have different "
                             f"numbers of responses ({sorted(ks)}); expected the same k")
    return out


def grade_responses(problems: dict[str, list[GradedProblem]], *, grader: str = "default",
                    timeout: float = 5.0, config: dict | None = None,
                    cut_off: str = DEFAULT_CUT_OFF) -> dict:
    """The results document (as :func:`ktae.eval.runner.evaluate` returns it, ``samples``
    included) of already generated responses, graded by ``grader``; a response recorded
    as ``truncated`` is wrong unless ``cut_off="read"`` (:mod:`ktae.rewards.ends`)."""
    get_grader(grader)
    check_cut_off_rule(cut_off, "cut_off")
    before = reward_stats()["timeouts"]
    per_bench, samples, ks = {}, {}, {}
    for name, probs in problems.items():
        k = len(probs[0].responses)
        records = [BenchmarkRecord(id=p.id, problem=p.prompt, answer=p.answer, source=name)
                   for p in probs]
        gens = [[Generation(text=t, num_tokens=n, truncated=c)
                 for t, n, c in zip(p.responses, p.tokens, p.truncated, strict=True)]
                for p in probs]
        rewards = verify_responses(name, [t for p in probs for t in p.responses],
                                   [p.answer for p in probs for _ in range(k)], timeout, grader,
                                   truncated=[c for p in probs for c in p.truncated],
                                   cut_off=cut_off)
        classes = vote_classes(name, rewards, k, timeout)
        samples[name] = sample_rows(records, [p.prompt for p in probs], gens, rewards, classes)
        per_bench[name] = benchmark_metrics(samples[name], k=k)
        ks[name] = k
    results = summarize(per_bench, {"grader": grader, "k": ks, "cut_off_answers": cut_off,
                                    "verifier_timeouts": reward_stats()["timeouts"] - before,
                                    **dict(config or {})})
    results["samples"] = samples
    return results
