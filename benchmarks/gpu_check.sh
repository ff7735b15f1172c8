#!/usr/bin/env bash
# distrl on a CUDA machine: --device cuda for each algorithm, NCCL under ddp, bf16, and APPO's learner
# on the GPU beside actors on the CPUs (the same run with the learner on the CPUs, for comparison).
# benchmarks/cuda_check.py compares gradients on the GPU with the CPU's and runs PPO, SAC and GRPO; this
# script runs the algorithms that came after it (APPO, IMPALA, DQN) and APPO's pipeline with a CUDA learner.
#
#   bash benchmarks/gpu_check.sh [OUT_DIR] [ACTORS] [ATARI_STEPS]
#
# Prints one line per run from its summary.json; a run that fails prints its last lines and the script
# goes on. Needs distrl importable (PYTHONPATH=src or installed) with gymnasium, ale-py and ray.
set -u
out=${1:-/tmp/distrl-gpu-check}
actors=${2:-12}
atari_steps=${3:-200000}
py=${PYTHON:-python3}
mkdir -p "$out"

summary() {
    "$py" - "$1" "$2" <<'EOF'
import json, sys
from pathlib import Path

name, run = sys.argv[1], Path(sys.argv[2])
cfg, s = json.loads((run / "config.json").read_text()), json.loads((run / "summary.json").read_text())
keys = ("sps", "train_s", "total_steps", "final_eval_mean_return", "final_mean_return",
        "learner_busy_fraction", "policy_lag_mean", "policy_lag_p95", "generator_utilisation")
fields = " ".join(f"{k}={s[k]:.4g}" if isinstance(s[k], float) else f"{k}={s[k]}" for k in keys if k in s)
print(f"OK {name}: device={cfg['run']['device']} precision={cfg['run']['precision']} {fields}", flush=True)
EOF
}

check() {  # check NAME TIMEOUT_S distrl-train-arguments...
    local name=$1 limit=$2
    shift 2
    local started=$SECONDS
    if timeout "$limit" "$py" -m distrl train "$@" --quiet --run-dir "$out/$name" >"$out/$name.log" 2>&1; then
        summary "$name" "$out/$name"
    else
        echo "FAILED $name (exit $?, $((SECONDS - started)) s):"
        tail -n 8 "$out/$name.log"
    fi
    echo "   wall $((SECONDS - started)) s"
}

nvidia-smi -L
"$py" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"
# the pipeline's actors run bf16 on the host's CPUs: without native bfloat16 they are about ten times slower
"$py" -c "from distrl.training.precision import cpu_has_native_bf16 as n; print('host CPU native bfloat16:', n())"
"$py" -m pytest -q -p no:cacheprovider tests/nets/test_q_nets.py -k cuda 2>&1 | tail -n 2

check ppo-ddp-nccl 60 ppo CartPole-v1 --strategy ddp --workers 1 --device cuda --total-steps 20000
grep -h -i "nccl\|backend" "$out/ppo-ddp-nccl/events.log" 2>/dev/null | head -n 2
check ppo-ddp-2-ranks-1-gpu 40 ppo CartPole-v1 --strategy ddp --workers 2 --device cuda --total-steps 20000
check appo-cartpole 90 appo CartPole-v1 --strategy single --device cuda --total-steps 40000
check impala-cartpole-rmsprop 90 impala CartPole-v1 --strategy single --device cuda --optimizer rmsprop \
    --total-steps 40000
check dqn-cartpole-bf16 90 dqn CartPole-v1 --device cuda --precision bf16 --total-steps 30000
check sac-pendulum 60 sac Pendulum-v1 --device cuda --total-steps 4000
check appo-breakout-cuda-learner 180 appo ALE/Breakout-v5 --strategy pipeline --workers "$actors" --device cuda \
    --precision bf16 --total-steps "$atari_steps"
check appo-breakout-cpu-learner 180 appo ALE/Breakout-v5 --strategy pipeline --workers "$actors" --device cpu \
    --precision bf16 --total-steps "$atari_steps"
