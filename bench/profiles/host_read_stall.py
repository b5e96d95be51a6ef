"""Does cuDF's decode of a parquet file from host bytes stall another thread's CUDA calls? (window changes with host bytes stalled
the training thread 38-61 ms each; `profile_dist.py --stacks` showed it blocked inside CUDA calls, the GIL free, while the reading
thread was in `plc.io.parquet.read_parquet`). A thread launches a tiny kernel every 0.2 ms and records its longest gap while this
thread decodes one file of `--rows` Criteo rows on a side stream, `--reps` times, from:
- `bytes`: the file as `bytes` (what `ProcessedSplit._cudf_side` gives cuDF): libcudf copies pages from pageable memory;
- `pinned`: the file read into pinned memory (pinned once) given to libcudf as a device span (UVA), no copy of ours;
- `device`: the file read into pinned memory (pinned once), copied to the GPU on the side stream, given to libcudf as a device span.
`--pieces K`: the file's row groups decoded in K reads in a row (is the stall a read's bytes, or each read's?); `--busy S`: S seconds
of work queued on the default (training) stream first: does the read wait for it? (The launching thread is then behind it too.)

    python bench/profiles/host_read_stall.py --mode bytes; python bench/profiles/host_read_stall.py --mode device --busy 1"""
import argparse, os, threading, time
p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument('--mode', default='bytes', choices=['bytes', 'device', 'pinned'])
p.add_argument('--rows', type=int, default=16_000_000)
p.add_argument('--file', default='/dev/shm/host_read_stall.parquet')
p.add_argument('--reps', type=int, default=3)
p.add_argument('--busy', type=float, default=0)
p.add_argument('--pieces', type=int, default=1)
a = p.parse_args()
import torch, cudf, pylibcudf as plc
from cuda.bindings import runtime
from fastai_gpu_tabular.stream import _async_mr
if not os.path.exists(a.file):
    from fastai_gpu_tabular.data import synth_criteo
    synth_criteo(a.rows, gpu=True).to_parquet(a.file, row_group_size_rows=1_000_000)
size = os.path.getsize(a.file)
import numpy as np, pyarrow.parquet as pq
pieces = [g.tolist() for g in np.array_split(np.arange(pq.ParquetFile(a.file).num_row_groups), a.pieces)]
pinned = torch.empty(size, dtype=torch.uint8, pin_memory=True) if a.mode != 'bytes' else None  # once: pinning takes long

class Span:
    "A device tensor as pylibcudf's `Span` (`ptr`, `size`)"
    def __init__(self, t): self.t,self.ptr,self.size = t,t.data_ptr(),t.numel()

side, dev = torch.cuda.Stream(), torch.device('cuda', 0)
def read():
    "One decode of the file on the side stream; (seconds, rows)"
    t0 = time.perf_counter()
    if a.mode == 'device':
        with open(a.file, 'rb', buffering=0) as f: f.readinto(pinned.numpy())  # outside the GIL, into the pinned buffer
        with torch.cuda.stream(side): d = pinned.to(dev, non_blocking=True)
        side.synchronize()  # libcudf reads the footer on a stream of its own
        src = Span(d)
    elif a.mode == 'pinned':  # the pinned buffer itself as libcudf's device source (UVA): it copies what it reads
        with open(a.file, 'rb', buffering=0) as f: f.readinto(pinned.numpy())
        src = Span(pinned)
    else:
        with open(a.file, 'rb') as f: src = f.read()
    n = 0
    for rgs in pieces:
        opts = plc.io.parquet.ParquetReaderOptions.builder(plc.io.SourceInfo([src])).build()
        opts.set_row_groups([rgs])
        with torch.cuda.stream(side):
            tbl = plc.io.parquet.read_parquet(opts, stream=runtime.cudaStream_t(side.cuda_stream), mr=_async_mr(0))
        side.synchronize()
        nr = tbl.tbl.num_rows; n += nr() if callable(nr) else nr
    return time.perf_counter() - t0, n

gaps, stop = [], threading.Event()
def launcher():
    x = torch.ones(256, device=dev)
    last = time.perf_counter()
    while not stop.is_set():
        x.add_(1); time.sleep(0.0002)
        now = time.perf_counter(); gaps.append(now - last); last = now
print(f'{a.mode}: {size/1e9:.2f} GB file, {len(pieces)} read(s) of {len(pieces[0])} row groups', flush=True)
read()  # the first call's setup apart
th = threading.Thread(target=launcher, daemon=True); th.start(); time.sleep(0.5)
for r in range(a.reps):
    if a.busy: torch.cuda._sleep(int(a.busy * 1.5e9))  # ~busy s of one thread on the default stream (1.5 GHz cycles)
    gaps.clear(); s, n = read(); g = sorted(gaps)
    print(f'{a.mode} rep {r}: read {s*1e3:.0f} ms ({n:,} rows){" behind %.1f s of queued work" % a.busy if a.busy else ""}; the launching '
          f'thread: longest gap {g[-1]*1e3:.1f} ms, 99th pct {g[int(len(g)*.99)]*1e3:.2f} ms, {len(g)} launches', flush=True)
    torch.cuda.synchronize()
stop.set(); th.join()
