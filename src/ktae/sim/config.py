"""Simulator settings: the study's axes, training hyper-parameters and presets."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ktae.sim.credit import parse_methods

#: The three axes of the study (TACO paper Fig. 4) and the field of :class:`Setting`
#: each one varies.
AXES = ("horizon", "n_opt", "group_size")
AXIS_LABELS = {"horizon": "H", "n_opt": "n_opt", "group_size": "G"}

PRESETS: dict[str, dict] = {
    # Small enough for a 2-core CPU in a few minutes; the paper's learning rate (the
    # number of updates, hence the cost, does not depend on it).
    "quick": dict(actions=1_000, steps=1_500, lr=0.2, seeds=5, eval_every=50,
                  methods=("broadcast", "step", "ktae", "ktae-graded", "taco", "ktae+taco")),
    # The paper's hyper-parameters (appendix "Hyper-parameters"), every method.
    "paper": dict(actions=100_000, steps=8_000, lr=0.2, seeds=10, eval_every=100,
                  methods=("all",)),
}


@dataclass(frozen=True, order=True)
class Setting:
    """One point of the study: trace length, optimal actions per step, group size."""

    horizon: int
    n_opt: int
    group_size: int

    def label(self) -> str:
        return f"H={self.horizon} n_opt={self.n_opt} G={self.group_size}"


@dataclass(frozen=True)
class SimConfig:
    """Everything a simulation run depends on."""

    horizons: tuple[int, ...] = (4, 16, 64)
    """trace lengths H of the H axis"""
    n_opts: tuple[int, ...] = (1, 10, 100)
    """optimal actions per step of the n_opt axis"""
    group_sizes: tuple[int, ...] = (4, 8, 16)
    """trajectories per update of the G axis"""
    actions: int = PRESETS["quick"]["actions"]
    """|A|, actions per step"""
    steps: int = PRESETS["quick"]["steps"]
    """SGD updates per run"""
    lr: float = PRESETS["quick"]["lr"]
    """SGD learning rate"""
    seeds: int = PRESETS["quick"]["seeds"]
    """independent runs per (method, setting): seeds first_seed..first_seed+seeds-1"""
    first_seed: int = 0
    """the first seed (seeds kept aside for a final table start later)"""
    eval_every: int = PRESETS["quick"]["eval_every"]
    """updates between evaluations (also at step 0 and at the last step)"""
    methods: tuple[str, ...] = PRESETS["quick"]["methods"]
    """method names (see ktae.sim.credit); 'all' expands"""
    ktae_threshold: float | None = None
    """KTAE correctness: None = return above the group mean, else return > threshold"""
    ktae_ngram: int = 1
    """KTAE span length: 1 = single (step, action) tokens; N > 1 = spans of N steps"""
    target: float = 0.9
    """steps-to-target: first evaluation with expected normalised return >= target"""
    audit_groups: int = 32
    """probe groups per run scored against the MDP's exact labels at each audited update
    (ktae.sim.blame); 0 = no audit"""
    audit_updates: tuple[int, ...] | None = None
    """updates at which the probe groups are drawn (the policy after that many updates);
    None = 0 and the last update (the initial and the final policy)"""
    device: str = "cpu"
    """torch device of the simulation"""
    block_elements: int = 1 << 25
    """memory bound: runs are simulated together in blocks of at most this many
    (row, action) logits (a single larger run still forms its own block)"""

    def __post_init__(self) -> None:
        for name in ("horizons", "n_opts", "group_sizes"):
            values = getattr(self, name)
            if not values:
                raise ValueError(f"{name}: expected at least one value")
            for v in values:
                if isinstance(v, bool) or not isinstance(v, int):
                    raise ValueError(f"{name}: expected integers, got {v!r}")
        _positive("actions", self.actions)
        _positive("steps", self.steps)
        _positive("seeds", self.seeds)
        if isinstance(self.first_seed, bool) or not isinstance(self.first_seed, int) \
                or self.first_seed < 0:
            raise ValueError(f"first_seed: expected an integer >= 0, got {self.first_seed!r}")
        _positive("eval_every", self.eval_every)
        _positive("block_elements", self.block_elements)
        for h in self.horizons:
            _positive("horizon", h)
        for n in self.n_opts:
            _positive("n_opt", n)
            if n > self.actions:
                raise ValueError(f"n_opt: expected at most actions = {self.actions} optimal "
                                 f"actions per step, got {n}")
        for g in self.group_sizes:
            if g < 2:
                raise ValueError(f"group_size: expected >= 2 trajectories per group "
                                 f"(group-normalised credit needs two), got {g}")
        if not (self.lr > 0 and self.lr < float("inf")):
            raise ValueError(f"lr: expected a positive learning rate, got {self.lr}")
        if not 0 < self.target <= 1:
            raise ValueError(f"target: expected a normalised return in (0, 1], got {self.target}")
        if self.ktae_threshold is not None and not -float("inf") < self.ktae_threshold < float("inf"):
            raise ValueError(f"ktae_threshold: expected a finite number, got {self.ktae_threshold}")
        _positive("ktae_ngram", self.ktae_ngram)
        if isinstance(self.audit_groups, bool) or not isinstance(self.audit_groups, int) \
                or self.audit_groups < 0:
            raise ValueError(f"audit_groups: expected an integer >= 0, got {self.audit_groups!r}")
        if self.audit_updates is not None:
            if not self.audit_updates:
                raise ValueError("audit_updates: expected at least one update")
            for u in self.audit_updates:
                if isinstance(u, bool) or not isinstance(u, int) or not 0 <= u <= self.steps:
                    raise ValueError(f"audit_updates: expected updates between 0 and steps = "
                                     f"{self.steps}, got {u!r}")
        parse_methods(self.methods)

    @classmethod
    def preset(cls, name: str, **overrides) -> SimConfig:
        """The ``quick`` or ``paper`` preset with any field overridden."""
        if name not in PRESETS:
            raise ValueError(f"preset: expected one of {', '.join(PRESETS)}, got {name!r}")
        return cls(**{**PRESETS[name], **overrides})

    @property
    def method_names(self) -> tuple[str, ...]:
        return tuple(m.name for m in parse_methods(self.methods))

    def axis_values(self, axis: str) -> tuple[int, ...]:
        return {"horizon": self.horizons, "n_opt": self.n_opts,
                "group_size": self.group_sizes}[axis]

    @property
    def base(self) -> Setting:
        """The setting every axis shares: the middle value of each list."""
        return Setting(*(vals[len(vals) // 2] for vals in map(self.axis_values, AXES)))

    def axis_settings(self, axis: str) -> list[Setting]:
        """The settings of one axis: its values, the other two at the base setting."""
        return [dataclasses.replace(self.base, **{axis: v}) for v in self.axis_values(axis)]

    def settings(self) -> list[Setting]:
        """Every distinct setting of the three axes, in axis order."""
        out: list[Setting] = []
        for axis in AXES:
            out += [s for s in self.axis_settings(axis) if s not in out]
        return out

    def audited_updates(self) -> list[int]:
        """The updates whose policy is audited (none when ``audit_groups`` is 0)."""
        if self.audit_groups == 0:
            return []
        chosen = (0, self.steps) if self.audit_updates is None else self.audit_updates
        return sorted(set(chosen))

    def eval_steps(self) -> list[int]:
        steps = list(range(0, self.steps + 1, self.eval_every))
        return steps if steps[-1] == self.steps else [*steps, self.steps]


def _positive(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}: expected a positive integer, got {value!r}")
