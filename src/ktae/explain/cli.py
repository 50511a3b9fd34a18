"""``ktae explain``: a page showing which tokens get which credit, and why.

INPUT is a ``ktae train`` run directory (its ``rollouts.jsonl``), or a JSONL file of
groups (prompt, response texts, rewards or a reference answer); with ``--model`` and no
INPUT, responses are sampled on the spot (``--model default``: the shipped tiny model
on the embedded task's held-out prompts). Writes one self-contained HTML page
(``-o``; default ``runs/explain/NAME.html``, NAME naming the input or model and the
credit; an earlier page, at ``-o`` or the default, is kept unless ``--overwrite``), and on request a terminal
rendering (``--terminal``) and one PNG per group (``--png DIR``). See docs/explain.md.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

DEFAULT_ROOT = "runs/explain"
DEFAULT_GROUPS = 4


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``ktae explain`` arguments."""
    parser.add_argument("input", nargs="?", metavar="INPUT",
                        help="run directory of ktae train, or a JSONL file of groups")
    parser.add_argument("-o", "--output", help=f"HTML page to write (default "
                        f"{DEFAULT_ROOT}/NAME.html, NAME from the input or model, the credit and "
                        "the step; with --terminal only when given)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an earlier page (at -o or the default path)")
    parser.add_argument("--credit", help="credit to explain: ktae, ktae+taco, grpo, taco, any "
                        "estimator or est+calibration, with settings as in ktae compare "
                        "(ktae@ngram=3) (default: the run's own, else ktae)")
    parser.add_argument("--tokenizer", help="tokenizer directory (default: the run's, the "
                        "model's, or the shipped tiny model's)")
    parser.add_argument("--model", help="model to sample from (no INPUT) or to score responses "
                        "with for a calibration; 'default' = the shipped tiny model")
    parser.add_argument("--prompts", help="JSONL of prompts (prompt/question + answer) to sample "
                        "with --model (default: the embedded task's held-out prompts)")
    pick = parser.add_mutually_exclusive_group()
    pick.add_argument("--groups", type=int, help=f"show the first N groups (default "
                      f"{DEFAULT_GROUPS}; with --model: N prompts)")
    pick.add_argument("--group", help="show only the group with this id (run: group number; "
                      "JSONL: its 'id' or position; model: prompt index)")
    parser.add_argument("--step", type=int, help="recorded training step (run directory; "
                        "default: the latest)")
    parser.add_argument("--png", metavar="DIR", help="also write one PNG per group into DIR")
    parser.add_argument("--terminal", action="store_true", help="print the groups in the "
                        "terminal (rich)")
    parser.add_argument("--num-generations", type=int, default=8,
                        help="responses sampled per prompt with --model (default 8)")
    parser.add_argument("--max-new-tokens", type=int, help="response length budget with --model "
                        "(default 40 for character-level tokenizers, else 1024)")
    parser.add_argument("--temperature", type=float, default=1.0,
                        help="sampling temperature with --model (default 1)")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads for --model "
                        "(default 1, fastest for the tiny model on a busy CPU)")


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower() or "group"


def _select(groups: list, args) -> list:
    if args.group is not None:
        chosen = [g for key, g in groups if key == args.group]
        if not chosen:
            keys = [key for key, _ in groups]
            shown = ", ".join(keys[:20]) + (", ..." if len(keys) > 20 else "")
            raise ValueError(f"group: no group with id {args.group!r}; ids: {shown}")
        return chosen
    n = DEFAULT_GROUPS if args.groups is None else args.groups
    return [g for _, g in groups[:n]]


def _check_args(args) -> None:
    if args.groups is not None and args.groups < 1:
        raise ValueError(f"groups: expected a positive integer, got {args.groups}")
    if args.num_generations < 2:
        raise ValueError(f"num-generations: expected at least 2 (a group compares responses), "
                         f"got {args.num_generations}")
    if args.max_new_tokens is not None and args.max_new_tokens < 1:
        raise ValueError(f"max-new-tokens: expected a positive integer, got {args.max_new_tokens}")
    if args.threads < 1:
        raise ValueError(f"threads: expected a positive integer, got {args.threads}")
    if not args.temperature > 0:
        raise ValueError(f"temperature: expected > 0, got {args.temperature}")
    if args.input is None and args.model is None:
        raise ValueError("INPUT: give a run directory or a JSONL file of groups, or --model "
                         "(e.g. --model default) to sample responses")


