"""Reading a ``ktae train`` run directory: its settings, rollouts, credit and tokenizer.

What ``ktae explain`` and ``ktae audit`` need from a run, without the trainer: the
settings it was trained with (``config.yaml``, a :class:`ktae.runs.config.TrainConfig`),
its recorded rollouts (``rollouts.jsonl``, :mod:`ktae.runs.rollouts`), the credit method
the rollouts' header records, and the tokenizer that made their token ids.
"""

from __future__ import annotations

from pathlib import Path

from ktae.checkpoints import latest_complete_checkpoint
from ktae.core.methods import Method
from ktae.models.warmstart import default_model_path
from ktae.runs.config import TrainConfig
from ktae.runs.rollouts import ROLLOUTS_FILE, read_rollouts

CONFIG_FILE = "config.yaml"
"""The run's settings, written by ``ktae train`` at the start of the run."""


def run_config(run: Path) -> TrainConfig | None:
    """The settings ``run`` was trained with (unresolved, as saved), or None when it has
    no :data:`CONFIG_FILE`."""
    path = Path(run) / CONFIG_FILE
    return TrainConfig.from_file(path) if path.is_file() else None


def read_run_rollouts(run: Path) -> tuple[dict, list[dict]]:
    """The header and records of a run directory's rollouts file; a one-line error (naming
    ``INPUT``) when there is none or it is empty."""
    path = run / ROLLOUTS_FILE
    if not path.is_file():
        raise ValueError(f"INPUT: {run} holds no {ROLLOUTS_FILE} (run directories of ktae train "
                         "keep one unless --rollout-every 0)")
    header, records = read_rollouts(path)
    if not records:
        raise ValueError(f"INPUT: {path} holds no recorded groups yet")
    return header, records


def recorded_method(header: dict, *, ignore_token_ids=()) -> Method:
    """The credit method a rollouts ``header`` records: the run's estimator and calibration
    with the options the trainer gave them."""
    return Method(estimator=header["estimator"],
                  estimator_options=dict(header.get("estimator_options") or {}),
                  calibration=header.get("calibration"),
                  calibration_options=dict(header.get("calibration_options") or {}),
                  ignore_token_ids=tuple(ignore_token_ids))


def recorded_credit_name(header: dict) -> str:
    """``estimator`` or ``estimator+calibration`` of a rollouts ``header``."""
    return header["estimator"] + (f"+{header['calibration']}" if header.get("calibration")
                                  else "")


def load_tokenizer(path: str | Path):
    """A ``transformers`` tokenizer from a local directory or file."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path))
    except Exception as err:  # transformers raises OSError, ValueError, ...
        raise ValueError(f"tokenizer: cannot load a tokenizer from {path} ({err})") from err


def default_tokenizer_path() -> Path:
    return default_model_path(progress=False)


def run_tokenizer(run: Path, header: dict, tokenizer: str | None):
    """``(tokenizer, where)``: ``tokenizer`` when given, else the one saved with the run's
    final model or newest complete checkpoint, else the run's recorded model's, else the
    shipped default model's."""
    if tokenizer:
        return load_tokenizer(tokenizer), tokenizer

    for c in (run / "final", latest_complete_checkpoint(run)):
        if c and (Path(c) / "tokenizer_config.json").is_file():
            return load_tokenizer(c), str(c)
    recorded = header.get("tokenizer")
    if recorded:  # the run's model: a local directory or a hub id in the local cache
        try:
            return load_tokenizer(recorded), str(recorded)
        except ValueError as err:
            raise ValueError(f"tokenizer: the run's tokenizer {recorded!r} cannot be loaded; "
                             "pass --tokenizer PATH") from err
    path = default_tokenizer_path()
    return load_tokenizer(path), str(path)
