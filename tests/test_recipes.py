"""The shipped recipes: every config loads, and the papers' runs carry the papers' values.

The paper values below are the ones docs/training.md quotes ("The recipes against the
papers"); a recipe that drifts from them, or a doc table that stops listing a recipe,
fails here. verl's own validation of the examples' overrides runs in the verl
environment (tests/verl_plugin/test_verl_config.py); here their values are read as text.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

from ktae.runs.config import TrainConfig
from ktae.runs.credit import credit_settings
from ktae.train.trl_args import check_trl_settings

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
VERL_EXAMPLES = sorted((ROOT / "examples" / "verl").glob("*.sh"))
DOCS = ROOT / "docs" / "training.md"
BOXED = "Please reason step by step, and put your final answer within \\boxed{}."


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_every_config_loads_resolves_and_its_options_check(path):
    cfg = TrainConfig.from_file(path).resolve()
    settings = credit_settings(cfg)
    assert settings is not None
    check_trl_settings(cfg.trl)


@dataclass(frozen=True)
class PaperRun:
    """One training run as its paper (and, where the paper is silent, its authors'
    script) states it. ``rollout_batch`` / ``mini_batch`` in prompts; ``steps`` and
    ``warmup`` in verl training steps (one rollout batch each)."""

    config: str
    verl: str | None
    model: str
    values: dict
    rollout_batch: int
    mini_batch: int
    steps: int
    warmup: int
    save_period: int = 10

    @property
    def updates_per_rollout(self) -> int:
        return self.rollout_batch // self.mini_batch


KTAE_COMMON = {
    "template": "qwen-math-system", "reward": "boxed", "eval_task": "math500",
    "eval_size": 500, "algo": "dapo", "credit": "ktae", "ktae_h1": 1.0, "ktae_h2": 2.0,
    "ktae_h3": 1.0, "estimator_options": {"k1": 2.0, "b": 0.5}, "num_generations": 16,
    "max_new_tokens": 3072, "temperature": 1.0, "learning_rate": 1e-6,
    "lr_scheduler": "constant", "beta": 0.0, "clip_low": 0.2, "loss_type": "dapo",
    "dynamic_sampling": True, "overlong_buffer": 512, "overlong_factor": 1.0, "seed": 0,
    "save_total_limit": 0,
}
KTAE_TRL = {"top_p": 1.0, "weight_decay": 0.01, "max_grad_norm": 1.0, "delta": 10.0}

TACO_COMMON = {
    "task": "parquet:data/taco/train.parquet", "eval_task": "parquet:data/taco/val.parquet",
    "template": "chat", "reward": "boxed", "algo": "grpo", "credit": "taco",
    "taco_alpha": 0.01, "taco_lambda": 0.9, "num_generations": 8, "max_new_tokens": 4096,
    "temperature": 1.0, "learning_rate": 1e-6, "beta": 0.0,
    "clip_low": 0.2, "clip_high": 0.28, "loss_type": "dapo", "dynamic_sampling": False,
    "overlong_buffer": 0, "save_total_limit": 0,
}
TACO_TRL = {"top_p": 1.0, "weight_decay": 0.1, "max_grad_norm": 1.0, "delta": 10.0}

RUNS = [
    # KTAE appendix G.3: 1024 questions x 16; the script's mini-batch 128 and 20 epochs of
    # 2,048-prompt generation batches (40 rollouts for levels 3-5, 100 for MATH12k).
    PaperRun("ktae-dapo-qwen2.5-math-7b.yaml", "dapo_ktae_qwen2.5-math-7b.sh",
             "Qwen/Qwen2.5-Math-7B",
             {**KTAE_COMMON, "clip_high": 0.24,
              "task": "hf:DigitalLearningGmbH/MATH-lighteval@train",
              "task_filters": {"level": ["Level 3", "Level 4", "Level 5"]}},
             rollout_batch=1024, mini_batch=128, steps=40, warmup=0),
    PaperRun("ktae-dapo-qwen2.5-math-1.5b.yaml", None, "Qwen/Qwen2.5-Math-1.5B",
             {**KTAE_COMMON, "clip_high": 0.28, "task": "hf:hiyouga/math12k@train"},
             rollout_batch=1024, mini_batch=128, steps=100, warmup=0),
    # TACO appendix A.
    PaperRun("taco-grpo-qwen3-1.7b-base.yaml", "grpo_taco_qwen3-1.7b-base.sh",
             "Qwen/Qwen3-1.7B-Base", TACO_COMMON,
             rollout_batch=256, mini_batch=64, steps=300, warmup=10),
    PaperRun("taco-grpo-qwen3-4b-base.yaml", "grpo_taco_qwen3-4b-base.sh",
             "Qwen/Qwen3-4B-Base", TACO_COMMON,
             rollout_batch=256, mini_batch=64, steps=250, warmup=10),
    PaperRun("taco-grpo-qwen2.5-math-7b.yaml", "grpo_taco_qwen2.5-math-7b.sh",
             "Qwen/Qwen2.5-Math-7B", TACO_COMMON,
             rollout_batch=512, mini_batch=32, steps=200, warmup=10),
    PaperRun("taco-grpo-olmo3-7b.yaml", "grpo_taco_olmo3-7b.sh",
             "allenai/Olmo-3-1025-7B", TACO_COMMON,
             rollout_batch=128, mini_batch=32, steps=150, warmup=10),
]
IDS = [r.config for r in RUNS]


@pytest.mark.parametrize("run", RUNS, ids=IDS)
def test_ktae_train_config_has_the_paper_values(run):
    cfg = TrainConfig.from_file(ROOT / "configs" / run.config).resolve()
    for name, value in run.values.items():
        assert getattr(cfg, name) == value, name
    trl = KTAE_TRL if run.config.startswith("ktae") else TACO_TRL
    assert {k: cfg.trl[k] for k in trl} == trl
    if run.config.startswith("ktae"):
        assert cfg.model == run.model
    else:  # the 7B needs a local copy with 8,192 positions
        assert cfg.model == run.model or cfg.model.endswith(run.model.split("/")[1] + "-8k")
    # one ktae train step = one PPO mini-batch; counts in verl steps become updates
    k = run.updates_per_rollout
    assert cfg.num_prompts == run.mini_batch
    assert cfg.max_steps == run.steps * k
    assert cfg.warmup_steps == run.warmup * k
    assert cfg.save_every == run.save_period * k
    if run.warmup:
        assert cfg.lr_scheduler == "constant_with_warmup"  # resolve() warms the constant up
    # each process's share is whole groups, split evenly into micro-batches
    per_process = cfg.num_prompts * cfg.num_generations // 8
    assert per_process % cfg.num_generations == 0
    assert per_process % cfg.trl["gradient_accumulation_steps"] == 0
    settings = credit_settings(cfg)
    if cfg.credit == "taco":
        assert settings.calibration == "taco"
        assert settings.calibration_options == {"alpha": 0.01, "lam": 0.9}
    else:
        assert settings.estimator == "ktae"
        assert {k: settings.estimator_options[k] for k in ("h1", "h2", "h3", "k1", "b")} == \
            {"h1": 1.0, "h2": 2.0, "h3": 1.0, "k1": 2.0, "b": 0.5}


def _overrides(script: Path) -> dict[str, str]:
    """``key=value`` words of the example's ``python3 -m verl.trainer.main_ppo`` command."""
    text = script.read_text()
    start = text.index("python3 -m verl.trainer.main_ppo")
    words = shlex.split(text[start:].replace("\\\n", " "), comments=True)[3:]
    out = {}
    for word in words:
        key, sep, value = word.partition("=")
        if sep:
            out[key.lstrip("+")] = value
    return out


