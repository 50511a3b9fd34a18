#!/usr/bin/env bash
# GRPO + TACO on stock verl 0.9.1: the TACO paper's setting for Qwen2.5-Math-7B.
#
#   group size 8, rollout batch 512 prompts, PPO mini-batch 32, lr 1e-6 with 10 warmup
#   steps, max prompt 1024, max response 4096, temperature 1.0, top-p 1.0, clip-higher
#   (0.2, 0.28), no KL, 200 steps; TACO alpha = 0.01, lambda = 0.9, computed from the
#   current policy's log-probability and entropy at every update (hence
#   calculate_entropy=true). Any calibration of ktae.CALIBRATIONS works the same way,
#   e.g. loss_mode=stapo or loss_mode=taco-hard (the paper's baselines and ablations).
#
#   pip install -e ".[verl]"  (plus verl's GPU stack: vllm, flash-attn; see docs/verl.md)
#   MODEL_PATH=... TRAIN_FILE=dapo-math-17k.parquet VAL_FILE=aime-2024.parquet \
#       bash examples/verl/grpo_taco_qwen2.5-math-7b.sh
#
# The paper states "verl's standard GRPO recipe"; the loss aggregation is verl's default
# (token-mean). Qwen2.5-Math-7B ships 4096 positions; 1024 + 4096 tokens need more, as in
# verl's DAPO recipe for this model.
set -euo pipefail

MODEL_PATH=${MODEL_PATH:-Qwen/Qwen2.5-Math-7B}
TRAIN_FILE=${TRAIN_FILE:-$HOME/data/dapo-math-17k.parquet}
VAL_FILE=${VAL_FILE:-$HOME/data/aime-2024.parquet}
N_GPUS=${N_GPUS:-8}
NNODES=${NNODES:-1}

python3 -m verl.trainer.main_ppo \
    data.train_files="$TRAIN_FILE" \
    data.val_files="$VAL_FILE" \
    data.prompt_key=prompt \
    data.truncation=left \
    data.max_prompt_length=1024 \
    data.max_response_length=4096 \
    data.train_batch_size=512 \
    actor_rollout_ref.model.path="$MODEL_PATH" \
    +actor_rollout_ref.model.override_config.max_position_embeddings=8192 \
    actor_rollout_ref.rollout.n=8 \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.temperature=1.0 \
    actor_rollout_ref.rollout.top_p=1.0 \
    actor_rollout_ref.rollout.val_kwargs.temperature=0.7 \
    actor_rollout_ref.rollout.val_kwargs.top_p=0.9 \
    actor_rollout_ref.rollout.val_kwargs.do_sample=true \
    actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.7 \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.optim.lr_warmup_steps=10 \
    actor_rollout_ref.actor.ppo_mini_batch_size=32 \
    actor_rollout_ref.actor.use_dynamic_bsz=true \
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu=20480 \
    actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=40960 \
    actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=40960 \
    actor_rollout_ref.actor.use_kl_loss=false \
    actor_rollout_ref.actor.entropy_coeff=0 \
    actor_rollout_ref.actor.calculate_entropy=true \
    actor_rollout_ref.actor.clip_ratio_low=0.2 \
    actor_rollout_ref.actor.clip_ratio_high=0.28 \
    actor_rollout_ref.actor.loss_agg_mode=token-mean \
    actor_rollout_ref.actor.policy_loss.loss_mode=taco \
    +actor_rollout_ref.actor.policy_loss.ktae.alpha=0.01 \
    +actor_rollout_ref.actor.policy_loss.ktae.lam=0.9 \
    algorithm.adv_estimator=grpo \
    algorithm.use_kl_in_reward=false \
    trainer.use_v1=true \
    trainer.n_gpus_per_node="$N_GPUS" \
    trainer.nnodes="$NNODES" \
    trainer.project_name=ktae \
    trainer.experiment_name=grpo-taco-qwen2.5-math-7b \
    trainer.logger='["console"]' \
    trainer.total_training_steps=200 \
    "$@"
