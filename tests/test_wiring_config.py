"""Every ``TrainConfig`` field reaches what it controls (the README's "every option is a
promise"), table-driven from ``dataclasses.fields(TrainConfig)``.

:data:`NON_DEFAULT` gives each field a value other than its default and :data:`CHECKS` a
function that sets it and checks its effect where ``ktae train`` uses it: the
``GRPOConfig`` of :func:`grpo_config`, the :class:`CreditSettings` of
:func:`credit_settings`, the task rows of :func:`preflight`, the LoRA config, or what
:func:`train` hands to the trainer (a probe trainer records its arguments and stops the
run before any step). Both dicts must hold exactly the dataclass's fields, so a new field
without a wiring check fails this module by itself. No model is trained here.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from test_train_helpers import tiny_config

from ktae.runs.config import TrainConfig
from ktae.runs.credit import credit_settings
from ktae.train.session import grpo_config, lora_config, preflight

# --------------------------------------------------------------------------- helpers


class _Stop(Exception):
    """Ends a probed ``train()`` once the trainer is built."""


class Probe:
    """Stands in for ``KTAEGRPOTrainer``: keeps what ``train()`` gives it, trains nothing."""

    last: Probe | None = None

    def __init__(self, **kwargs):
        self.kw = kwargs
        self.model = kwargs["model"]
        self.rollouts = None
        self.threads = torch.get_num_threads()
        Probe.last = self

    def remove_callback(self, callback):
        pass

    def callback(self, cls):
        found = [c for c in self.kw["callbacks"] if isinstance(c, cls)]
        return found[0] if found else None


@pytest.fixture
def probe(monkeypatch, tiny_model, tmp_path):
    """``probe(**overrides)``: run ``train()`` on a tiny config up to the held-out evaluation
    before step 1, and return the :class:`Probe` holding what the trainer was given."""
    from ktae.train.callbacks import EvalCallback

    def stop(self, model, step):
        raise _Stop

    monkeypatch.setattr(EvalCallback, "evaluate", stop)
    threads = torch.get_num_threads()
    runs = iter(range(1000))

    def run(**overrides):
        from ktae.train.session import train

        overrides.setdefault("model", str(tiny_model))
        cfg = tiny_config(overrides.pop("model"), tmp_path / f"run{next(runs)}", **overrides)
        Probe.last = None
        try:
            with pytest.raises(_Stop):
                train(cfg, trainer_cls=Probe)
        finally:
            torch.set_num_threads(threads)
        return cfg, Probe.last

    return run


def cfg_with(**overrides) -> TrainConfig:
    base = dict(output_dir="unused", max_steps=2, num_prompts=4, num_generations=4,
                max_new_tokens=10, train_size=64, eval_size=8, progress=False)
    base.update(overrides)
    return TrainConfig(**base).resolve()


def args_with(**overrides):
    return grpo_config(cfg_with(**overrides), 1)


@pytest.fixture
def task_file(tmp_path):
    """A jsonl task in its own column names: query, gt, level (20 rows, levels 1 and 2)."""
    path = tmp_path / "task.jsonl"
    rows = [{"query": f"What is {i} + 1?", "gt": str(i + 1), "level": str(1 + i % 2)}
            for i in range(20)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    held = tmp_path / "held.jsonl"
    held.write_text("".join(json.dumps({"problem": f"held {i}?", "answer": str(i)}) + "\n"
                            for i in range(6)))
    return path, held


_FIELDS = {"problem": "query", "answer": "gt"}


def _task(task_file, **overrides):
    path, _ = task_file
    return preflight(cfg_with(task=f"jsonl:{path}", task_fields=dict(_FIELDS),
                              **overrides)).task


# --------------------------------------------------------------------------- the table

NON_DEFAULT = {
    "model": "TINY",  # the tiny model fixture's path
    "task": "FILE",  # the task_file fixture
    "task_fields": dict(_FIELDS),
    "task_filters": {"level": ["2"]},
    "eval_task": "HELD",
    "template": "qwen-math",
    "reward": "gsm8k",
    "cut_off_answers": "read",
    "eval_split": "eval",
    "task_mix": "mul=1",
    "algo": "drgrpo",
    "credit": "ktae+taco",
    "seed": 7,
    "output_dir": "OUT",
    "resume": True,
    "max_steps": 13,
    "num_prompts": 3,
    "num_generations": 5,
    "max_new_tokens": 17,
    "temperature": 0.7,
    "learning_rate": 1.5e-4,
    "lr_scheduler": "cosine",
    "warmup_steps": 4,
    "warmup_ratio": 0.25,
    "beta": 0.04,
    "clip_low": 0.15,
    "clip_high": 0.31,
    "loss_type": "bnpo",
    "advantage_base": "rloo",
    "dynamic_sampling": True,
    "max_generation_rounds": 5,
    "overlong_buffer": 4,
    "overlong_factor": 0.5,
    "ktae_h1": 0.5,
    "ktae_h2": 2.0,
    "ktae_h3": 0.25,
    "ktae_mode": "reference",
    "ktae_ngram": 2,
    "ktae_ngram_reduce": "maxabs",
    "taco_alpha": 0.3,
    "taco_lambda": 0.5,
    "estimator_options": {"top": 0.5},
    "calibration_options": {"top_fraction": 0.3},
    "self_distill": "sdpg",
    "self_distill_options": {"beta": 0.02},
    "eval_every": 3,
    "eval_steps": [0, 2],
    "eval_size": 5,
    "save_every": 6,
    "save_total_limit": 0,
    "train_size": 33,
    "torch_threads": 2,
    "logprob_head": "chunked",
    "generation": "vllm",
    "bf16": True,
    "progress": False,
    "lora_r": 4,
    "lora_alpha": 12.0,
    "lora_dropout": 0.1,
    "lora_target_modules": ["q_proj", "v_proj"],
    "trl": {"top_k": 3},
    "rollout_every": 3,
    "rollout_groups": 2,
    "no_signal_steps": 3,
}
"""A non-default value per field (strings in capitals: filled in by the check)."""


def check_model(ctx):
    cfg, p = ctx.probe(model=str(ctx.tiny_model))
    assert preflight(cfg).model == str(ctx.tiny_model)
    assert p.model.config.hidden_size == 32 and p.model.config.num_hidden_layers == 1


def check_task(ctx):
    rows = _task(ctx.task_file)
    assert rows.embedded is False
    assert {e.problem for e in rows.train + rows.eval} == {f"What is {i} + 1?" for i in range(20)}


def check_task_fields(ctx):
    rows = _task(ctx.task_file)
    assert {(e.problem, e.answer) for e in rows.train} <= {
        (f"What is {i} + 1?", str(i + 1)) for i in range(20)}
    path, _ = ctx.task_file
    with pytest.raises(ValueError):  # without the mapping the columns are unknown
        preflight(cfg_with(task=f"jsonl:{path}"))


def check_task_filters(ctx):
    rows = _task(ctx.task_file, task_filters=NON_DEFAULT["task_filters"])
    kept = {int(e.answer) - 1 for e in rows.train + rows.eval}
    assert kept == set(range(1, 20, 2))


def check_eval_task(ctx):
    path, held = ctx.task_file
    rows = _task(ctx.task_file, eval_task=f"jsonl:{held}", eval_size=4)
    assert [e.problem for e in rows.eval] == [f"held {i}?" for i in range(4)]
    assert len(rows.train) == 20


def check_template(ctx):
    cfg, p = ctx.probe(template="qwen-math")
    assert p.kw["generation_defaults"]["template"] == "qwen-math"
    _, plain = ctx.probe()
    assert plain.kw["generation_defaults"]["template"] == "compact"
    prompt = p.kw["train_dataset"][0]["prompt"]
    assert prompt != plain.kw["train_dataset"][0]["prompt"]


def check_reward(ctx):
    from ktae.train.callbacks import EvalCallback

    ended = [[5, 0], [5, 0]]  # each response's ids end with a stop id
    _, p = ctx.probe(reward="gsm8k")
    accuracy = p.kw["reward_funcs"][0]
    accuracy.stop_ids = frozenset({0})  # what KTAEGRPOTrainer gives it
    assert accuracy(["#### 12", "\\boxed{12}"], answer=["12", "12"], completion_ids=ended) == \
        [1.0, 0.0]
    assert p.callback(EvalCallback).reward == "gsm8k"
    _, plain = ctx.probe()
    plain_accuracy = plain.kw["reward_funcs"][0]
    plain_accuracy.stop_ids = frozenset({0})
    assert plain_accuracy(["#### 12", "\\boxed{12}"], answer=["12", "12"],
                          completion_ids=ended) == [0.0, 1.0]


def check_cut_off_answers(ctx):
    from ktae.train.callbacks import EvalCallback

    cut = [[5, 6]]  # ids that end without a stop id: cut at the budget
    _, p = ctx.probe(cut_off_answers="read")
    reading = p.kw["reward_funcs"][0]
    assert reading(["\\boxed{12}"], answer=["12"], completion_ids=cut) == [1.0]
    assert p.callback(EvalCallback).cut_off == "read"
    _, plain = ctx.probe()
    strict = plain.kw["reward_funcs"][0]
    strict.stop_ids = frozenset({0})
    assert strict(["\\boxed{12}"], answer=["12"], completion_ids=cut) == [0.0]
    assert plain.callback(EvalCallback).cut_off == "wrong"


def check_eval_split(ctx):
    held = preflight(cfg_with(task="arith@difficulty=0", eval_split="eval", eval_size=5)).task
    assert all(e.id.startswith("arith-eval-0-") for e in held.eval)
    test = preflight(cfg_with(task="arith@difficulty=0", eval_size=5)).task
    assert all(e.id.startswith("arith-test-0-") for e in test.eval)


def check_task_mix(ctx):
    from ktae.tasks import arith

    rows = preflight(cfg_with(task="arith@difficulty=0", task_mix="mul=1", train_size=40)).task
    assert {arith.problem_in(e.problem).kind for e in rows.train} == {"mul"}
    plain = preflight(cfg_with(task="arith@difficulty=0", train_size=40)).task
    assert len({arith.problem_in(e.problem).kind for e in plain.train}) == 3


def check_algo(ctx):
    cfg = cfg_with(algo="drgrpo", credit="none")
    assert (cfg.loss_type, cfg.advantage_base, cfg.clip_high, cfg.dynamic_sampling,
            cfg.overlong_buffer) == ("dr_grpo", "drgrpo", 0.2, False, 0)
    assert grpo_config(cfg, 1).loss_type == "dr_grpo"
    assert credit_settings(cfg).estimator == "drgrpo"


def check_credit(ctx):
    s = credit_settings(cfg_with(credit="ktae+taco"))
    assert (s.estimator, s.calibration) == ("ktae", "taco")
    _, p = ctx.probe(algo="grpo", credit="gtpo+stapo")
    assert (p.kw["credit"].estimator, p.kw["credit"].calibration) == ("gtpo", "stapo")


def check_seed(ctx):
    cfg = cfg_with(seed=7)
    assert grpo_config(cfg, 1).seed == 7 and credit_settings(cfg).seed == 7
    assert cfg.output_dir == "unused"
    first = [e.question for e in preflight(cfg).task.train[:8]]
    assert first != [e.question for e in preflight(cfg_with()).task.train[:8]]


def check_output_dir(ctx):
    assert args_with(output_dir=str(ctx.tmp_path / "x")).output_dir == str(ctx.tmp_path / "x")
    cfg, _ = ctx.probe()
    assert TrainConfig.from_file(ctx.tmp_path_of(cfg) / "config.yaml").output_dir == \
        cfg.output_dir


def check_resume(ctx):
    from ktae.train import session

    seen = []
    real = session.prepare_output_dir

    def recording(out, *, resume, write):
        seen.append(resume)
        return real(out, resume=resume, write=write)

    ctx.monkeypatch.setattr(session, "prepare_output_dir", recording)
    ctx.probe(resume=True)
    ctx.probe()
    assert seen == [True, True, False, False]


def check_max_steps(ctx):
    assert args_with(max_steps=13).max_steps == 13


def check_num_prompts(ctx):
    args = args_with(num_prompts=3, num_generations=4)
    assert args.per_device_train_batch_size * args.gradient_accumulation_steps == 12


def check_num_generations(ctx):
    args = args_with(num_prompts=2, num_generations=5)
    assert args.num_generations == 5 and args.per_device_train_batch_size == 10


def check_max_new_tokens(ctx):
    assert args_with(max_new_tokens=17).max_completion_length == 17
    _, p = ctx.probe(max_new_tokens=17, overlong_buffer=4)
    overlong = p.kw["reward_funcs"][1]
    assert overlong(completion_ids=[[7] * 13, [7] * 17]) == [0.0, -1.0]  # L_max = 17
    assert p.kw["generation_defaults"]["max_new_tokens"] == 17


def check_temperature(ctx):
    assert args_with(temperature=0.7).temperature == 0.7


def check_learning_rate(ctx):
    assert args_with(learning_rate=1.5e-4).learning_rate == 1.5e-4


def check_lr_scheduler(ctx):
    assert args_with(lr_scheduler="cosine").lr_scheduler_type == "cosine"


def check_warmup_steps(ctx):
    assert args_with(warmup_steps=4).warmup_steps == 4


def check_warmup_ratio(ctx):
    args = args_with(warmup_ratio=0.25, max_steps=10)
    assert args.get_warmup_steps(10) == 3  # ceil(0.25 * 10)
    assert args.lr_scheduler_type == "constant_with_warmup"
    with pytest.raises(ValueError, match="warmup_ratio: give warmup_steps=4 or"):
        cfg_with(warmup_ratio=0.25, warmup_steps=4)


def check_beta(ctx):
    assert args_with(beta=0.04).beta == 0.04
    assert args_with().beta == 0.0


def check_clip_low(ctx):
    args = args_with(clip_low=0.15, clip_high=0.3)
    assert (args.epsilon, args.epsilon_high) == (0.15, 0.3)


def check_clip_high(ctx):
    args = args_with(clip_high=0.31)
    assert (args.epsilon, args.epsilon_high) == (0.2, 0.31)
    assert args_with(algo="dapo").epsilon_high == 0.28  # the algo's default reaches TRL too


def check_loss_type(ctx):
    assert args_with(loss_type="bnpo").loss_type == "bnpo"


def check_advantage_base(ctx):
    assert credit_settings(cfg_with(credit="none", advantage_base="rloo")).estimator == "rloo"
    s = credit_settings(cfg_with(credit="ktae", advantage_base="rloo"))
    assert s.estimator_options["base"] == "rloo"


def check_dynamic_sampling(ctx):
    assert credit_settings(cfg_with(algo="grpo", dynamic_sampling=True)).dynamic_sampling
    assert not credit_settings(cfg_with(algo="dapo", dynamic_sampling=False)).dynamic_sampling


def check_max_generation_rounds(ctx):
    assert credit_settings(cfg_with(max_generation_rounds=5)).max_generation_rounds == 5


def check_overlong_buffer(ctx):
    _, p = ctx.probe(algo="grpo", max_new_tokens=8, overlong_buffer=4)
    assert len(p.kw["reward_funcs"]) == 2
    overlong = p.kw["reward_funcs"][1]
    # DAPO (docs/method.md §11): 0 up to L_max - L_c = 4 tokens, then linear down to -1 at L_max = 8
    assert overlong(completion_ids=[[7] * n for n in (3, 4, 6, 8)]) == [0.0, 0.0, -0.5, -1.0]
    _, off = ctx.probe(algo="grpo", max_new_tokens=8)
    assert len(off.kw["reward_funcs"]) == 1


def check_overlong_factor(ctx):
    _, p = ctx.probe(algo="grpo", max_new_tokens=8, overlong_buffer=4, overlong_factor=0.5)
    assert p.kw["reward_funcs"][1](completion_ids=[[7] * 6, [7] * 8]) == [-0.25, -0.5]


def _estimator_options(**overrides):
    return credit_settings(cfg_with(credit="ktae", **overrides)).estimator_options


def check_ktae_h1(ctx):
    assert _estimator_options(ktae_h1=0.5)["h1"] == 0.5


def check_ktae_h2(ctx):
    assert _estimator_options(ktae_h2=2.0)["h2"] == 2.0


def check_ktae_h3(ctx):
    assert _estimator_options(ktae_h3=0.25)["h3"] == 0.25


def check_ktae_mode(ctx):
    assert _estimator_options(ktae_mode="reference")["mode"] == "reference"


def check_ktae_ngram(ctx):
    assert _estimator_options(ktae_ngram=2)["ngram"] == 2


def check_ktae_ngram_reduce(ctx):
    assert _estimator_options(ktae_ngram=2, ktae_ngram_reduce="maxabs")["ngram_reduce"] == \
        "maxabs"


def check_taco_alpha(ctx):
    s = credit_settings(cfg_with(credit="taco", taco_alpha=0.3))
    assert s.calibration_options == {"alpha": 0.3}


def check_taco_lambda(ctx):
    s = credit_settings(cfg_with(credit="taco", taco_lambda=0.5))
    assert s.calibration_options == {"lam": 0.5}
    s = credit_settings(cfg_with(credit="ktae+taco", taco_alpha=0.3, taco_lambda=0.5))
    assert s.calibration_options == {"alpha": 0.3, "lam": 0.5}


def check_estimator_options(ctx):
    assert _estimator_options(estimator_options={"top": 0.5})["top"] == 0.5


def check_calibration_options(ctx):
    s = credit_settings(cfg_with(credit="forking-tokens",
                                 calibration_options={"top_fraction": 0.3}))
    assert s.calibration_options == {"top_fraction": 0.3}


def check_self_distill(ctx):
    s = credit_settings(cfg_with(self_distill="sdpo-token"))
    assert s.self_distill.kind == "sdpo-token" and s.self_distill.options["is_clip"] == 2.0
    assert credit_settings(cfg_with()).self_distill is None


def check_self_distill_options(ctx):
    s = credit_settings(cfg_with(self_distill="sdpg", self_distill_options={"beta": "0.02"}))
    assert s.self_distill.options["beta"] == 0.02


def check_eval_every(ctx):
    from ktae.train.callbacks import EvalCallback

    _, p = ctx.probe(eval_every=3)
    assert p.callback(EvalCallback).every == 3


def check_eval_steps(ctx):
    from ktae.train.callbacks import EvalCallback

    _, p = ctx.probe(eval_steps=[2, 0])  # the probe stops at the evaluation of step 0
    assert p.callback(EvalCallback).steps == {0, 2}


def check_eval_size(ctx):
    assert len(preflight(cfg_with(eval_size=5)).task.eval) == 5
    _, p = ctx.probe(eval_size=5)
    from ktae.train.callbacks import EvalCallback

    assert len(p.callback(EvalCallback).rows) == 5


def check_save_every(ctx):
    args = args_with(save_every=6)
    assert (args.save_strategy, args.save_steps) == ("steps", 6)


def check_save_total_limit(ctx):
    assert args_with(save_total_limit=5).save_total_limit == 5
    assert args_with(save_total_limit=0).save_total_limit is None  # keep every checkpoint
    assert args_with().save_total_limit == 2


def check_train_size(ctx):
    assert len(preflight(cfg_with(train_size=33)).task.train) == 33
    _, p = ctx.probe(train_size=33)
    assert len(p.kw["train_dataset"]) == 33


def check_torch_threads(ctx):
    _, p = ctx.probe(torch_threads=2)
    assert p.threads == 2
    _, p = ctx.probe(torch_threads=1)
    assert p.threads == 1


def check_logprob_head(ctx):
    _, p = ctx.probe(logprob_head="chunked")
    assert p.kw["logprob_head"] == "chunked"
    _, default = ctx.probe()
    assert default.kw["logprob_head"] == "auto"


def check_bf16(ctx):
    from ktae.train.session import load_model

    lora = cfg_with(model=str(ctx.tiny_model), bf16=True, lora_r=4)
    assert load_model(lora)[0].dtype == torch.bfloat16  # the frozen base
    full = cfg_with(model=str(ctx.tiny_model), bf16=True)
    assert load_model(full)[0].dtype == torch.float32  # trained weights stay float32
    assert load_model(cfg_with(model=str(ctx.tiny_model)))[0].dtype == torch.float32
    assert grpo_config(full, 1).bf16 is True  # autocast's products in bfloat16


def check_generation(ctx):
    from ktae.eval.vllm_engine import vllm_distribution

    _, p = ctx.probe(generation="hf")
    assert p.kw["args"].use_vllm is False
    if vllm_distribution() is None:  # the backend reaches TRL's settings and their check
        with pytest.raises(ValueError, match="use_vllm: vLLM is not installed"):
            ctx.probe(generation="vllm")


def check_progress(ctx):
    from ktae.train.callbacks import ProgressCallback

    _, on = ctx.probe(progress=True)
    _, off = ctx.probe(progress=False)
    assert on.callback(ProgressCallback) is not None and off.callback(ProgressCallback) is None


def check_lora_r(ctx):
    pytest.importorskip("peft")
    _, p = ctx.probe(lora_r=4)
    assert p.kw["peft_config"].r == 4 and p.kw["peft_config"].lora_alpha == 8.0
    _, full = ctx.probe()
    assert full.kw["peft_config"] is None


def check_lora_alpha(ctx):
    pytest.importorskip("peft")
    assert lora_config(cfg_with(lora_r=4, lora_alpha=12.0)).lora_alpha == 12.0


def check_lora_dropout(ctx):
    pytest.importorskip("peft")
    assert lora_config(cfg_with(lora_r=4, lora_dropout=0.1)).lora_dropout == 0.1


def check_lora_target_modules(ctx):
    pytest.importorskip("peft")
    got = lora_config(cfg_with(lora_r=4, lora_target_modules=["q_proj", "v_proj"]))
    assert set(got.target_modules) == {"q_proj", "v_proj"}
    assert lora_config(cfg_with(lora_r=4)).target_modules == "all-linear"


def check_trl(ctx):
    assert args_with(trl={"top_k": 3}).top_k == 3
    _, p = ctx.probe(trl={"top_k": 3})
    assert p.kw["args"].top_k == 3


def check_rollout_every(ctx):
    _, p = ctx.probe(rollout_every=3)
    assert p.rollouts.every == 3
    _, off = ctx.probe(rollout_every=0)
    assert off.rollouts is None


def check_rollout_groups(ctx):
    _, p = ctx.probe(rollout_groups=2)
    assert p.rollouts.groups == 2


def check_no_signal_steps(ctx):
    from ktae.train.callbacks import NoSignalCallback

    _, p = ctx.probe(no_signal_steps=3)
    assert p.callback(NoSignalCallback).steps == 3
    _, off = ctx.probe(no_signal_steps=0)
    assert off.callback(NoSignalCallback).steps == 0


CHECKS = {name[len("check_"):]: fn for name, fn in list(globals().items())
          if name.startswith("check_") and callable(fn)}
"""Field -> the check that its value reaches what it controls."""


# --------------------------------------------------------------------------- the tests

FIELD_NAMES = [f.name for f in dataclasses.fields(TrainConfig)]


def test_every_field_has_a_wiring_check_and_a_value():
    assert set(CHECKS) == set(FIELD_NAMES), "a TrainConfig field needs a check_<field> here"
    assert set(NON_DEFAULT) == set(FIELD_NAMES), "a TrainConfig field needs a NON_DEFAULT value"


def _default(f: dataclasses.Field):
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


@pytest.mark.parametrize("name", FIELD_NAMES)
def test_non_default_values_differ_from_defaults(name):
    f = next(f for f in dataclasses.fields(TrainConfig) if f.name == name)
    assert NON_DEFAULT[name] != _default(f)


@dataclasses.dataclass
class Ctx:
    tiny_model: object
    task_file: tuple
    tmp_path: object
    monkeypatch: object
    probe: object

    @staticmethod
    def tmp_path_of(cfg):
        from pathlib import Path

        return Path(cfg.output_dir)


@pytest.mark.parametrize("name", FIELD_NAMES)
def test_field_reaches_what_it_controls(name, tiny_model, task_file, tmp_path, monkeypatch,
                                        probe):
    CHECKS[name](Ctx(tiny_model, task_file, tmp_path, monkeypatch, probe))


def test_every_field_survives_the_saved_config(tiny_model, task_file, tmp_path):
    """``config.yaml`` (what the model card tells to rerun) keeps every non-default value."""
    path, held = task_file
    fill = {"TINY": str(tiny_model), "FILE": f"jsonl:{path}", "HELD": f"jsonl:{held}",
            "OUT": str(tmp_path / "out")}
    values = {k: fill.get(v, v) if isinstance(v, str) else v for k, v in NON_DEFAULT.items()}
    cfg = TrainConfig(**values)
    for suffix in ("yaml", "json"):
        cfg.save(tmp_path / f"config.{suffix}")
        loaded = TrainConfig.from_file(tmp_path / f"config.{suffix}")
        for name in FIELD_NAMES:
            assert getattr(loaded, name) == getattr(cfg, name), (suffix, name)


def test_model_card_shows_the_run_settings(tmp_path):
    """The card beside the weights states the settings that define the run."""
    from ktae.train.session import model_card

    cfg = cfg_with(output_dir=str(tmp_path / "my-run"), algo="grpo", credit="ktae+taco",
                   loss_type="bnpo", clip_low=0.15, clip_high=0.31, dynamic_sampling=True,
                   reward="gsm8k", num_prompts=3, num_generations=5, max_new_tokens=17,
                   lora_r=4, lora_target_modules=["q_proj", "v_proj"])
    card = model_card(cfg, {"model": "base/model", "template": "qwen-math", "steps": 9,
                            "heldout_before": 0.25, "heldout_after": 0.5})
    for text in ("# my-run", "GRPO with `ktae+taco` credit", "loss `bnpo`", "clip 0.15/0.31",
                 "dynamic sampling on", "| reward | `gsm8k` |", "9 x 3 prompts x 5 responses",
                 "at most 17 new tokens", "template `qwen-math`", "`base/model`",
                 "25.0% -> 50.0%", "r=4, alpha=8.0, targets q_proj, v_proj",
                 str(tmp_path / "my-run" / "config.yaml")):
        assert text in card, text


@pytest.mark.parametrize("credit, parts", [
    ("none+taco", ("grpo", "taco")), ("taco+none", ("grpo", "taco")),
    ("taco+ktae", ("ktae", "taco")), ("none", ("grpo", None)), (" ktae + taco ", ("ktae", "taco")),
])
def test_credit_parts_reach_the_settings_in_any_order(credit, parts):
    s = credit_settings(cfg_with(algo="grpo", credit=credit))
    assert (s.estimator, s.calibration) == parts
    assert s.calibration_options == {} and isinstance(s.calibration_options, dict)


@pytest.mark.parametrize("credit", ["ktae+ktae", "taco+taco", "ktae+gtpo", "+", "magic"])
def test_a_credit_names_one_estimator_and_one_calibration_at_most(credit):
    with pytest.raises(ValueError, match="credit: "):
        credit_settings(cfg_with(credit=credit))


# ---- what ktae fixes in TRL's arguments, whatever the user sets ----------------------------------

def test_grpo_config_fixed_settings():
    """The settings ktae's runs rely on and no field changes: one policy update per
    generated batch (``num_iterations=1``, a generation per accumulation step), full-vocabulary
    sampling (``top_p=1``), a log line per step, checkpoints by steps, the dataset's columns
    kept for the reward functions, shuffled prompts, no worker processes, no TRL bars."""
    args = grpo_config(cfg_with(num_prompts=4, num_generations=4), 2,
                       trl={"gradient_accumulation_steps": 2})
    assert args.per_device_train_batch_size == 4  # 16 responses over 2 processes x 2 steps
    assert type(args.per_device_train_batch_size) is int
    assert args.gradient_accumulation_steps == 2 and args.steps_per_generation == 2
    assert args.num_iterations == 1 and args.top_p == 1.0
    assert args.logging_steps == 1 and args.report_to == []
    assert str(args.save_strategy) in ("steps", "SaveStrategy.STEPS")
    assert args.save_steps == 50  # the default save_every
    assert args_with(save_every=0).save_steps == 2  # save_every 0: once, at max_steps
    assert args.disable_tqdm is True and args.log_completions is False
    assert args.remove_unused_columns is False and args.dataloader_num_workers == 0
    assert args.shuffle_dataset is True
    assert args.use_cpu is (not torch.cuda.is_available())
    assert args_with(save_every=1).save_steps == 1
    # extra TRL settings go on top of ktae's own
    assert grpo_config(cfg_with(), 1, trl={"top_p": 0.9, "logging_steps": 5}).top_p == 0.9


def test_grpo_config_refuses_a_batch_that_does_not_split():
    with pytest.raises(ValueError) as err:
        grpo_config(cfg_with(num_prompts=3, num_generations=2), 4)
    assert str(err.value) == ("num_prompts: num_prompts * num_generations = 6 responses must "
                              "split evenly over 4 process(es) x gradient_accumulation_steps=1")
    with pytest.raises(ValueError, match="over 1 process\\(es\\) x gradient_accumulation_steps=4"):
        grpo_config(cfg_with(num_prompts=3, num_generations=2), 1,
                    trl={"gradient_accumulation_steps": 4})


def test_lora_config_targets_and_task():
    pytest.importorskip("peft")
    every = lora_config(cfg_with(lora_r=4))
    assert every.target_modules == "all-linear" and every.task_type == "CAUSAL_LM"
    some = lora_config(cfg_with(lora_r=4, lora_target_modules=["q_proj", "v_proj"]))
    assert set(some.target_modules) == {"q_proj", "v_proj"}