@pytest.mark.parametrize("run", [r for r in RUNS if r.verl], ids=[r.verl for r in RUNS if r.verl])
def test_verl_example_has_the_paper_values(run):
    script = ROOT / "examples" / "verl" / run.verl
    o = _overrides(script)
    taco = run.config.startswith("taco")
    expected = {
        "data.train_batch_size": str(run.rollout_batch),
        "actor_rollout_ref.actor.ppo_mini_batch_size": str(run.mini_batch),
        "trainer.total_training_steps": str(run.steps),
        "actor_rollout_ref.actor.optim.lr": "1e-6",
        "actor_rollout_ref.actor.optim.lr_warmup_steps": str(run.warmup),
        "actor_rollout_ref.rollout.n": "8" if taco else "16",
        "data.max_prompt_length": "1024",
        "data.max_response_length": "4096" if taco else "3072",
        "actor_rollout_ref.rollout.temperature": "1.0",
        "actor_rollout_ref.rollout.top_p": "1.0",
        "actor_rollout_ref.actor.clip_ratio_low": "0.2",
        "actor_rollout_ref.actor.clip_ratio_high": "0.28" if taco else "0.24",
        "actor_rollout_ref.actor.clip_ratio_c": "10.0",
        "actor_rollout_ref.actor.use_kl_loss": "false",
        "algorithm.use_kl_in_reward": "false",
        "actor_rollout_ref.actor.entropy_coeff": "0",
        "actor_rollout_ref.actor.loss_agg_mode": "token-mean",
        "actor_rollout_ref.actor.optim.weight_decay": "0.1" if taco else "0.01",
        "actor_rollout_ref.actor.grad_clip": "1.0",
        "trainer.save_freq": str(run.save_period),
        "trainer.max_actor_ckpt_to_keep": "null",
        "reward.custom_reward_function.path": "examples/verl/boxed_reward.py",
    }
    if taco:
        expected |= {
            "algorithm.adv_estimator": "grpo",
            "actor_rollout_ref.actor.policy_loss.loss_mode": "taco",
            "actor_rollout_ref.actor.policy_loss.ktae.alpha": "0.01",
            "actor_rollout_ref.actor.policy_loss.ktae.lam": "0.9",
            "actor_rollout_ref.actor.calculate_entropy": "true",
            "actor_rollout_ref.rollout.val_kwargs.n": "32",
            "actor_rollout_ref.rollout.val_kwargs.temperature": "0.7",
            "actor_rollout_ref.rollout.val_kwargs.top_p": "0.9",
            "trainer.test_freq": "10",
        }
    else:
        expected |= {
            "algorithm.adv_estimator": "ktae",
            "algorithm.ktae.h1": "1.0", "algorithm.ktae.h2": "2.0", "algorithm.ktae.h3": "1.0",
            "algorithm.ktae.k1": "2.0", "algorithm.ktae.b": "0.5",
            "algorithm.filter_groups.enable": "true", "algorithm.filter_groups.metric": "acc",
            "reward.reward_manager.name": "dapo",
            "reward.reward_kwargs.overlong_buffer_cfg.enable": "true",
            "reward.reward_kwargs.overlong_buffer_cfg.len": "512",
            "reward.reward_kwargs.overlong_buffer_cfg.penalty_factor": "1.0",
            "reward.reward_kwargs.max_resp_len": "3072",
            "actor_rollout_ref.rollout.val_kwargs.do_sample": "false",
            "data.seed": "0", "actor_rollout_ref.rollout.seed": "0",
            "trainer.test_freq": "5",
        }
    assert {k: o.get(k) for k in expected} == expected
    assert f"MODEL_PATH=${{MODEL_PATH:-{run.model}}}" in script.read_text()


