#!/usr/bin/env bash
# DAPO + KTAE on stock verl 0.9.1: the KTAE paper's 7B run (appendices G.1, G.3, J).
#
#   Qwen2.5-Math-7B on MATH levels 3-5, the Qwen-Math prompt for training and validation
#   (the instruction as the system message), the boxed reward, MATH-500 validated greedily;
#   lr 1e-6 constant, 1024 prompts x 16 responses per step, max prompt 1024, max response
#   3072, temperature 1.0, clip (0.2, 0.24) (the paper's 7B value), overlong buffer 512
#   with penalty 1.0, KTAE h1 = 1, h2 = 2, h3 = 1, k1 = 2, b = 0.5, seed 0, 8 GPUs, no KL.
#   From the authors' released script (the paper does not state them): PPO mini-batches of
#   128 prompts, 20 epochs of 2,048-prompt generation batches, weight decay 0.01, gradient
#   clip 1.0, dual-clip bound 10, validation every 5 steps, a checkpoint every 10.
#   Each value against the paper: docs/training.md, "The recipes against the papers".
#
#   pip install -e ".[verl]"  (plus verl's GPU stack: vllm, flash-attn; see docs/verl.md)
#   python examples/prepare_data.py ktae-7b --out data/ktae-7b   # prints the problem count
#   MODEL_PATH=... TRAIN_FILE=data/ktae-7b/train.parquet VAL_FILE=data/ktae-7b/val.parquet \
#       bash examples/verl/dapo_ktae_qwen2.5-math-7b.sh
#
# Training length: the authors' script ran total_epochs=20 with generation batches of
# 2,048 prompts (its data.gen_batch_size), that is at most 20 x floor(N / 2048)
# steps for N training problems: 40 for MATH's levels 3-5 (N between 4,096 and 6,143).
# verl 0.9.1's v1 trainer fetches one prompt at a time under group filtering and counts an
# epoch as N / 1024 steps, so the recipe gives that step count itself. The reward is
# examples/verl/boxed_reward.py (the boxed reward of `ktae train`), which reports `acc`
# for the group filter and KTAE's split. Token 151643 is Qwen2.5's <|endoftext|>, which
# the authors' runtime ignores in KTAE's statistics. The script's max_num_gen_batches=10 is
# left out: verl 0.9.1's v1 trainer ignores it (with a warning) and keeps drawing prompts
# until the batch is full. max_actor_ckpt_to_keep=null keeps
# every checkpoint (the paper names no checkpoint selection; evaluate them with ktae eval).
set -euo pipefail

MODEL_PATH=${MODEL_PATH:-Qwen/Qwen2.5-Math-7B}
TRAIN_FILE=${TRAIN_FILE:-data/ktae-7b/train.parquet}
VAL_FILE=${VAL_FILE:-data/ktae-7b/val.parquet}
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
    actor_rollout_ref.rollout.seed=0 \
    actor_rollout_ref.model.path="$MODEL_PATH" \
    actor_rollout_ref.rollout.n=16 \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.temperature=1.0 \
    actor_rollout_ref.rollout.top_p=1.0 \
    actor_rollout_ref.rollout.val_kwargs.do_sample=false \
    actor_rollout_ref.rollout.val_kwargs.n=1 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.optim.lr_warmup_steps=0 \
    actor_rollout_ref.actor.optim.weight_decay=0.01 \
    actor_rollout_ref.actor.grad_clip=1.0 \
    actor_rollout_ref.actor.ppo_mini_batch_size=128 \
    actor_rollout_ref.actor.use_dynamic_bsz=true \
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu=16384 \
    actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=32768 \
    actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=32768 \
    actor_rollout_ref.actor.use_kl_loss=false \
    actor_rollout_ref.actor.entropy_coeff=0 \
    actor_rollout_ref.actor.clip_ratio_low=0.2 \
    actor_rollout_ref.actor.clip_ratio_high=0.24 \
    actor_rollout_ref.actor.clip_ratio_c=10.0 \
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
    reward.custom_reward_function.path=examples/verl/boxed_reward.py \
    reward.custom_reward_function.name=compute_score \
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
    trainer.experiment_name=dapo-ktae-qwen2.5-math-7b \
    trainer.logger='["console"]' \
    trainer.val_before_train=true \
    trainer.test_freq=5 \
    trainer.save_freq=10 \
    trainer.max_actor_ckpt_to_keep=null \
    trainer.total_epochs=20 \
    trainer.total_training_steps=40 \
    "$@"
