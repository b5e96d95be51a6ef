#!/usr/bin/env bash
# The capstone run (issue 31) on one 2-GPU machine, one step after the other, each logged to $LOGS (default /tmp/logs).
# Started detached, so that it outlives the 10-minute call that starts it (wheels installed in /tmp/site first):
#   mkdir -p /tmp/logs && (setsid nohup bash bench/billion.sh > /tmp/logs/all.log 2>&1 &)
# The raw files go to /dev/shm when it can hold them (it is grown first), else beside the processed folder; when the disk
# cannot hold both, fewer rows (a multiple of 100M) are written, and the log says so.
set -u
R=/tmp/fgt_repo; rm -rf $R; mkdir -p $R; tar --exclude=./.whl -cf - . | tar -xf - -C $R; cd $R  # a copy the next calls' trees leave alone
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
L=${LOGS:-/tmp/logs}; mkdir -p "$L"; ROWS=${ROWS:-1000000000}; D=/tmp/billion
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
mount -o remount,size=200G /dev/shm 2>/dev/null
df -h / /tmp /dev/shm; free -g
shm=$(df --output=avail -B1 /dev/shm | tail -1); disk=$(df --output=avail -B1 /tmp | tail -1)
if [ "$shm" -gt $((ROWS * 62)) ]; then RAW=/dev/shm/billion_raw; per=75; else RAW=$D/raw; per=135; fi  # bytes a row on /tmp
if [ "$disk" -lt $((ROWS * per)) ]; then ROWS=$((disk / per / 100000000 * 100000000)); echo "the disk holds $ROWS rows"; fi
echo "rows $ROWS, raw files in $RAW"
python3 bench/bench_billion.py --rows "$ROWS" --raw "$RAW" --dir $D --steps gen,prep,train > "$L/billion.log" 2>&1; echo "billion rc $?"
if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then  # the scaling figures and the 2-GPU suite
  python3 bench/bench_billion.py --rows "$ROWS" --dir $D --steps scale --append > "$L/scale.log" 2>&1; echo "scale rc $?"
  rm -rf $D "$RAW"
  python3 bench/bench_dask.py --shape criteo --rows 100000000 --workers 1,2 --no-persist --no-pandas --in-memory-max 0 \
    --name dask_criteo_2gpu > "$L/dask.log" 2>&1; echo "dask rc $?"
  python3 -m pytest -m gpu2 -q -p no:logging -rf > "$L/gpu2.log" 2>&1; echo "gpu2 rc $?"
else  # one GPU, a rehearsal: the streaming loader on the same number of rows (resident and streamed), then the 1-GPU suite
  rm -rf $D "$RAW"
  python3 bench/bench_stream.py --shape criteo --rows "$ROWS" --bs 65536 --emb-dim 16 --emb-opt rowwise-adagrad --repeats 1 \
    --name stream_criteo_$((ROWS / 1000000))m > "$L/stream.log" 2>&1; echo "stream rc $?"
  rm -rf /tmp/fgt_bench_stream
  python3 -m pytest -m gpu -q -p no:logging -rf > "$L/gpu.log" 2>&1; echo "gpu rc $?"
fi
echo ALL DONE
