"""``ktae explain``: which tokens of sampled responses get which credit, and why.

:mod:`ktae.explain.sources` reads groups from a run directory, a JSONL file or a model;
:mod:`ktae.explain.cli` is the command. The pictures are :mod:`ktae.viz`'s.
"""
