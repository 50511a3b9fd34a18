"""``ktae simulate``: the TACO paper's synthetic MDP, every credit method against the oracle.

``ktae simulate --preset quick`` trains a tabular softmax policy on the
synthetic sequential MDP (docs/method.md §14) with each credit method, for each setting of
the three axes (H, n_opt, G) and each seed, then writes to the output directory
(default ``runs/simulate/PRESET[-SETTINGS]``, named by the preset and the flags that
change it; an earlier result there or at ``--output-dir`` is kept unless ``--overwrite``):
``curves_H.png``, ``curves_n_opt.png``, ``curves_G.png`` (curves per axis), ``results.md``
(final and mean return, steps to the target, the paper's claims, each method's credit
scored against the MDP's optimal actions: ``ktae audit``'s figures) and ``curves.json``
(the raw curves and every figure), and prints a summary.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ktae.cli_common import check_output_dir, slug
from ktae.core.calibration import CALIBRATIONS
from ktae.sim import plots, report
from ktae.sim.blame_report import audit_summary_lines
from ktae.sim.config import PRESETS, SimConfig
from ktae.sim.run import plan_blocks, simulate

QUICK_METHODS = ",".join(PRESETS["quick"]["methods"])
DEFAULT_ROOT = "runs/simulate"
RESULT_FILES = ("results.md", "curves.json")
#: Flags that change the result, in the order they name the default folder.
_NAMED = ("horizon", "n_opt", "group_size", "actions", "steps", "lr", "seeds", "first_seed",
          "eval_every",
          "methods", "ktae_threshold", "ktae_ngram", "target", "audit_groups", "audit_at")


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one integer")
    return values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    quick, paper = PRESETS["quick"], PRESETS["paper"]
    parser.add_argument(
        "--preset", choices=sorted(PRESETS), default="quick",
        help=f"quick: |A| = {quick['actions']}, {quick['steps']} updates, lr {quick['lr']}, "
             f"{quick['seeds']} seeds, methods {QUICK_METHODS} (about 1.7 CPU-minutes); "
             f"paper: the TACO paper's |A| = {paper['actions']}, {paper['steps']} updates, "
             f"lr {paper['lr']}, {paper['seeds']} seeds, every method (about 29 CPU-hours "
             "on one thread, an estimate: see docs/simulate.md). Flags override it.")
    parser.add_argument("--horizon", type=_int_list, default=None, metavar="H,H,...",
                        help="trace lengths of the H axis (default 4,16,64)")
    parser.add_argument("--n-opt", type=_int_list, default=None, metavar="N,N,...",
                        help="optimal actions per step of the n_opt axis (default 1,10,100)")
    parser.add_argument("--group-size", type=_int_list, default=None, metavar="G,G,...",
                        help="trajectories per update of the G axis (default 4,8,16)")
    parser.add_argument("--actions", type=int, default=None, help="|A|, actions per step")
    parser.add_argument("--steps", type=int, default=None, help="SGD updates per run")
    parser.add_argument("--lr", type=float, default=None, help="SGD learning rate")
    parser.add_argument("--seeds", type=int, default=None, help="seeds per (method, setting)")
    parser.add_argument("--first-seed", type=int, default=None,
                        help="the first seed: seeds K..K+N-1 with --seeds N (default 0); e.g. "
                             "seeds kept aside for a final table")
    parser.add_argument("--eval-every", type=int, default=None,
                        help="updates between evaluations")
    parser.add_argument(
        "--methods", default=None,
        help="comma list: broadcast, step (the oracle), ktae, ktae-graded (KTAE on the "
             "returns themselves, docs/graded.md), a calibration on broadcast "
             f"({', '.join(CALIBRATIONS.names())}), BASE+CALIBRATION (e.g. ktae+taco), any "
             "other registered estimator as ESTIMATOR[@KEY=VALUE][+CALIBRATION] (e.g. "
             "prefix-value@total=add, gtpo, ktae@apply=wrong, a --plugin rule), or "
             f"all (default: quick {QUICK_METHODS}; paper all)")
    parser.add_argument("--ktae-threshold", type=float, default=None,
                        help="KTAE correctness: return > this value (default: return above "
                             "the group mean; ktae-graded has no threshold)")
    parser.add_argument("--ktae-ngram", type=int, default=1,
                        help="KTAE span length: 1 = single (step, action) tokens (default); "
                             "N > 1 = spans of N consecutive steps")
    parser.add_argument("--target", type=float, default=0.9,
                        help="steps-to-target threshold on the normalised return (0.9)")
    parser.add_argument("--audit-groups", type=int, default=None, metavar="K",
                        help="probe groups per run whose credit is scored against the MDP's "
                             "optimal actions (blame, lowest, contamination, credit mass) at "
                             "each audited update; 0 = no audit (default 32)")
    parser.add_argument("--audit-at", type=_int_list, default=None, metavar="U,U,...",
                        help="updates whose policy is audited (default: 0 and the last "
                             "update, i.e. the initial and the final policy)")
    parser.add_argument("--device", default="cpu", help="torch device (cpu, cuda, ...)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (default 1, the fastest on a 2-core CPU "
                             "with or without other jobs: see docs/simulate.md)")
    parser.add_argument("-o", "--output-dir", default=None,
                        help=f"where the PNGs, results.md and curves.json go (default "
                             f"{DEFAULT_ROOT}/PRESET[-SETTINGS], e.g. {DEFAULT_ROOT}/quick or "
                             f"{DEFAULT_ROOT}/quick-steps=50-seeds=2)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an earlier result in the output folder")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def config_from_args(args: argparse.Namespace) -> SimConfig:
    """The :class:`SimConfig` of the parsed flags (ValueError on bad values)."""
    overrides = {}
    for flag, field in (("horizon", "horizons"), ("n_opt", "n_opts"),
                        ("group_size", "group_sizes"), ("actions", "actions"),
                        ("steps", "steps"), ("lr", "lr"), ("seeds", "seeds"),
                        ("first_seed", "first_seed"),
                        ("eval_every", "eval_every")):
        value = getattr(args, flag)
        if value is not None:
            overrides[field] = value
    if getattr(args, "audit_groups", None) is not None:
        overrides["audit_groups"] = args.audit_groups
    if getattr(args, "audit_at", None) is not None:
        overrides["audit_updates"] = args.audit_at
    if args.methods is not None:
        overrides["methods"] = tuple(m.strip() for m in args.methods.split(",") if m.strip())
    return SimConfig.preset(args.preset, ktae_threshold=args.ktae_threshold,
                            ktae_ngram=args.ktae_ngram,
                            target=args.target, device=args.device, **overrides)


class _Progress:
    """A tqdm bar over every update of every block (silent when tqdm is missing)."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.bar = None
        if enabled:
            try:
                from tqdm.auto import tqdm
            except ImportError:
                return
            self.bar = tqdm(total=total, desc="ktae simulate", unit="update",
                            dynamic_ncols=True)

    def __call__(self, block: int, n_blocks: int, step: int) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(f"block {block + 1}/{n_blocks}", refresh=False)
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def default_output_dir(args: argparse.Namespace) -> Path:
    """``runs/simulate/PRESET[-FLAG=VALUE...]``: the preset and every flag that changes
    the result (a hash stands in for a list too long for a file name)."""
    import hashlib

    parts = []
    for name in _NAMED:
        value = getattr(args, name, None)
        default = 1 if name == "ktae_ngram" else 0.9 if name == "target" else None
        if value is None or value == default:
            continue
        text = ",".join(map(str, value)) if isinstance(value, tuple) else str(value)
        parts.append(f"{name.replace('_', '-')}={text}")
    name = slug("-".join([args.preset, *parts]))
    if len(name) > 100:
        name = f"{name[:80]}-{hashlib.sha1(name.encode()).hexdigest()[:10]}"
    return Path(DEFAULT_ROOT) / name


