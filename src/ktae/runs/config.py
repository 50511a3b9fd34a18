"""``TrainConfig``: every knob of ``ktae train`` in one dataclass (CleanRL-style ``Args``).

Names follow TRL's ``GRPOConfig`` where one exists (``num_generations``, ``beta``,
``loss_type``, ``temperature``); TRL's ``epsilon``/``epsilon_high`` are called
``clip_low``/``clip_high`` here, as in the DAPO paper. Fields left as ``None`` are filled
by :meth:`TrainConfig.resolve` from the chosen ``algo`` (docs/method.md §2, §10 and §11):

=========  ==========  =============  =============  ================  ===============
algo       loss_type   advantage      clip low/high  dynamic sampling  overlong buffer
=========  ==========  =============  =============  ================  ===============
grpo       grpo        grpo (std)     0.2 / 0.2      off               off
dapo       dapo        grpo (std)     0.2 / 0.28     on                max_new_tokens/5
drgrpo     dr_grpo     drgrpo (mean)  0.2 / 0.2      off               off
=========  ==========  =============  =============  ================  ===============

``credit`` picks the token-level credit on top: ``none`` (the algo's own sequence-level
advantage), ``ktae`` (docs/method.md §3), ``taco`` (docs/method.md §8), any registered advantage
estimator or calibration name, or ``estimator+calibration`` (e.g. ``ktae+taco``).

The settings credit methods declare (:class:`ktae.core.registry.Alias`: ``ktae_ngram``,
``taco_alpha``, ...) are fields too, added from the methods' records after the ones
written here (:func:`ktae.core.methods.declared_aliases`): a method's record is the one
place that names them.

Every field is type-checked (:mod:`ktae.runs.fields`) wherever it comes from: a YAML
file, a flag, or Python. ``trl`` holds extra ``trl.GRPOConfig`` settings, checked against
TRL's own field types by :mod:`ktae.train.trl_args`. Each field declares its ``ktae train``
flag and help text in its metadata (:func:`ktae.runs.fields.flag`, read by
:mod:`ktae.train.flags`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ktae.core.baselines import SEQUENCE_BASELINES
from ktae.core.methods import check_alias_settings, declared_aliases
from ktae.core.self_distill import SelfDistill
from ktae.data import FIELDS, check_filters, parse_source
from ktae.eval.prompts import TEMPLATES
from ktae.rewards.ends import check_cut_off_rule
from ktae.rewards.registry import REWARDS, get_reward
from ktae.runs.fields import FieldError, check_value, closest, flag
from ktae.runs.rundir import atomic_write
from ktae.tasks import TEMPLATES as EMBEDDED_TEMPLATES
from ktae.tasks.arith import parse_mix, parse_task_name

ALGOS = ("grpo", "dapo", "drgrpo")
"""Algorithms accepted by ``TrainConfig.algo``."""

LOSS_TYPES = ("grpo", "dapo", "dr_grpo", "bnpo")
"""TRL loss types: grpo = seq-mean-token-mean, dapo = token-mean, dr_grpo = token-sum / L."""

LOGPROB_HEADS = ("auto", "full", "chunked")
"""How the policy's log-probs are computed (:mod:`ktae.train.logprob_head`)."""
GENERATION_BACKENDS = ("hf", "vllm", "auto")
"""Who samples the responses in ``ktae train`` (:func:`ktae.train.session.choose_generation`)."""

_ALGO_DEFAULTS: dict[str, dict[str, Any]] = {
    "grpo": dict(loss_type="grpo", advantage_base="grpo", clip_high=0.2, dynamic_sampling=False,
                 overlong_shaping=False),
    "dapo": dict(loss_type="dapo", advantage_base="grpo", clip_high=0.28, dynamic_sampling=True,
                 overlong_shaping=True),
    "drgrpo": dict(loss_type="dr_grpo", advantage_base="drgrpo", clip_high=0.2,
                   dynamic_sampling=False, overlong_shaping=False),
}


