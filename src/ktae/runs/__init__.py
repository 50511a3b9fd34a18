"""The ``ktae train`` run directory: its format, written by the trainer and read by every
command that reads a run (``ktae train --resume``, ``ktae compare``, ``ktae explain``,
``ktae audit``).

Submodules: ``config`` (:class:`TrainConfig`, the run's ``config.yaml``; ``fields``: its
typed values), ``credit`` (a run's credit settings from its config), ``rollouts``
(``rollouts.jsonl``: the recorder and the reader), ``rundir`` (markers, checkpoints,
metrics files), ``reader`` (a run's config, rollouts, recorded credit and tokenizer, for
the commands that read a run). Nothing here imports the trainer (:mod:`ktae.train`) or
TRL; the explainers and the audit read runs through this package.
"""