def test_docs_list_every_recipe_and_example():
    text = DOCS.read_text()
    section = text[text.index("### GPU recipes"):text.index("## From Python")]
    for run in RUNS:
        assert f"configs/{run.config}" in section, run.config
    for script in VERL_EXAMPLES:
        assert f"examples/verl/{script.name}" in section, script.name
    # the table states each run's batch and steps as the paper does
    for quote in ("The training batch size was 1024 questions.",
                  "For the Qwen3 series, the rollout batch size is 256 and the PPO mini-batch "
                  "size is 64",
                  "Qwen3-1.7B-Base and Qwen3-4B-Base are trained for 300 and 250 steps",
                  "For Olmo3-1025-7B, the rollout batch size is 128, the PPO mini-batch size is 32",
                  "learning rate 1×10^-6 with 10 warmup steps",
                  "we select the checkpoint with the highest validation accuracy"):
        assert quote in section, quote


def test_docs_commands_run_the_configs():
    """Every ``ktae train`` command of the GPU recipes parses and resolves to its config."""
    import argparse

    from ktae.train import cli_train

    text = DOCS.read_text()
    section = text[text.index("### GPU recipes"):text.index("## From Python")]
    blocks = [b for b in re.findall(r"```bash\n(.*?)```", section, flags=re.S)
              if "ktae train" in b]
    assert len(blocks) == len([r for r in RUNS])
    parser = argparse.ArgumentParser()
    cli_train.add_arguments(parser)
    for block in blocks:
        words = shlex.split(block.replace("\\\n", " "))
        args = words[words.index("train") + 1:]
        args[args.index("--config") + 1] = str(ROOT / args[args.index("--config") + 1])
        cfg = cli_train.config_from_args(parser.parse_args(args))
        assert cfg == TrainConfig.from_file(args[args.index("--config") + 1]).resolve()