def load_source(args):
    """The :class:`ktae.explain.sources.Source` named by the arguments."""
    from ktae.explain import sources
    from ktae.groups import input as group_input
    from ktae.groups import sampling
    from ktae.runs.reader import load_tokenizer

    _check_args(args)
    if args.input is not None:
        path = Path(args.input)
        if not path.exists():
            raise ValueError(f"INPUT: no such file or directory: {path}")
        if path.is_dir():
            return sources.load_run(path, step=args.step, tokenizer=args.tokenizer,
                                    credit=args.credit)
        if args.step is not None:
            raise ValueError("step: only a run directory has recorded steps")
        tok_path = args.tokenizer or sampling.model_tokenizer_path(args.model)
        tok = load_tokenizer(tok_path)
        ignore = group_input.ignore_ids(tok)
        name = args.credit or "ktae"
        return sources.Source(
            groups=group_input.load_jsonl(path, tokenizer=tok), tokenizer=tok,
            credit=sources.credit_spec(name, ignore_token_ids=ignore),
            title=f"ktae explain: {path.name}", meta=[f"tokenizer: {tok_path}"],
            credit_name=name)
    if args.step is not None:
        raise ValueError("step: only a run directory has recorded steps")
    return None  # sampled after the model is loaded


def _sampled_source(args, model, tok, path):
    from ktae.explain import sources
    from ktae.groups import input as group_input
    from ktae.groups import sampling

    first, n = 0, args.groups or DEFAULT_GROUPS
    if args.group is not None:
        if not args.group.isdigit():
            raise ValueError(f"group: expected a prompt index, got {args.group!r}")
        first, n = int(args.group), int(args.group) + 1
    rows = sampling.prompt_rows(Path(args.prompts) if args.prompts else None, tok, n)[first:]
    if not rows:
        raise ValueError(f"group: prompt index {first} is past the last prompt")
    max_new = args.max_new_tokens or (40 if len(tok) < 1000 else 1024)
    groups = sampling.sample_groups(model, tok, rows, num_generations=args.num_generations,
                                   max_new_tokens=max_new, temperature=args.temperature,
                                   seed=args.seed, first_index=first)
    name = args.credit or "ktae"
    where = args.prompts or "the embedded task's held-out prompts"
    meta = [f"model: {path}", f"{args.num_generations} responses per prompt sampled at "
            f"temperature {args.temperature:g} (seed {args.seed}, at most {max_new} new tokens) "
            f"from {where}"]
    return sources.Source(groups=groups, tokenizer=tok,
                          credit=sources.credit_spec(name, ignore_token_ids=group_input.ignore_ids(tok)),
                          title="ktae explain: sampled responses", meta=meta, credit_name=name)


