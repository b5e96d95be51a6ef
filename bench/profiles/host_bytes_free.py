"""What freeing a window's host bytes costs the other threads (the training thread among them): a `bytes` of `--gb` GB made as
`ProcessedSplit._host_file` makes them, filled from a file by `_read_into`, then freed (a) as is, under the GIL, (b) after `_release`
gave its pages back outside the GIL, (c) with transparent huge pages asked for (`madvise(MADV_HUGEPAGE)`); meanwhile a Python thread
does small work and records its longest gap. CPU only.

    python bench/profiles/host_bytes_free.py --gb 1 --reps 3"""
import argparse, ctypes, os, threading, time
import numpy as np
import fastai_gpu_tabular.stream as S

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument('--gb', type=float, default=1.0)
p.add_argument('--reps', type=int, default=3)
p.add_argument('--file', default='/dev/shm/fgt_host_bytes_free.bin')
a = p.parse_args()
n = int(a.gb * 2**30)
if not os.path.exists(a.file) or os.path.getsize(a.file) != n:
    with open(a.file, 'wb') as f: f.write(np.random.default_rng(0).integers(0, 255, n, dtype=np.uint8).tobytes())

def one(how):
    b, v = S._unwritten_bytes(n)
    if how == 'huge pages':
        addr = ctypes.cast(ctypes.c_char_p(b), ctypes.c_void_p).value; lo = addr // 2**21 * 2**21
        S._libc.madvise(ctypes.c_void_p(lo), ctypes.c_size_t(n + addr - lo), 14)  # MADV_HUGEPAGE
    t0 = time.perf_counter(); S._read_into(a.file, v, [(0, n)]); t1 = time.perf_counter()
    if how == '_release first': S._release(b)
    del v, b
    return t1 - t0, time.perf_counter() - t1

def gaps(stop, out):
    last, worst = time.perf_counter(), 0.
    while not stop.is_set(): sum(range(200)); now = time.perf_counter(); worst = max(worst, now - last); last = now
    out.append(worst)

for rep in range(a.reps):
    for how in ('as is', '_release first', 'huge pages'):
        stop, out = threading.Event(), []
        th = threading.Thread(target=gaps, args=(stop, out)); th.start()
        read, free = one(how); stop.set(); th.join()
        print(f'{how:15s}: read {read*1e3:5.0f} ms, release and free {free*1e3:5.1f} ms, the other thread\'s longest gap {out[0]*1e3:5.1f} ms',
              flush=True)
os.remove(a.file)
