"""Scored response groups, below ``ktae explain`` and ``ktae audit``, which both read them.

:mod:`ktae.groups.input`: one prompt and its responses (:class:`GroupInput`) and groups read
from a JSONL file; :mod:`ktae.groups.sampling`: groups sampled from a model;
:mod:`ktae.groups.scoring`: per-token log-probs, entropies and input-gradient importance
under a model; :mod:`ktae.groups.credit`: a credit's values on a batch of groups.
"""
