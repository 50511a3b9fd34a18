"""The TACO paper's synthetic MDP (docs/method.md §14): every credit method against the oracle.

A controlled sequential task where the true per-step credit is known, so that credit
methods (broadcast GRPO, KTAE, TACO and its ablations and baselines, compositions) can
be ranked against the step-level oracle. Modules:

- :mod:`ktae.sim.mdp`: the MDP and its tabular per-step softmax policy (pure tensors);
- :mod:`ktae.sim.credit`: the methods, each a thin call into the public ``ktae`` API;
- :mod:`ktae.sim.config`: settings, axes and presets;
- :mod:`ktae.sim.run`: the vectorised training loop;
- :mod:`ktae.sim.report` and :mod:`ktae.sim.plots`: tables, claims, JSON and figures;
- :mod:`ktae.sim.cli`: ``ktae simulate``.

Example:
    >>> from ktae.sim import SimConfig, simulate
    >>> cfg = SimConfig(horizons=(4,), n_opts=(2,), group_sizes=(4,), actions=20,
    ...                 steps=10, seeds=2, eval_every=5, methods=("broadcast", "step"))
    >>> result = simulate(cfg)
    >>> result.curves[("step", cfg.base)].shape  # seeds x evaluations
    torch.Size([2, 3])
"""

from ktae.sim.config import PRESETS, Setting, SimConfig
from ktae.sim.run import SimResult, simulate

__all__ = ["PRESETS", "Setting", "SimConfig", "SimResult", "simulate"]