# ---------------------------------------------------------------- data and reward


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def prepare_data():
    return _load(ROOT / "examples" / "prepare_data.py", "prepare_data")


def _write_parquet(rows, path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_taco_data_drops_dapos_instruction_and_repeats_and_asks_for_the_box(tmp_path,
                                                                             prepare_data):
    import pyarrow.parquet as pq

    from ktae.eval.prompts import DAPO_PREFIX, DAPO_SUFFIX

    def row(problem, answer):
        return {"data_source": "math_dapo", "ability": "MATH",
                "prompt": [{"role": "user", "content": f"{DAPO_PREFIX}{problem}{DAPO_SUFFIX}"}],
                "reward_model": {"ground_truth": answer, "style": "rule-lighteval/MATH_v2"},
                "extra_info": {"index": "x"}}

    train = _write_parquet([row("What is 1+1?", "2"), row("What is 2+3?", "5"),
                            row("What is 1+1?", "2")], tmp_path / "dapo.parquet")
    val = tmp_path / "aime.jsonl"
    val.write_text('{"problem": "Find x.", "answer": "7"}\n')
    counts = prepare_data.prepare("taco", tmp_path / "out", train=f"parquet:{train}",
                                  val=f"jsonl:{val}")
    assert counts == {"train": 2, "val": 1}
    rows = pq.read_table(tmp_path / "out" / "train.parquet").to_pylist()
    assert [r["prompt"] for r in rows] == [
        [{"role": "user", "content": f"What is 1+1?\n{BOXED}"}],
        [{"role": "user", "content": f"What is 2+3?\n{BOXED}"}]]
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["2", "5"]
    assert rows[0]["data_source"] == "taco-recipe/train"
    held = pq.read_table(tmp_path / "out" / "val.parquet").to_pylist()
    assert held[0]["prompt"] == [{"role": "user", "content": f"Find x.\n{BOXED}"}]


def test_ktae_data_keeps_levels_3_to_5_with_the_qwen_math_system_prompt(tmp_path,
                                                                        prepare_data):
    import pyarrow.parquet as pq

    from ktae.data import load_examples
    from ktae.eval.prompts import qwen_math_system_prompt

    math = tmp_path / "math.jsonl"
    math.write_text("".join(
        f'{{"problem": "P{level}", "solution": "so \\\\boxed{{{level}}}", '
        f'"level": "Level {level}", "type": "Algebra"}}\n' for level in range(1, 6)))
    counts = prepare_data.prepare("ktae-7b", tmp_path / "out", train=f"jsonl:{math}",
                                  val=f"jsonl:{math}")
    assert counts == {"train": 3, "val": 5}
    rows = pq.read_table(tmp_path / "out" / "train.parquet").to_pylist()
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["3", "4", "5"]
    assert rows[0]["prompt"] == [{"role": "system", "content": BOXED},
                                 {"role": "user", "content": "P3"}]

    class ChatML:  # Qwen2.5-Math's chat template, for a system and a user message
        chat_template = "chatml"

        def apply_chat_template(self, messages, tokenize, add_generation_prompt):
            text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n"
                           for m in messages)
            return text + "<|im_start|>assistant\n"

    from ktae.eval.prompts import render_prompt

    example = load_examples(f"parquet:{tmp_path / 'out' / 'train.parquet'}")[0]
    assert render_prompt(example.problem, "chat", ChatML(), messages=example.messages) == \
        qwen_math_system_prompt("P3") == render_prompt("P3", "qwen-math-system")


@pytest.mark.parametrize("response, answer, score", [
    ("so the answer is \\boxed{\\frac{1}{2}}", "0.5", 1.0),
    ("\\boxed{3} then \\boxed{4}", "4", 1.0),
    ("\\boxed{3}", "4", 0.0),
    ("Answer: 4", "4", 0.0),  # the answer-line format is not the box
])
def test_verl_boxed_reward_scores_the_last_box_and_reports_acc(response, answer, score):
    reward = _load(ROOT / "examples" / "verl" / "boxed_reward.py", "boxed_reward")
    result = reward.compute_score("taco-recipe/train", response, answer, extra_info={})
    assert result == {"score": score, "acc": score == 1.0}
