#!/usr/bin/env bash
# GRPO + TACO on stock verl 0.9.1: the TACO paper's Qwen3-4B-Base run (section 4.1, appendix A).
#
#   DAPO-Math-17k, prompted with the paper's instruction ("Please reason step by step, and
#   put your final answer within \boxed{}") and scored on the boxed answer; group size 8,
#   rollout batch 256 prompts, PPO mini-batch 64, lr 1e-6 with 10 warm-up steps, max
#   prompt 1024, max response 4096, temperature 1.0, top-p 1.0, clip-higher (0.2, 0.28), no
#   KL, 250 steps; TACO alpha = 0.01, lambda = 0.9, computed from the current policy's
#   log-probability and entropy at every update (hence calculate_entropy=true). Validation
#   as the authors' released script: AIME 2024, 32 samples at temperature 0.7, top-p 0.9,
#   every 10 steps, a checkpoint every 10 steps, all kept: the paper reports the checkpoint
#   with the highest validation accuracy. Weight decay 0.1, gradient clip 1.0 and the
#   dual-clip bound 10 are the released script's (the paper does not state them).
#   Each value against the paper: docs/training.md, "The recipes against the papers".
#
#   pip install -e ".[verl]"  (plus verl's GPU stack: vllm, flash-attn; see docs/verl.md)
#   python examples/prepare_data.py taco --out data/taco
#   MODEL_PATH=... TRAIN_FILE=data/taco/train.parquet VAL_FILE=data/taco/val.parquet \
#       bash examples/verl/grpo_taco_qwen3-4b-base.sh
#
# verl steps its learning-rate schedule once per training step, so the 10 warm-up steps
# span the first 10 rollout batches (40 optimizer updates). Stock verl 0.9.1
# validates at the training response length (4,096); the paper's evaluation budget (16,384
# tokens) is `ktae eval --protocol taco` on the kept checkpoints. The loss aggregation is
# verl's default (token-mean), which the released script keeps. The reward is
# examples/verl/boxed_reward.py (the boxed reward of `ktae train`).
set -euo pipefail

MODEL_PATH=${MODEL_PATH:-Qwen/Qwen3-4B-Base}
TRAIN_FILE=${TRAIN_FILE:-data/taco/train.parquet}
VAL_FILE=${VAL_FILE:-data/taco/val.parquet}
N_GPUS=${N_GPUS:-8}
NNODES=${NNODES:-1}

python3 -m verl.trainer.main_ppo \
    data.train_files="$TRAIN_FILE" \
    data.val_files="$VAL_FILE" \
    data.prompt_key=prompt \
    data.truncation=left \
    data.filter_overlong_prompts=true \
    data.max_prompt_length=1024 \
    data.max_response_length=4096 \
    data.train_batch_size=256 \
    actor_rollout_ref.model.path="$MODEL_PATH" \
    actor_rollout_ref.rollout.n=8 \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.temperature=1.0 \
    actor_rollout_ref.rollout.top_p=1.0 \
    actor_rollout_ref.rollout.val_kwargs.do_sample=true \
    actor_rollout_ref.rollout.val_kwargs.n=32 \
    actor_rollout_ref.rollout.val_kwargs.temperature=0.7 \
    actor_rollout_ref.rollout.val_kwargs.top_p=0.9 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.7 \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.optim.lr_warmup_steps=10 \
    actor_rollout_ref.actor.optim.weight_decay=0.1 \
    actor_rollout_ref.actor.grad_clip=1.0 \
    actor_rollout_ref.actor.ppo_mini_batch_size=64 \
    actor_rollout_ref.actor.use_dynamic_bsz=true \
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu=20480 \
    actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=40960 \
    actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=40960 \
    actor_rollout_ref.actor.use_kl_loss=false \
    actor_rollout_ref.actor.entropy_coeff=0 \
    actor_rollout_ref.actor.calculate_entropy=true \
    actor_rollout_ref.actor.clip_ratio_low=0.2 \
    actor_rollout_ref.actor.clip_ratio_high=0.28 \
    actor_rollout_ref.actor.clip_ratio_c=10.0 \
    actor_rollout_ref.actor.loss_agg_mode=token-mean \
    actor_rollout_ref.actor.policy_loss.loss_mode=taco \
    +actor_rollout_ref.actor.policy_loss.ktae.alpha=0.01 \
    +actor_rollout_ref.actor.policy_loss.ktae.lam=0.9 \
    algorithm.adv_estimator=grpo \
    algorithm.use_kl_in_reward=false \
    reward.custom_reward_function.path=examples/verl/boxed_reward.py \
    reward.custom_reward_function.name=compute_score \
    trainer.use_v1=true \
    trainer.n_gpus_per_node="$N_GPUS" \
    trainer.nnodes="$NNODES" \
    trainer.project_name=ktae \
    trainer.experiment_name=grpo-taco-qwen3-4b-base \
    trainer.logger='["console"]' \
    trainer.val_before_train=true \
    trainer.test_freq=10 \
    trainer.save_freq=10 \
    trainer.max_actor_ckpt_to_keep=null \
    trainer.total_training_steps=250 \
    "$@"
