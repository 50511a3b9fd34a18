"""The run directory: resolved config, ``metrics.jsonl``, checkpoints, plots.

Layout of ``output_dir``::

    ktae_run.json          marks the directory as a run (RUN_MARKER); its segments (one per
                           invocation: step it started from, settings changed) and, once
                           the run is done, the step it finished at
    config.yaml            the resolved TrainConfig
    metrics.jsonl          one JSON object per optimizer step (see METRIC_KEYS)
    eval.jsonl             one JSON object per held-out evaluation
    checkpoint-N/          transformers/TRL checkpoints; complete ones hold COMPLETE_MARKER
    final/                 the final model and tokenizer (+ ktae_generation.json, README.md)
    plots/*.png            accuracy, response length, entropy over steps
    summary.json           before/after held-out accuracy, wall time, mean step time and
                           its parts, the no-signal finding
    README.md              a short model card: model, task, algo, credit, results, command

Only the main process writes here. A run refuses a non-empty directory that is not a run
(:func:`prepare_output_dir`), so checkpoint rotation never deletes files it did not write.

Checkpoint atomicity: transformers writes ``checkpoint-N`` in place, file by file. The
trainer first claims the directory (:func:`claim_checkpoint`: it refuses to write into one
ktae did not start) and writes :data:`COMPLETE_MARKER` (itself via write-to-temp + fsync + rename) only after
everything else, and resume only considers checkpoints holding it, so a checkpoint cut
short by a kill is ignored. On resume, ``metrics.jsonl``/``eval.jsonl`` lines past the
checkpoint's step are dropped, so the resumed run writes the same lines as an
uninterrupted one; a line cut short by a kill is dropped too.

Files written here follow the user's umask (``atomic_write``, :func:`follow_umask` for the
model files that safetensors creates with mode 0600).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

# the reading side of the checkpoint protocol lives below the trainer (eval and explain
# read it too); the run directory's module names all of it
from ktae.checkpoints import (  # noqa: F401  (is_complete_checkpoint)
    CHECKPOINT_NAME,
    COMPLETE_MARKER,
    checkpoint_step,
    is_complete_checkpoint,
    latest_complete_checkpoint,
)

STARTED_MARKER = "ktae_checkpoint_started"
"""File written first into a checkpoint directory, before transformers writes there."""

RUN_MARKER = "ktae_run.json"
"""File that marks a directory as a ``ktae train`` run directory."""

# logged key (TRL/Trainer name) -> metrics.jsonl name. The unprefixed keys describe the
# batch trained on; round1_* the step's first generation round (fresh prompts, an unbiased
# sample of the policy, which dynamic sampling's selection is not); generation_* every
# response generated in the step, refill rounds included.
METRIC_KEYS = {
    "reward": "reward",
    "reward_std": "reward_std",
    "frac_reward_zero_std": "frac_reward_zero_std",
    "ktae/accuracy": "accuracy",
    "ktae/response_length": "response_length",
    "completions/clipped_ratio": "truncated_fraction",
    "ktae/round1_accuracy": "round1_accuracy",
    "generation/reward": "generation_reward",
    "generation/completions/mean_length": "generation_response_length",
    "entropy": "entropy",
    "clip_ratio/low_mean": "clip_low_fraction",
    "clip_ratio/high_mean": "clip_high_fraction",
    "clip_ratio/region_mean": "clip_fraction",
    "kl": "kl",
    "ktae/zero_variance_group_fraction": "zero_variance_group_fraction",
    "ktae/informative_group_fraction": "informative_group_fraction",
    "ktae/generation_rounds": "generation_rounds",
    "ktae/flagged_token_rate": "flagged_token_rate",
    "ktae/mean_weight": "mean_weight",
    "ktae/mean_tail_risk": "mean_tail_risk",
    "ktae/tail_fraction": "tail_fraction",
    "ktae/positive_advantage_fraction": "positive_advantage_fraction",
    "ktae/loss_token_fraction": "loss_token_fraction",
    "ktae/entropy_threshold": "entropy_threshold",
    "ktae/mixed_group_fraction": "mixed_group_fraction",
    "ktae/formatted_fraction": "formatted_fraction",
    # the self-distillation term (ktae.train.self_distill)
    "ktae/self_distill_term": "self_distill_term",
    "ktae/teacher_row_fraction": "teacher_row_fraction",
    "ktae/beta_effective": "beta_effective",
    "ktae/kl_distill": "kl_distill",
    # one optimizer step's wall time and its parts (ktae.train.step_timing)
    "ktae/step_seconds": "step_time",
    "ktae/generation_seconds": "generation_seconds",
    "ktae/scoring_seconds": "scoring_seconds",
    "ktae/logprob_seconds": "logprob_seconds",
    "ktae/advantage_seconds": "advantage_seconds",
    "ktae/update_seconds": "update_seconds",
    "ktae/other_seconds": "other_seconds",
    "loss": "loss",
    "grad_norm": "grad_norm",
    "learning_rate": "learning_rate",
}


def _umask() -> int:
    """The process's umask (read from /proc where it can be, without changing it)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def file_mode() -> int:
    """The mode a plain ``open(path, "w")`` gives a new file: 0o666 less the umask."""
    return 0o666 & ~_umask()