def build(args):
    """``(report, selected groups)`` for the arguments (raises ValueError on bad input)."""
    import inspect

    from ktae.core.needs import CALIBRATION_SCORES, group_calls, held, load, needs_of
    from ktae.explain.report import build_report
    from ktae.groups import sampling

    source = load_source(args)
    model = None
    needs_scores = source is not None and source.credit.needs_scores
    if args.model is not None and (source is None or needs_scores):
        import torch

        torch.set_num_threads(args.threads)
        model, tok, path = sampling.load_model(args.model)
        if source is None:
            source = _sampled_source(args, model, tok, path)
    groups = _select(source.groups, args)
    # Each need of the estimator from a model (GTPO's rollout entropies, a rule's
    # log-probs, OAR-G's importance), unless every group holds it (a run records some); a
    # calibration reads the current policy's log-probs and entropies: score the responses
    # unless they are recorded.
    todo = [n for n in source.credit.model_needs if not held(groups, n)]
    if source.credit.calibration is not None and not source.use_recorded:
        todo += needs_of(CALIBRATION_SCORES)
    for need in todo:  # a user's need without a group provider
        if need.group_provider is None:
            raise ValueError(f"credit: estimator {source.credit.estimator!r} reads "
                             f"{need.what} (needs={need.name}), which ktae explain cannot "
                             "compute for scored groups; use ktae train")
    if model is not None:
        for provider, options in group_calls(todo).items():
            fn = load(provider)
            if "teacher_options" in inspect.signature(fn).parameters:  # the self-teacher's
                options = {**options, "teacher_options": source.credit.estimator_options}
            fn(model, source.tokenizer, groups, temperature=args.temperature, **options)
    _add_labels(groups, source.tokenizer)
    meta = [*source.meta, _credit_line(source)]
    report = build_report(groups, credit=source.credit, tokenizer=source.tokenizer,
                          title=source.title, meta=meta, use_recorded=source.use_recorded)
    return report


def _add_labels(groups, tokenizer) -> None:
    """Local-error labels (outlined on the page) of the responses to embedded-task
    prompts, unless the input gave its own."""
    from ktae.tasks import label_response, question_of
    from ktae.viz.tokens import token_pieces

    for g in groups:
        question = question_of(g.prompt)
        if g.labels is not None or question is None:
            continue
        g.labels = [label_response("".join(p.text for p in token_pieces(tokenizer, r)), question)
                    for r in g.responses]


def _credit_line(source) -> str:
    return f"credit: {source.credit.describe(kinds=True)}"


def default_output(args: argparse.Namespace) -> Path:
    """``runs/explain/NAME.html``: the input's name (or ``model-MODEL-seedN``), the
    credit (``own``: the run's, else ktae) and the recorded step or group."""
    from ktae.cli_common import slug

    if args.input is not None:
        path = Path(args.input)
        parts = [path.resolve().name if path.is_dir() else path.stem]
    else:
        model = "default" if args.model in (None, "default") else Path(args.model).name
        parts = [f"model-{model}", f"seed{args.seed}"]
    parts.append(args.credit or ("own" if args.input and Path(args.input).is_dir() else "ktae"))
    if args.step is not None:
        parts.append(f"step{args.step}")
    if args.group is not None:
        parts.append(f"group{args.group}")
    elif args.groups is not None:
        parts.append(f"{args.groups}groups")
    return Path(DEFAULT_ROOT) / f"{slug('-'.join(parts))[:120]}.html"


def _check_outputs(args: argparse.Namespace) -> Path | None:
    """The HTML page to write (None: terminal only), checked with ``--png`` before any
    work."""
    from ktae.cli_common import check_output_dir, check_output_file

    out = None
    if args.output is not None:
        out = check_output_file(args.output, "--output", overwrite=args.overwrite)
    elif not args.terminal:
        out = check_output_file(default_output(args), "--output", overwrite=args.overwrite)
    if args.png is not None:
        check_output_dir(args.png, "--png")
    return out


def run(args: argparse.Namespace) -> int:
    """Entry point of ``ktae explain``."""
    try:
        out = _check_outputs(args)
        report = build(args)
    except ValueError as err:
        print(f"ktae explain: {err}", file=sys.stderr)
        return 2
    from ktae.viz.report_html import report_html

    written = []
    if args.terminal:
        from ktae.viz.report_terminal import print_report

        print_report(report)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(report_html(report), encoding="utf-8")
        written.append(str(out))
    if args.png is not None:
        from ktae.viz.report_png import group_png

        folder = Path(args.png)
        folder.mkdir(parents=True, exist_ok=True)
        for group in report.groups:
            path = folder / f"{_slug(group.label)}.png"
            group_png(report, group, path)
            written.append(str(path))
    tokens = sum(len(r.token_ids) for g in report.groups for r in g.responses)
    print(f"ktae explain: {len(report.groups)} group(s), {tokens} response tokens; wrote "
          f"{', '.join(written) if written else 'nothing (terminal only)'}", file=sys.stderr)
    return 0
