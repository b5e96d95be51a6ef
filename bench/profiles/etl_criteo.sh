#!/usr/bin/env bash
# Issue 29's GPU figures on one GPU in one go (after the wheels are installed in /tmp/site), logs and results under $OUT:
#   BASE=scratch/base bash bench/profiles/etl_criteo.sh      # BASE: a folder holding an earlier package (`git archive C
#                                                   # fastai_gpu_tabular | tar -x -C scratch/base`, carried to the device)
# 1. the TabularDask GPU tests; 2. $ROWS Criteo-shaped rows (default 100M) written once, then BASE's package and this one,
#    each in a fresh process and cluster, alternated twice; 3. this one with --blocksize 1GB and 4GB, the GPU's memory in use
#    sampled every 0.5 s beside each run (nvidia-smi). ROUNDS (default 2) and BLOCKS (default "1GB 4GB") change the runs, NO_TESTS=1
#    skips step 1, WORKERS=1,2 runs each package on 1 then 2 workers (a 2-GPU machine), TASKS=1 keeps each run's task stream
#    (`bench_dask.py --tasks`: where each worker's time goes). Started detached when it may outlast a 10-minute call:
#    (setsid nohup bash bench/profiles/etl_criteo.sh > /tmp/etl.log 2>&1 &), then read $L.
set -u
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
L=${OUT:-/tmp/logs}; mkdir -p "$L"; IN=/tmp/etl_in; ROWS=${ROWS:-100000000}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
[ -n "${NO_TESTS:-}" ] || { python3 -m pytest -m gpu -q -p no:logging -rf tests/test_gpu_dask.py > "$L/gpu_dask.log" 2>&1; tail -1 "$L/gpu_dask.log"; }
b="python3 bench/bench_dask.py --shape criteo --rows $ROWS --workers ${WORKERS:-1} ${TASKS:+--tasks} --no-persist --no-pandas --in-memory-max 0 --input $IN"
run() {  # name, then the bench's extra arguments; the memory in use beside it
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 500 > "$L/mem_$1.csv" & m=$!
  $b --name "etl_$1" "${@:2}" > "$L/$1.log" 2>&1; echo "$1 rc $? peak MiB $(sort -n "$L/mem_$1.csv" | tail -1)"; kill $m
}
for r in $(seq ${ROUNDS:-2}); do
  if [ -n "${BASE:-}" ]; then PYTHONPATH=/tmp/site:$PWD/$BASE run "base_$r"; fi
  run "this_$r"
done
for bs in ${BLOCKS:-1GB 4GB}; do run "bs_$bs" --blocksize $bs; done
cp bench/results/etl_*.json "$L/" 2>/dev/null
grep -H "'path'" "$L"/*.log