def run(args: argparse.Namespace) -> int:
    """Entry point of ``ktae simulate``."""
    given = args.output_dir is not None
    out = Path(args.output_dir) if given else default_output_dir(args)
    try:
        config = config_from_args(args)
        if args.threads < 1:
            raise ValueError(f"threads: expected a positive integer, got {args.threads}")
        check_output_dir(out, results=RESULT_FILES, overwrite=args.overwrite)
    except ValueError as err:
        print(f"ktae simulate: {err}", file=sys.stderr)
        return 2
    try:
        import matplotlib  # noqa: F401  (checked before a long run, used by the plots)
    except ImportError:
        print("ktae simulate: the plots need matplotlib: pip install 'ktae[sim]'",
              file=sys.stderr)
        return 2
    import torch

    torch.set_num_threads(args.threads)
    out.mkdir(parents=True, exist_ok=True)
    n_blocks = len(plan_blocks(config))
    n_runs = len(config.method_names) * len(config.settings()) * config.seeds
    print(f"ktae simulate: {len(config.method_names)} methods x {len(config.settings())} "
          f"settings x {config.seeds} seeds = {n_runs} runs of {config.steps} updates, "
          f"|A| = {config.actions}, in {n_blocks} block(s)", file=sys.stderr)
    bar = _Progress(n_blocks * config.steps, enabled=not args.no_progress)
    try:
        result = simulate(config, progress=bar)
    finally:
        bar.close()
    (out / "results.md").write_text(report.markdown(result))
    report.write_json(result, out / "curves.json")
    pngs = plots.plot_all(result, out)
    print(report.summary_paragraph(result))
    for line in audit_summary_lines(result):
        print(line)
    print(f"ktae simulate: {result.seconds:.0f} s; wrote {out / 'results.md'}, "
          f"{out / 'curves.json'}, " + ", ".join(str(p) for p in pngs))
    return 0