def follow_umask(folder: str | os.PathLike) -> None:
    """Give every file under ``folder`` the mode of :func:`file_mode` (safetensors writes its
    files with mode 0600 whatever the umask)."""
    mode = file_mode()
    for p in Path(folder).rglob("*"):
        if p.is_file() and not p.is_symlink():
            os.chmod(p, mode)


def atomic_write(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` via a uniquely named temporary file, fsync and rename, so a
    reader (or a kill) never sees a half-written file and concurrent writers never share a
    temporary. The file gets the mode of :func:`file_mode` (``mkstemp`` alone gives 0600)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, file_mode())
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def claim_checkpoint(folder: str | os.PathLike) -> None:
    """Mark ``folder`` as a checkpoint ktae is writing (call before any other file).

    A checkpoint of ours cut short by a kill (it holds :data:`STARTED_MARKER`) is written
    over; a non-empty directory of that name that ktae did not start is not.

    Raises:
        ValueError: ``folder`` is a non-empty directory without ktae's markers.
    """
    folder = Path(folder)
    if folder.is_dir() and any(folder.iterdir()) and not (folder / STARTED_MARKER).is_file() \
            and not (folder / COMPLETE_MARKER).is_file():
        raise ValueError(f"{folder} exists and was not written by ktae; move it out of the run "
                         "directory, then resume")
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write(folder / STARTED_MARKER, "")


def foreign_checkpoints(output_dir: str | os.PathLike) -> dict[int, Path]:
    """Step -> non-empty ``checkpoint-N`` directory of ``output_dir`` that ktae did not
    start (neither marker): a run must not save a checkpoint of that step there."""
    output_dir = Path(output_dir)
    found = {}
    if output_dir.is_dir():
        for p in output_dir.iterdir():
            m = CHECKPOINT_NAME.match(p.name)
            if m and p.is_dir() and any(p.iterdir()) and not (p / STARTED_MARKER).is_file() \
                    and not (p / COMPLETE_MARKER).is_file():
                found[int(m.group(1))] = p
    return found


def mark_checkpoint_complete(folder: str | os.PathLike, step: int) -> None:
    """Write the completion marker into ``folder`` (call after every other file)."""
    folder = Path(folder)
    files = sorted(p.name for p in folder.iterdir() if p.is_file())
    atomic_write(folder / COMPLETE_MARKER, json.dumps({"step": int(step), "files": files}))


def rotate_checkpoints(output_dir: str | os.PathLike, keep: int | None) -> list[Path]:
    """Delete the oldest complete ktae checkpoints of ``output_dir`` beyond the newest
    ``keep`` (None or 0: keep all); returns the deleted directories.

    Only ``checkpoint-N`` directories holding :data:`COMPLETE_MARKER` count and are ever
    deleted: a checkpoint being written (no marker yet), one cut short by a kill, and any
    directory another tool put there are left alone.
    """
    if not keep:
        return []
    output_dir = Path(output_dir)
    found = []
    for p in output_dir.iterdir():
        m = CHECKPOINT_NAME.match(p.name)
        if m and p.is_dir() and not p.is_symlink() and (p / COMPLETE_MARKER).is_file():
            found.append((int(m.group(1)), p))
    doomed = [p for _, p in sorted(found)[:-keep]]
    for p in doomed:
        shutil.rmtree(p)
    return doomed


def read_run_info(path: str | os.PathLike) -> dict | None:
    """The contents of ``path``'s :data:`RUN_MARKER`, or None when ``path`` is not a run."""
    try:
        info = json.loads((Path(path) / RUN_MARKER).read_text())
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def write_run_info(path: str | os.PathLike, info: dict) -> None:
    """Rewrite ``path``'s :data:`RUN_MARKER` (atomically)."""
    atomic_write(Path(path) / RUN_MARKER, json.dumps(info, indent=1) + "\n")


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def start_segment(path: str | os.PathLike, *, from_step: int, changes: dict) -> None:
    """Record in the run's marker that an invocation starts training at ``from_step`` with
    ``changes`` (field -> [old, new]) to the run's settings; the run is no longer finished."""
    info = read_run_info(path) or {}
    info.pop("finished", None)
    info.setdefault("segments", []).append(
        {"started": _now(), "from_step": int(from_step), "changes": changes})
    write_run_info(path, info)


def mark_run_finished(path: str | os.PathLike, steps: int) -> None:
    """Record in the run's marker that it finished (final model, evaluation and summary
    written) at ``steps``."""
    info = read_run_info(path) or {}
    info["finished"] = {"steps": int(steps), "at": _now()}
    write_run_info(path, info)


def finished_steps(path: str | os.PathLike) -> int | None:
    """The step a finished run ended at, or None (not a run, or not finished)."""
    info = read_run_info(path) or {}
    finished = info.get("finished")
    return int(finished["steps"]) if isinstance(finished, dict) else None


def _is_run(path: Path) -> bool:
    return read_run_info(path) is not None


def _has_progress(path: Path) -> bool:
    return (path / "metrics.jsonl").exists() or latest_complete_checkpoint(path) is not None


def prepare_output_dir(path: str | os.PathLike, *, resume: bool, write: bool = True) -> Path | None:
    """Check that ``path`` may hold this run and set it up; returns the checkpoint to
    resume from, or None for a fresh start.

    A run never writes into (or rotates checkpoints in) a non-empty directory that is not a
    ktae run (one without :data:`RUN_MARKER`, whatever else it holds), and never starts over
    a run that made progress unless asked to resume.
    ``--resume`` with no complete checkpoint starts over, but first keeps the old
    ``metrics.jsonl``/``eval.jsonl`` as ``*.before-<time>`` files (and says so).
    ``write=False`` (non-main processes) only checks and finds the checkpoint.

    Raises:
        ValueError: ``path`` is a file, a non-empty directory that is not a run, or a run
            with progress and ``resume`` is False.
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"output_dir: {path} exists and is not a directory")
    if path.is_dir() and any(path.iterdir()) and not _is_run(path):
        raise ValueError(f"output_dir: {path} is not empty and is not a ktae run directory "
                         f"(it has no {RUN_MARKER}; ktae writes only into its own runs): "
                         "choose a new or empty --output-dir")
    if path.is_dir() and not resume and _has_progress(path):
        raise ValueError(f"output_dir: {path} already holds a run; pass --resume to continue "
                         "it or choose another --output-dir")
    checkpoint = latest_complete_checkpoint(path) if resume else None
    if not write:
        return checkpoint
    run = RunDir(path)
    if not _is_run(path):
        write_run_info(path, {"format": "ktae-run", "version": 1, "created": _now(),
                              "segments": []})
    if checkpoint is not None:
        run.truncate(checkpoint_step(checkpoint))
    elif resume:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        for old in (run.metrics_path, run.eval_path):
            if old.exists():
                kept = old.with_name(f"{old.name}.before-{stamp}")
                os.replace(old, kept)
                print(f"ktae train: no complete checkpoint in {path} to resume from; starting "
                      f"over, previous {old.name} kept as {kept.name}", file=sys.stderr)
    return checkpoint


def _clean(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class RunDir:
    """Files of one run under ``path`` (created if missing)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.path / "metrics.jsonl"
        self.eval_path = self.path / "eval.jsonl"
        self.plots_dir = self.path / "plots"

    def append(self, path: Path, record: dict) -> None:
        """Append one JSON line (non-finite floats become null) and flush it to disk."""
        line = json.dumps({k: _clean(v) for k, v in record.items()})
        with open(path, "a") as f:
            f.write(line + "\n")
            f.flush()

    def metrics_record(self, step: int, logs: dict) -> dict:
        """The metrics.jsonl line of a step from the trainer's logged dict."""
        record = {"step": int(step)}
        for src, dst in METRIC_KEYS.items():
            if src in logs and logs[src] is not None:
                record[dst] = float(logs[src])
        if "advantage_seconds" in record and record.get("step_time"):
            record["advantage_share"] = record["advantage_seconds"] / record["step_time"]
        return record

    def truncate(self, max_step: int) -> None:
        """Drop metrics/eval lines with step > ``max_step`` (resume from that step)."""
        for path in (self.metrics_path, self.eval_path):
            if not path.exists():
                continue
            keep = [json.dumps(r) for r in RunDir.read_jsonl(path)
                    if r.get("step", 0) <= max_step]
            atomic_write(path, "".join(ln + "\n" for ln in keep))

    @staticmethod
    def read_jsonl(path: str | os.PathLike) -> list[dict]:
        """All records of a JSONL file ([] when missing); a last line cut short by a kill
        is left out."""
        path = Path(path)
        if not path.exists():
            return []
        lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
        records = []
        for i, line in enumerate(lines):
            try:
                records.append(json.loads(line))
            except ValueError:
                if i < len(lines) - 1:
                    raise
        return records

    def write_json(self, name: str, data: dict) -> None:
        """Write ``name`` atomically as indented JSON."""
        atomic_write(self.path / name, json.dumps(data, indent=2) + "\n")

    def plot(self) -> list[Path]:
        """PNG plots of accuracy (train and held-out), response length and entropy."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        metrics = self.read_jsonl(self.metrics_path)
        evals = self.read_jsonl(self.eval_path)
        self.plots_dir.mkdir(exist_ok=True)
        written = []
        panels = [("accuracy", "accuracy"), ("response_length", "response length (tokens)"),
                  ("entropy", "entropy (nats)")]
        for key, label in panels:
            fig, ax = plt.subplots(figsize=(5, 3.2))
            src = "round1_accuracy" if key == "accuracy" else key  # unbiased by selection
            pts = [(m["step"], m.get(src, m.get(key))) for m in metrics
                   if m.get(src, m.get(key)) is not None]
            if pts:
                steps, values = zip(*pts, strict=True)
                ax.plot(steps, values, lw=0.8, alpha=0.4, label="train (sampled)")
                k = min(10, len(values))
                if k > 1:  # moving average: per-step values of 64 samples are noisy
                    smooth = [sum(values[i - k + 1:i + 1]) / k for i in range(k - 1, len(values))]
                    ax.plot(steps[k - 1:], smooth, lw=1.5, label=f"train ({k}-step mean)")
            if key == "accuracy" and evals:
                ax.plot([e["step"] for e in evals], [e["accuracy"] for e in evals], "o-",
                        label="held-out (greedy)")
            ax.set_xlabel("step")
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=8)
            fig.tight_layout()
            out = self.plots_dir / f"{key}.png"
            fig.savefig(out, dpi=110)
            plt.close(fig)
            written.append(out)
        return written
