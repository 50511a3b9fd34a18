"""Seven one-line mutations that once left the whole suite green; each must fail a test.

Each mutation replaces one exact line fragment of ``src/`` (found exactly once), runs its
targeted tests, and puts the fragment back (re-reading the file, so edits made meanwhile
are kept). Prints, per mutation, the tests that failed ("killed") or "SURVIVED".

    python studies/mutation/hand_mutations.py            # all seven
    python studies/mutation/hand_mutations.py 3 5        # only those

Exit status 1 when a mutation survives or a fragment is not found (the code moved: update
the table below).
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Mutation:
    what: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]


MUTATIONS = (
    Mutation("train() builds its reward functions without overlong shaping",
             "src/ktae/train/session.py",
             "max_new_tokens=cfg.max_new_tokens, overlong_buffer=cfg.overlong_buffer,",
             "max_new_tokens=cfg.max_new_tokens, overlong_buffer=0,",
             ("tests/test_wiring_config.py::test_field_reaches_what_it_controls",
              "tests/test_wiring_train.py::"
              "test_default_rewards_shape_overlong_responses_and_beta_and_clip_reach_trl")),
    Mutation("correctness from the summed, shaped reward",
             "src/ktae/train/trainer.py",
             "correct = per_func[:, idx] > 0.5",
             "correct = rewards > 0.5",
             ("tests/test_wiring_train.py::test_shaping_never_flips_a_correct_response",
              "tests/test_wiring_train.py::"
              "test_default_rewards_shape_overlong_responses_and_beta_and_clip_reach_trl")),
    Mutation("taco_lambda sets TACO's alpha instead of lam",
             "src/ktae/core/calibration_taco.py",
             'Alias("taco_lambda", "lam",',
             'Alias("taco_lambda", "alpha",',
             ("tests/test_wiring_config.py::test_field_reaches_what_it_controls",
              "tests/test_wiring_train.py::test_taco_alpha_and_lambda_reach_the_calibration")),
    Mutation("ktae compare's mean ± std is the first seed ± 0",
             "src/ktae/train/cli_compare.py",
             "return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 "
             "else 0.0)",
             "return values[0], 0.0",
             ("tests/test_wiring_compare.py",)),
    Mutation("beta=0.0 passed to TRL",
             "src/ktae/train/session.py",
             "warmup_steps=cfg.warmup_ratio or cfg.warmup_steps, beta=cfg.beta,",
             "warmup_steps=cfg.warmup_ratio or cfg.warmup_steps, beta=0.0,",
             ("tests/test_wiring_config.py::test_field_reaches_what_it_controls",
              "tests/test_wiring_train.py::"
              "test_default_rewards_shape_overlong_responses_and_beta_and_clip_reach_trl")),
    Mutation("epsilon_high from clip_low",
             "src/ktae/train/session.py",
             "epsilon_high=cfg.clip_high,",
             "epsilon_high=cfg.clip_low,",
             ("tests/test_wiring_config.py::test_field_reaches_what_it_controls",
              "tests/test_wiring_train.py::"
              "test_default_rewards_shape_overlong_responses_and_beta_and_clip_reach_trl",
              "tests/test_wiring_train.py::test_clip_high_bounds_an_off_policy_update")),
    Mutation("another key for the GPQA option shuffle",
             "src/ktae/eval/choice.py",
             'random.Random(f"{seed}:{record_id}")',
             'random.Random(f"{record_id}:{seed}")',
             ("tests/test_eval_choice.py",)),
)


def _swap(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    if text.count(old) != 1 or text.count(new) != 0:
        raise LookupError(f"{path.relative_to(ROOT)}: expected {old!r} once and {new!r} "
                          f"never, found {text.count(old)} and {text.count(new)}")
    path.write_text(text.replace(old, new))


def run(m: Mutation) -> list[str] | None:
    """The failed test ids under mutation ``m`` (empty: it survived); None: not found."""
    path = ROOT / m.path
    try:
        _swap(path, m.old, m.new)
    except LookupError as err:
        print(f"  NOT APPLIED: {err}")
        return None
    try:
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rf", "-p",
                               "no:cacheprovider", *m.tests], cwd=ROOT, capture_output=True,
                              text=True)
    finally:
        _swap(path, m.new, m.old)
    ran = re.search(r"\d+ (passed|failed)", proc.stdout)
    if proc.returncode not in (0, 1) or not ran:  # no pytest, collection error, no tests
        print(proc.stdout[-2000:] + proc.stderr[-2000:])
        raise RuntimeError(f"pytest did not run the tests (exit status {proc.returncode})")
    return re.findall(r"^FAILED (\S+)", proc.stdout, flags=re.M)


def main(argv: list[str]) -> int:
    picked = [int(a) for a in argv] or list(range(1, len(MUTATIONS) + 1))
    bad = 0
    for i in picked:
        m = MUTATIONS[i - 1]
        print(f"{i}. {m.what} ({m.path})", flush=True)
        failed = run(m)
        if failed is None:
            bad += 1
        elif failed:
            for test in failed:
                print(f"  killed by {test}")
        else:
            bad += 1
            print("  SURVIVED")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