@dataclass
class _TrainConfig:
    """The fields of :class:`TrainConfig` written here, and its methods."""

    model: str | None = field(default=None, metadata=flag(
        "local path or hub id (default: the warm-started tiny model shipped inside ktae)"))
    """Local path or hub id of a causal LM; None = the cached warm-started tiny default."""
    task: str = field(default="embedded", metadata=flag(
        "embedded | math500 | jsonl:PATH | json:PATH | parquet:PATH | a save_to_disk DIR[@SPLIT] "
        "| hf:NAME[:CONFIG][@SPLIT] (verl, MATH or question/answer schema)"))
    """Training prompts: ``embedded``, ``math500``, or a dataset of :mod:`ktae.data`:
    ``jsonl:PATH``, ``json:PATH``, ``parquet:PATH``, a ``save_to_disk`` directory (``@SPLIT``
    for one split of a dict) or ``hf:NAME[:CONFIG][@SPLIT]`` (verl, MATH or question/answer
    schema)."""
    task_fields: dict[str, str] = field(default_factory=dict, metadata=flag(
        "the task column holding a field (problem, answer, solution, id, data_source), e.g. "
        "--task-field problem=query (repeatable)",
        name="--task-field", kind="pairs", metavar="FIELD=COLUMN"))
    """Field -> column of the task (``{"problem": "query", "answer": "gt"}``; fields id,
    problem, answer, solution, data_source; a dotted column reads a struct field)."""
    task_filters: dict[str, list[str]] = field(default_factory=dict, metadata=flag(
        "keep the task rows whose COLUMN takes one of the values, e.g. "
        "--task-filter 'level=Level 3,Level 4,Level 5' (repeatable)",
        name="--task-filter", kind="pairs", metavar="COLUMN=V1,V2"))
    """Column -> values: keep the task's rows whose column takes one of them."""
    task_mix: str | None = field(default=None, metadata=flag(
        "arith: the kinds' weights of the training problems, e.g. add=0.55,sub=0.34,mul=0.11 "
        "(default: the level's)"))
    """The ``arith`` task's training mix (:func:`ktae.tasks.arith.parse_mix`): each kind's
    weight, each kind refilled on its own so the drawn problems follow it; None = the
    level's weights and pools. The held-out problems are unchanged."""
    eval_task: str | None = field(default=None, metadata=flag(
        "held-out problems, a source as --task or math500 (default: the task's last fifth)"))
    """Held-out problems (a source as ``task``, or ``math500``); None = the task's last
    fifth (at most ``eval_size``; the embedded task: its test split)."""
    template: str | None = field(default=None, metadata=flag(
        "prompt template: compact | qwen-math | chat | qwen-math-system | ktae-train | dapo | "
        "raw (docs/training.md)"))
    """Prompt template (:mod:`ktae.eval.prompts`: compact, qwen-math, chat, qwen-math-system,
    ktae-train, dapo, raw); None = compact for the tiny default model, else chat for rows
    with chat prompts, the reward's template (dapo) or qwen-math."""
    reward: str = field(default="boxed", metadata=flag(
        f"reward of a response: {' | '.join(REWARDS)}"))
    """Reward of a response (:mod:`ktae.rewards.registry`): ``boxed`` (strict last box)."""
    cut_off_answers: str = field(default="wrong", metadata=flag(
        "a response cut at --max-new-tokens without ending: wrong (default) | read (scored "
        "from its text)"))
    """How a response that hit ``max_new_tokens`` without its stop token is scored, in the
    reward and in the held-out evaluation (:mod:`ktae.rewards.ends`): ``wrong``, or
    ``read`` from its text."""
    algo: str = field(default="dapo", metadata=flag(f"one of {', '.join(ALGOS)}"))
    """``grpo``, ``dapo`` or ``drgrpo``: fills the fields marked "None = algo default"."""
    credit: str = field(default="ktae", metadata=flag(
        "none | ktae | taco | any estimator/calibration | est+calib, each optionally "
        "with its settings as @KEY=VALUE (ktae@ngram=3)"))
    """``none``, ``ktae``, ``taco``, any estimator/calibration name, or ``est+calib``; the
    command line and a config file may add settings as ``ktae compare`` entries do
    (``ktae@ngram=3``: :func:`ktae.train.cli_train.credit_with_settings`)."""
    seed: int = field(default=0, metadata=flag("random seed"))
    """Seed of model init (when built), data order, sampling and dynamic-sampling refills."""
    output_dir: str | None = field(default=None, metadata=flag(
        "run directory (default runs/ALGO-CREDIT-seedS)", short="-o"))
    """Run directory; None = ``runs/{algo}-{credit}-seed{seed}``."""
    resume: bool = field(default=False, metadata=flag(
        "continue from the newest complete checkpoint in --output-dir", kind="switch"))
    """Continue from the newest complete checkpoint in ``output_dir``."""
    max_steps: int = field(default=200, metadata=flag("optimizer steps"))
    """Optimizer steps (one generation batch each)."""
    num_prompts: int = field(default=8, metadata=flag("prompts per step"))
    """Prompts per step (the global batch holds num_prompts * num_generations responses)."""
    num_generations: int = field(default=8, metadata=flag("responses per prompt (group size G)"))
    """Responses sampled per prompt (G, the group size)."""
    max_new_tokens: int = field(default=40, metadata=flag("response length budget L_max"))
    """Maximum response length L_max in tokens (TRL's max_completion_length)."""
    temperature: float = field(default=1.0, metadata=flag("sampling temperature"))
    """Sampling temperature of the rollouts."""
    learning_rate: float = field(default=3e-5, metadata=flag("learning rate", name="--lr"))
    """AdamW learning rate (TRL's default 1e-6 is far too small for the tiny model)."""
    lr_scheduler: str = field(default="constant", metadata=flag("constant | cosine | linear | ..."))
    """transformers scheduler name (constant, cosine, linear, ...); ``constant`` with a
    warm-up (``warmup_steps`` or ``warmup_ratio`` > 0) resolves to ``constant_with_warmup``."""
    warmup_steps: int = field(default=0, metadata=flag("linear warmup steps (optimizer steps)"))
    """Linear warmup steps, in optimizer steps (from 0 to ``learning_rate``)."""
    warmup_ratio: float = field(default=0.0, metadata=flag(
        "linear warmup over this share of --max-steps (instead of --warmup-steps)"))
    """Linear warmup over this share of ``max_steps`` (rounded up); excludes
    ``warmup_steps``."""
    beta: float = field(default=0.0, metadata=flag("KL coefficient (0 = no reference model)"))
    """KL coefficient to the reference model (>0 needs a model loadable from a path)."""
    clip_low: float = field(default=0.2, metadata=flag("lower clip epsilon"))
    """Lower PPO clip epsilon (TRL ``epsilon``)."""
    clip_high: float | None = field(default=None, metadata=flag(
        "upper clip epsilon (DAPO clip-higher)"))
    """Upper clip epsilon (TRL ``epsilon_high``); None = algo default (DAPO: 0.28)."""
    loss_type: str | None = field(default=None, metadata=flag(
        "loss aggregation: grpo | dapo | dr_grpo | bnpo"))
    """TRL loss aggregation (grpo/dapo/dr_grpo/bnpo); None = algo default."""
    advantage_base: str | None = field(default=None, metadata=flag(
        "baseline under KTAE: grpo | drgrpo | rloo"))
    """Sequence-level baseline under KTAE/calibration (grpo/drgrpo/rloo); None = algo default."""
    dynamic_sampling: bool | None = field(default=None, metadata=flag(
        "force DAPO dynamic sampling on", kind="on_off", off_help="force dynamic sampling off"))
    """DAPO dynamic sampling (drop all-correct/all-wrong groups, refill); None = algo default."""
    max_generation_rounds: int = field(default=3, metadata=flag("dynamic sampling round bound"))
    """Most generation rounds per step under dynamic sampling (1 = no refill)."""
    overlong_buffer: int | None = field(default=None, metadata=flag(
        "overlong shaping cache L_c (0 = off)"))
    """Overlong shaping cache L_c in tokens (0 = off); None = algo default."""
    overlong_factor: float = field(default=1.0, metadata=flag("overlong penalty factor"))
    """Overlong penalty factor."""
    estimator_options: dict[str, Any] = field(default_factory=dict, metadata=flag(
        "an option of the advantage estimator, e.g. --estimator-option top=0.5 (repeatable)",
        name="--estimator-option", kind="pairs"))
    """Extra keyword options of the advantage estimator (e.g. ``{"top": 0.5}`` for KTAE)."""
    calibration_options: dict[str, Any] = field(default_factory=dict, metadata=flag(
        "an option of the calibration, e.g. --calibration-option top_fraction=0.3 (repeatable)",
        name="--calibration-option", kind="pairs"))
    """Extra keyword options of the calibration (e.g. ``{"top_fraction": 0.3}``)."""
    self_distill: str = field(default="none", metadata=flag(
        "self-distillation loss term added to the policy loss: none | sdpo | sdpo-token | "
        "sdpg (docs/method.md §17)"))
    """A loss term from the policy's self-teacher (:mod:`ktae.train.self_distill`): SDPO's
    full-logit distillation loss, its token-level one, or SDPG's full-vocabulary KL."""
    self_distill_options: dict[str, Any] = field(default_factory=dict, metadata=flag(
        "an option of the self-distillation term, e.g. --self-distill-option beta=0.01 "
        "(repeatable; docs/method.md §17)", name="--self-distill-option", kind="pairs"))
    """Options of the term (:data:`ktae.core.self_distill.OPTIONS`)."""
    eval_every: int = field(default=50, metadata=flag(
        "held-out eval every N steps (0 = before/after only)"))
    """Held-out evaluation every this many steps (0 = only before and after)."""
    eval_steps: list[int] = field(default_factory=list, metadata=flag(
        "held-out evals at exactly these steps, comma-separated (e.g. 24,30; 0 = the "
        "untrained model); replaces --eval-every and the before/after evals", kind="list"))
    """Held-out evaluations at exactly these steps, in place of :attr:`eval_every` and the
    evaluations before and after training (0 is the untrained model); empty: those."""
    eval_size: int = field(default=300, metadata=flag("held-out problems per eval"))
    """Held-out problems per evaluation (embedded test split, greedy, strict reward)."""
    eval_split: str = field(default="test", metadata=flag(
        "held-out split of the arith task: test (default) | eval (tuning, leaving test "
        "untouched)"))
    """The ``arith`` task's split the held-out evaluation draws from: ``test`` (the task's
    held-out set), or ``eval`` (a disjoint set of computations for choosing settings
    without looking at ``test``; :mod:`ktae.tasks.arith`). Other tasks take ``test`` only."""
    save_every: int = field(default=50, metadata=flag("checkpoint every N steps (0 = at the end)"))
    """Checkpoint every this many steps (0 = only at the end)."""
    save_total_limit: int = field(default=2, metadata=flag("complete checkpoints kept (0 = all)"))
    """Complete checkpoints kept (the newest ones; 0 = keep every checkpoint)."""
    train_size: int = field(default=20000, metadata=flag("embedded training problems"))
    """Embedded-task training problems generated for the run."""
    torch_threads: int = field(default=1, metadata=flag("torch CPU threads", name="--threads"))
    """torch intra-op threads (1 is fastest for the tiny model on a busy 2-core CPU)."""
    logprob_head: str = field(default="auto", metadata=flag(
        "how the policy's log-probs are computed: auto | full | chunked (docs/step-time.md)"))
    """``full``: the model's logits of the completion positions; ``chunked``: TRL's fused LM
    head; ``auto``: full on the CPU while its peak memory for a micro-batch (about twice the
    micro-batch's logits) fits in 1 GiB (:mod:`ktae.train.logprob_head`)."""
    generation: str = field(default="hf", metadata=flag(
        "who samples: hf (transformers) | vllm (colocated vLLM) | auto (the faster here; "
        "docs/vllm.md)"))
    """``hf``: transformers' ``generate`` in the trainer's process; ``vllm``: TRL's colocated
    vLLM engine (``--trl use_vllm=true --trl vllm_mode=colocate``); ``auto``: the backend
    measured faster for this device and precision
    (:func:`ktae.train.vllm_colocate.preferred_generation_backend`), named in one line."""
    bf16: bool = field(default=False, metadata=flag(
        "bfloat16 mixed precision (a GPU, or a CPU with avx512_bf16/amx_bf16)", kind="switch"))
    """bfloat16 mixed precision: products in bfloat16, the weights that train in float32,
    a LoRA run's frozen base stored in bfloat16; refused on a CPU without native bfloat16
    instructions (:mod:`ktae.train.precision`)."""
    progress: bool = field(default=True, metadata=flag(
        "no progress bar", name="--no-progress", kind="switch"))
    """Show a progress bar with live metrics."""
    lora_r: int = field(default=0, metadata=flag(
        "LoRA rank (0 = full fine-tuning; needs the peft extra)"))
    """LoRA rank (0 = full fine-tuning); needs the ``peft`` extra."""
    lora_alpha: float | None = field(default=None, metadata=flag("LoRA alpha (default 2 * r)"))
    """LoRA scaling alpha; None = 2 * lora_r."""
    lora_dropout: float = field(default=0.0, metadata=flag("LoRA dropout"))
    """LoRA dropout."""
    lora_target_modules: list[str] = field(default_factory=lambda: ["all-linear"], metadata=flag(
        "comma-separated module names that get LoRA adapters (default all-linear)", kind="list"))
    """Modules that get adapters (names, or ``all-linear``)."""
    trl: dict[str, Any] = field(default_factory=dict, metadata=flag(
        "any other trl.GRPOConfig field, e.g. --trl use_vllm=true (repeatable)", kind="pairs"))
    """Further ``trl.GRPOConfig`` settings (``--trl KEY=VALUE``), e.g. ``use_vllm: true``."""
    rollout_every: int = field(default=10, metadata=flag(
        "keep rollouts for ktae explain every N steps (0 = off)"))
    """Keep sampled rollouts of steps 1, 1 + N, 1 + 2N, ... in ``rollouts.jsonl`` (0 = never)."""
    rollout_groups: int = field(default=4, metadata=flag("groups kept per recorded step"))
    """Groups kept per recorded step (for ``ktae explain``)."""
    no_signal_steps: int = field(default=5, metadata=flag(
        "warn after this many steps with every group all right or all wrong, or most "
        "responses truncated (0 = never)"))
    """Warn when every group is all right or all wrong (or most responses are truncated)
    for this many consecutive steps (0 = never; :mod:`ktae.train.no_signal`)."""

    def __post_init__(self) -> None:
        for name, hint in _hints().items():
            setattr(self, name, check_value(name, getattr(self, name), hint))

    # ------------------------------------------------------------------ resolution

    def resolve(self) -> TrainConfig:
        """A copy with algo defaults filled in and every field validated."""
        if self.algo not in ALGOS:
            raise ValueError(f"algo: expected one of {ALGOS}, got {self.algo!r}")
        preset = _ALGO_DEFAULTS[self.algo]
        out = dataclasses.replace(self, estimator_options=dict(self.estimator_options),
                                  task_fields=dict(self.task_fields),
                                  task_filters=_filters(self.task_filters),
                                  calibration_options=dict(self.calibration_options),
                                  self_distill_options=dict(self.self_distill_options),
                                  trl=dict(self.trl),
                                  lora_target_modules=list(self.lora_target_modules),
                                  eval_steps=sorted(set(self.eval_steps)))
        if out.clip_high is None:
            out.clip_high = preset["clip_high"]
        if out.loss_type is None:
            out.loss_type = preset["loss_type"]
        if out.advantage_base is None:
            out.advantage_base = preset["advantage_base"]
        if out.dynamic_sampling is None:
            out.dynamic_sampling = preset["dynamic_sampling"]
        if out.overlong_buffer is None:
            shaping = preset["overlong_shaping"]
            out.overlong_buffer = max(1, out.max_new_tokens // 5) if shaping else 0
        if out.output_dir is None:
            out.output_dir = f"runs/{out.algo}-{out.credit.replace('+', '-')}-seed{out.seed}"
        if out.lora_r and out.lora_alpha is None:
            out.lora_alpha = float(2 * out.lora_r)
        if out.lr_scheduler == "constant" and (out.warmup_steps > 0 or out.warmup_ratio > 0):
            out.lr_scheduler = "constant_with_warmup"  # transformers' constant ignores warmup
        out._validate()
        return out

    def _validate(self) -> None:
        if self.loss_type not in LOSS_TYPES:
            raise ValueError(f"loss_type: expected one of {LOSS_TYPES}, got {self.loss_type!r}")
        if self.advantage_base not in SEQUENCE_BASELINES:
            raise ValueError("advantage_base: expected one of "
                             f"{', '.join(repr(n) for n in SEQUENCE_BASELINES)}, "
                             f"got {self.advantage_base!r}")
        for name in ("max_steps", "num_prompts", "max_new_tokens", "max_generation_rounds",
                     "torch_threads", "train_size", "eval_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: expected a positive integer, "
                                 f"got {getattr(self, name)!r}")
        if self.num_generations < 2:
            raise ValueError("num_generations: expected an integer >= 2 (groups need two "
                             f"responses), got {self.num_generations!r}")
        for name in ("eval_every", "save_every", "save_total_limit", "warmup_steps",
                     "overlong_buffer", "seed", "lora_r", "rollout_every", "rollout_groups",
                     "no_signal_steps"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: expected a non-negative integer, "
                                 f"got {getattr(self, name)!r}")
        bad = [x for x in self.eval_steps if not 0 <= x <= self.max_steps]
        if bad:
            raise ValueError(f"eval_steps: expected steps from 0 to max_steps={self.max_steps}, "
                             f"got {bad}")
        if self.overlong_buffer >= self.max_new_tokens:
            raise ValueError(f"overlong_buffer: expected < max_new_tokens={self.max_new_tokens}, "
                             f"got {self.overlong_buffer}")
        if not 0 <= self.warmup_ratio < 1:
            raise ValueError(f"warmup_ratio: expected a share in [0, 1), got {self.warmup_ratio!r}")
        if self.warmup_ratio > 0 and self.warmup_steps > 0:
            raise ValueError(f"warmup_ratio: give warmup_steps={self.warmup_steps} or "
                             f"warmup_ratio={self.warmup_ratio}, not both")
        for name in ("learning_rate", "temperature"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}: expected > 0, got {getattr(self, name)!r}")
        for name in ("beta", "clip_low", "clip_high", "overlong_factor"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name}: expected >= 0, got {getattr(self, name)!r}")
        if self.generation not in GENERATION_BACKENDS:
            raise ValueError(f"generation: expected one of {', '.join(GENERATION_BACKENDS)}, "
                             f"got {self.generation!r}")
        if self.logprob_head not in LOGPROB_HEADS:
            raise ValueError(f"logprob_head: expected one of {', '.join(LOGPROB_HEADS)}, "
                             f"got {self.logprob_head!r}")
        check_alias_settings({a.name: getattr(self, a.name) for a in declared_aliases()})
        SelfDistill.parse(self.self_distill, self.self_distill_options)
        self._validate_data()
        if self.lora_r:
            if not self.lora_alpha > 0:
                raise ValueError(f"lora_alpha: expected > 0, got {self.lora_alpha!r}")
            if not 0 <= self.lora_dropout < 1:
                raise ValueError(f"lora_dropout: expected in [0, 1), got {self.lora_dropout!r}")
            if not self.lora_target_modules:
                raise ValueError("lora_target_modules: expected at least one module name")

    def _validate_data(self) -> None:
        for name in ("task", "eval_task"):
            value = getattr(self, name)
            if value is not None and value not in ("embedded", "math500") and (
                    parse_task_name(value) is None):
                parse_source(value, name=name)
        if self.eval_task == "embedded" or (self.eval_task is not None
                                            and parse_task_name(self.eval_task) is not None):
            raise ValueError(f"eval_task: the {self.eval_task} held-out split goes with "
                             f"--task {self.eval_task}")
        get_reward(self.reward)
        check_cut_off_rule(self.cut_off_answers)
        if self.eval_split not in ("test", "eval"):
            raise ValueError(f"eval_split: expected test or eval, got {self.eval_split!r}")
        if self.task_mix is not None:
            if parse_task_name(self.task) is None:
                raise ValueError(f"task_mix: goes with --task arith, got --task {self.task}")
            parse_mix(self.task_mix)
        if self.eval_split != "test" and parse_task_name(self.task) is None:
            raise ValueError(f"eval_split: the {self.task} task has one held-out set; eval "
                             "goes with --task arith")
        for key, column in self.task_fields.items():
            if key not in FIELDS or not isinstance(column, str) or not column:
                raise ValueError(f"task_fields: expected FIELD=COLUMN with FIELD among "
                                 f"{FIELDS}, got {key}={column!r}")
        if self.template is not None and self.template not in TEMPLATES[1:]:
            raise ValueError(f"template: expected one of {TEMPLATES[1:]}, got {self.template!r}")
        if self.task == "embedded":
            if self.task_fields or self.task_filters or self.eval_task:
                raise ValueError("task: the embedded task takes no task_fields, task_filters "
                                 "or eval_task (it has its own held-out split)")
            if self.template not in (None, *EMBEDDED_TEMPLATES):
                raise ValueError(f"template: the embedded task takes {EMBEDDED_TEMPLATES}, "
                                 f"got {self.template!r}")

    # ------------------------------------------------------------------ I/O

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of every field (JSON/YAML-serialisable)."""
        return dataclasses.asdict(self)

    def save(self, path: str | Path) -> None:
        """Write the config as YAML (``.yaml``/``.yml``) or JSON (anything else), atomically."""
        path = Path(path)
        if path.suffix in (".yaml", ".yml"):
            import yaml

            text = yaml.safe_dump(self.to_dict(), sort_keys=False)
        else:
            text = json.dumps(self.to_dict(), indent=2) + "\n"
        atomic_write(path, text)

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, source: str = "config") -> TrainConfig:
        """Build from a dict; unknown keys and wrong types raise ValueError naming them."""
        if not isinstance(data, dict):
            raise ValueError(f"{source}: expected a mapping of field names, "
                             f"got {type(data).__name__}")
        known = set(_hints())
        for key in data:
            if key in _RENAMED:
                raise ValueError(f"{source}: {key!r} is no longer a field: {_RENAMED[key]}")
            if key not in known:
                raise ValueError(f"{source}: unknown field {key!r}{closest(str(key), known)}")
        try:
            return cls(**data)
        except FieldError as err:
            raise ValueError(f"{source}: {err}") from None

    @classmethod
    def from_file(cls, path: str | Path) -> TrainConfig:
        """Load a YAML or JSON file of field values (unresolved: call :meth:`resolve`)."""
        import yaml

        path = Path(path)
        if not path.is_file():
            raise ValueError(f"config: file not found: {path}")
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError as err:
            raise ValueError(f"config {path}: not UTF-8 text ({err.reason})") from None
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            problem = getattr(err, "problem", None) or str(err).splitlines()[0]
            raise ValueError(f"config {path}: invalid YAML{where}: {problem}") from None
        return cls.from_dict(data or {}, source=f"config {path}")


def _alias_field(alias) -> tuple:
    return (alias.name, alias.type, field(default=alias.default, metadata={
        **flag(alias.help), "doc": alias.doc}))


TrainConfig = dataclasses.make_dataclass(
    "TrainConfig", [_alias_field(a) for a in declared_aliases()], bases=(_TrainConfig,),
    namespace={"__doc__": "Resolved settings of one training run (see the module "
                          "docstring for algo presets), with the settings of credit "
                          "methods (``ktae_ngram``, ``taco_alpha``, ...) last."})
TrainConfig.__module__ = __name__


#: Fields that cannot change the steps a run has trained (what is logged, evaluated, saved
#: or shown, and how fast): a resumed run may change them.
RESUMABLE_FIELDS = ("max_steps", "eval_every", "eval_steps", "save_every", "save_total_limit", "progress",
                    "torch_threads", "rollout_every", "rollout_groups", "no_signal_steps")

#: Schedulers whose learning rate at a step does not depend on ``max_steps``.
_STEP_FREE_SCHEDULERS = ("constant", "constant_with_warmup")


def resume_changes(run: TrainConfig, new: TrainConfig) -> tuple[dict, dict]:
    """How ``new`` (a resume's settings) differs from ``run`` (the run's own): ``(refused,
    allowed)``, each field -> ``(old, new)``.

    ``allowed`` holds the :data:`RESUMABLE_FIELDS` that differ; ``max_steps`` is one of them
    only under a constant schedule with no ``warmup_ratio`` (otherwise past learning rates
    depend on it).
    Everything else that differs (``output_dir`` and ``resume`` aside) is ``refused``.
    """
    old_d, new_d = run.to_dict(), new.to_dict()
    refused, allowed = {}, {}
    for name, value in new_d.items():
        if name in ("output_dir", "resume") or old_d.get(name) == value:
            continue
        resumable = name in RESUMABLE_FIELDS and not (
            name == "max_steps" and (new.lr_scheduler not in _STEP_FREE_SCHEDULERS
                                     or new.warmup_ratio > 0))
        (allowed if resumable else refused)[name] = (old_d.get(name), value)
    return refused, allowed


def _filters(filters: dict) -> dict[str, list[str]]:
    """``task_filters`` with each value a list of strings (``"a,b"`` -> ``["a", "b"]``)."""
    out = {}
    for column, values in filters.items():
        if isinstance(values, str):
            values = [v.strip() for v in values.split(",") if v.strip()]
        try:
            out[column] = list(check_filters({column: values})[column])
        except ValueError:
            raise ValueError(f"task_filters: expected COLUMN: [VALUE, ...], got "
                             f"{column}: {values!r}") from None
    return out


_RENAMED = {
    "credit_options": "use estimator_options (for the advantage estimator) or "
                      "calibration_options (for the calibration)",
}


@functools.cache
def _hints() -> dict[str, Any]:
    """Field name -> resolved type annotation of :class:`TrainConfig`."""
    hints = typing.get_type_hints(TrainConfig)
    return {f.name: hints[f.name] for f in dataclasses.fields(TrainConfig)}
