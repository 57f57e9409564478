#!/usr/bin/env bash
# Issue 49's loop on one lent H100/H200, in one call: torchtitan-style training steps of Llama-3.1-8B (2 and 4
# blocks) and Qwen3-30B-A3B (1 and 2 blocks) at full width, eager and compiled, with a per-kernel table;
# then `shardscope calibrate` with what is left. Everything lands in OUT_DIR (8 files at most).
#   usage: bench/device/close_the_loop.sh OUT_DIR [CALIBRATE_MINUTES]
set -u
out=${1:?usage: close_the_loop.sh OUT_DIR [CALIBRATE_MINUTES]}
minutes=${2:-3.5}
mkdir -p "$out"
export PYTHONPATH=src PYTHONUNBUFFERED=1
{
    nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,power.limit,memory.total --format=csv
    python3 -c 'import torch, sys; print(sys.version.split()[0], torch.__version__, torch.version.cuda,
                torch.backends.cudnn.version(), torch.cuda.get_device_name(0))'
} >"$out/env.txt" 2>&1
step=bench/device/torchtitan_llama_step.py
timeout 110 python3 $step "$out" --routes fsdp --layers 2,4 --modes eager,compile --kernel-table --budget-s 90 \
    >"$out/llama.log" 2>&1
echo "llama: exit $?" >>"$out/env.txt"
timeout 190 python3 $step "$out" --model qwen3-30b-a3b --routes fsdp --layers 1,2 --modes eager,compile \
    --kernel-table --budget-s 150 >"$out/qwen3.log" 2>&1
echo "qwen3: exit $?" >>"$out/env.txt"
timeout $(python3 -c "print(int($minutes * 60 + 45))") python3 -m shardscope calibrate --out "$out/calibrated.db" \
    --budget-min "$minutes" >"$out/calibrate.log" 2>&1
echo "calibrate: exit $?" >>"$out/env.txt"
cat "$out/env.txt"
grep -v '^\[rank' "$out/llama.log" | tail -8
grep -v '^\[rank' "$out/qwen3.log" | tail -8
tail -c 1500 "$out/calibrate.log"
