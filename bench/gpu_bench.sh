#!/usr/bin/env bash
# docs/gpu.md's GPU measurements, as named jobs run one after another within a time budget.
#
#   bench/gpu_bench.sh OUTDIR SECONDS JOB...
#
# Needs a python3 whose JAX sees the GPU and this repository on its path (after
# `pip install -e '.[gpu]'`, or PYTHONPATH=$PWD:SITE after bench/gpu_wheels.sh unpack SITE).
# A job starts only if its estimate fits in what is left of SECONDS, and is killed at the
# end of them, so the whole stays inside a time limit. Everything is logged to
# OUTDIR/log.txt; each bench's results.json and child logs end up in OUTDIR/runs.tar.gz.
#
# Jobs:
#   env        nvidia-smi, Python, JAX/jaxlib/plugin versions and the devices JAX sees
#   test       pytest's gpu-marked training test (tests/operations/test_train_gpu.py; it trains
#              with the default tracker, W&B offline, so it needs wandb installed)
#   150m       llama_150m, bare + executor (one pair), batch 128 x 1024, 60 steps
#   1b         llama_1b, bare only, batch 32 x 1024, 30 steps, Levanter's defaults
#   1b-batch8, 1b-batch64   as 1b, batch 8 x 1024 and 64 x 1024
#   1b-noremat llama_1b, bare only, no gradient checkpointing, batch 16 x 1024
#   1b-vanilla llama_1b, bare only, vanilla attention, batch 32 x 1024 (gradient checkpointing
#              kept: without it the stored score matrices alone would take ~60 GB, by estimate)
#   1b-xla     as 1b-noremat, with XLA's Triton GEMMs off and its latency-hiding scheduler on
#   1b-2048    llama_1b, bare only, no gradient checkpointing, batch 8 x 2048
#   1b-pair    llama_1b, bare + executor (one pair), no gradient checkpointing, batch 16 x 1024
set -uo pipefail

out=$1
budget=$2
shift 2
mkdir -p "$out" /tmp/gpu-bench
log=$out/log.txt
started=$SECONDS
data=/tmp/gpu-bench/data  # built by the first bench, reused by the others
export PYTHONUNBUFFERED=1

bench() {
  python3 bench/train_overhead.py --data "$data" --out "/tmp/gpu-bench/$job" "$@"
}

run_job() {
  case $1 in
    env)
      nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv
      python3 -c "
import sys, jax, jaxlib, importlib.metadata as md
print('python', sys.version.split()[0])
for name in ('jax', 'jaxlib', 'jax-cuda13-plugin', 'jax-cuda13-pjrt', 'jax-cuda12-plugin', 'levanter', 'haliax', 'equinox', 'optax', 'transformers', 'tensorstore', 'numpy'):
    try:
        print(name, md.version(name))
    except md.PackageNotFoundError:
        pass
print('devices', jax.devices(), jax.devices()[0].device_kind)
import jax.numpy as jnp
x = jax.random.normal(jax.random.PRNGKey(0), (8192, 8192), jnp.bfloat16)
f = jax.jit(lambda a: a @ a)
f(x).block_until_ready()
import time
t = time.perf_counter()
for _ in range(20):
    y = f(x)
y.block_until_ready()
s = (time.perf_counter() - t) / 20
print(f'bf16 8192^3 matmul: {2 * 8192**3 / s / 1e12:.0f} TFLOP/s')
"
      ;;
    test) python3 -m pytest -q -p no:cacheprovider tests/operations/test_train_gpu.py -m gpu ;;
    150m) bench --model llama_150m --batch 128 --seq-len 1024 --steps 60 --skip 10 --pairs 1 ;;
    1b) bench --model llama_1b --batch 32 --seq-len 1024 --steps 30 --skip 8 --pairs 1 --bare-only ;;
    1b-batch8) bench --model llama_1b --batch 8 --seq-len 1024 --steps 30 --skip 8 --pairs 1 --bare-only ;;
    1b-batch64) bench --model llama_1b --batch 64 --seq-len 1024 --steps 30 --skip 8 --pairs 1 --bare-only ;;
    1b-noremat) bench --model llama_1b --batch 16 --seq-len 1024 --steps 30 --skip 8 --pairs 1 --bare-only --remat false ;;
    1b-vanilla)
      bench --model llama_1b --batch 32 --seq-len 1024 --steps 30 --skip 8 --pairs 1 --bare-only --attention vanilla
      ;;
    1b-xla)
      XLA_FLAGS="--xla_gpu_enable_triton_gemm=false --xla_gpu_enable_latency_hiding_scheduler=true" \
        bench --model llama_1b --batch 16 --seq-len 1024 --steps 30 --skip 8 --pairs 1 --bare-only --remat false
      ;;
    1b-2048) bench --model llama_1b --batch 8 --seq-len 2048 --steps 30 --skip 8 --pairs 1 --bare-only --remat false ;;
    1b-pair) bench --model llama_1b --batch 16 --seq-len 1024 --steps 30 --skip 8 --pairs 1 --remat false ;;
    *)
      echo "unknown job $1"
      return 2
      ;;
  esac
}

estimate() {
  case $1 in
    env) echo 30 ;;
    test) echo 90 ;;
    150m) echo 200 ;;
    1b-pair) echo 300 ;;
    1b-batch64) echo 130 ;;
    *) echo 110 ;;
  esac
}

# Refuse to benchmark on the CPU. When JAX finds no GPU, try once more with the nvidia-*
# packages' library folders on LD_LIBRARY_PATH, then give up with JAX's own error.
gpu_check() { JAX_PLATFORMS=cuda python3 -c "import jax; print('JAX devices:', jax.devices())" >>"$log" 2>&1; }
if ! gpu_check; then
  LD_LIBRARY_PATH=$(python3 -c "import glob, nvidia; print(':'.join(sorted(glob.glob(list(nvidia.__path__)[0] + '/*/lib'))))")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export LD_LIBRARY_PATH
  echo "JAX found no GPU; again with LD_LIBRARY_PATH=$LD_LIBRARY_PATH" >>"$log"
  if ! gpu_check; then
    tail -n 40 "$log"
    exit 1
  fi
fi
tail -n 1 "$log"

for job in "$@"; do
  left=$((budget - (SECONDS - started)))
  need=$(estimate "$job")
  if ((left < need)); then
    echo "=== $job: skipped ($left s left, needs about $need)" | tee -a "$log"
    continue
  fi
  echo "=== $job ($left s left)" | tee -a "$log"
  job_started=$SECONDS
  timeout --signal=KILL "$((left - 5))" bash -c "$(declare -f bench run_job); job=$job data=$data run_job $job" 2>&1 |
    tee -a "$log" | grep -vE "^\s*$" | tail -n 14
  echo "=== $job: exit ${PIPESTATUS[0]} after $((SECONDS - job_started)) s" | tee -a "$log"
done
# Small files only: results, child logs, metrics; no checkpoints.
(cd /tmp/gpu-bench && find . -maxdepth 2 \( -name '*.json' -o -name '*.stderr' \) -print0 |
  tar czf "$out/runs.tar.gz" --null -T - ./*/*/metrics.jsonl 2>/dev/null)
