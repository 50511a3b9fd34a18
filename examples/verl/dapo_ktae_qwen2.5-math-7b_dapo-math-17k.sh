#!/usr/bin/env bash
# DAPO + KTAE on stock verl 0.9.1, Qwen2.5-Math-7B on DAPO-Math-17k: KTAE's 7B
# hyperparameters (appendix G.3) on the DAPO paper's data. NOT the KTAE paper's run, which
# trains on MATH levels 3-5 with the Qwen-Math prompt and the boxed reward and tests on
# MATH-500: that one is examples/verl/dapo_ktae_qwen2.5-math-7b.sh.
#
#   Here: DAPO-Math-17k with its own prompt (a final "Answer:" line) and verl's math_dapo
#   scorer (by the rows' data_source), validation on AIME 2024 in the same format.
#   Qwen2.5-Math-7B, lr 1e-6, 1024 prompts x 16 responses, max prompt 1024, max response
#   3072, temperature 1.0, clip (0.2, 0.24), overlong buffer 512 with penalty 1.0, KTAE
#   h1 = 1, h2 = 2, h3 = 1, k1 = 2, b = 0.5, seed 0, 8 GPUs. DAPO's four parts are verl's
#   own: dynamic sampling (algorithm.filter_groups, v1 trainer), clip-higher, token-mean
#   loss, and the dapo reward manager's overlong shaping. KTAE reads correctness from the
#   verifier's `acc` (not the shaped reward).
#
#   pip install -e ".[verl]"  (plus verl's GPU stack: vllm, flash-attn; see docs/verl.md)
#   MODEL_PATH=... TRAIN_FILE=dapo-math-17k.parquet VAL_FILE=aime-2024.parquet \
#       bash examples/verl/dapo_ktae_qwen2.5-math-7b_dapo-math-17k.sh
#
# Mini-batch, weight decay, gradient and dual clip follow the KTAE authors' script (128
# prompts, 0.01, 1.0, 10). Length: one epoch of DAPO-Math-17k's deduplicated problems is
# about 17 steps of 1,024; the KTAE authors' 20 epochs of MATH levels 3-5 are 40 steps of
# 1,024 prompts, the step count used here. Token 151643 is Qwen2.5's <|endoftext|>, which
# the authors' runtime ignores in KTAE's statistics.
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
    data.max_response_length=3072 \
    data.train_batch_size=1024 \
    data.seed=0 \
    actor_rollout_ref.model.path="$MODEL_PATH" \
    actor_rollout_ref.rollout.n=16 \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.temperature=1.0 \
    actor_rollout_ref.rollout.top_p=1.0 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.7 \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=128 \
    actor_rollout_ref.actor.optim.weight_decay=0.01 \
    actor_rollout_ref.actor.grad_clip=1.0 \
    actor_rollout_ref.actor.clip_ratio_c=10.0 \
    actor_rollout_ref.actor.use_dynamic_bsz=true \
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu=16384 \
    actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=32768 \
    actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=32768 \
    actor_rollout_ref.actor.use_kl_loss=false \
    actor_rollout_ref.actor.entropy_coeff=0 \
    actor_rollout_ref.actor.clip_ratio_low=0.2 \
    actor_rollout_ref.actor.clip_ratio_high=0.24 \
    actor_rollout_ref.actor.loss_agg_mode=token-mean \
    algorithm.adv_estimator=ktae \
    +algorithm.ktae.h1=1.0 \
    +algorithm.ktae.h2=2.0 \
    +algorithm.ktae.h3=1.0 \
    +algorithm.ktae.k1=2.0 \
    +algorithm.ktae.b=0.5 \
    +algorithm.ktae.ignore_token_ids=[151643] \
    +algorithm.ktae.correct_key=acc \
    algorithm.use_kl_in_reward=false \
    algorithm.filter_groups.enable=true \
    algorithm.filter_groups.metric=acc \
    reward.reward_manager.name=dapo \
    +reward.reward_kwargs.max_resp_len=3072 \
    +reward.reward_kwargs.overlong_buffer_cfg.enable=true \
    +reward.reward_kwargs.overlong_buffer_cfg.len=512 \
    +reward.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0 \
    +reward.reward_kwargs.overlong_buffer_cfg.log=false \
    trainer.use_v1=true \
    trainer.n_gpus_per_node="$N_GPUS" \
    trainer.nnodes="$NNODES" \
    trainer.project_name=ktae \
    trainer.experiment_name=dapo-ktae-qwen2.5-math-7b-dapo-math-17k \
    trainer.logger='["console"]' \
    trainer.total_training_steps=40 \
    "$@"
