"""The storage under a streamed epoch (issues 53, 54): how fast a processed folder's training row groups come off the disk or
the page cache as raw bytes, no decode, in the epoch's shuffled order or the files' own, by 1 or more threads at once (the
ranks of one machine). With `--cold` each file's cached pages are dropped first (`posix_fadvise(DONTNEED)`, no root needed),
so the figure is the disk's; the block device's bytes read (psutil) say which one served the reads.

    python bench/profiles/profile_storage.py /tmp/billion/processed --threads 1,4 --cold --seconds 20
    python bench/profiles/profile_storage.py /dev/shm/billion/processed --threads 1,4            # tmpfs: memory's rate

A row group is read as the byte range of its column chunks (what a reader of all its columns fetches), one `os.pread` a row
group; each run stops after `--seconds` or the whole split."""
import argparse, os, time, threading
p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument('folder', help='a processed folder (`fgt-prep --out`)')
p.add_argument('--split', default='train')
p.add_argument('--threads', default='1,4', help='readers at once, each a run: e.g. 1,4,8')
p.add_argument('--order', choices=('shuffled', 'files'), default='shuffled', help="the epoch's shuffled row groups, or file by file")
p.add_argument('--cold', action='store_true', help="drop the split's files from the page cache before each run")
p.add_argument('--seconds', type=float, default=30, help='stop a run after this long')
p.add_argument('--seed', type=int, default=0)
a = p.parse_args()
import numpy as np, psutil, pyarrow.parquet as pq
from fastai_gpu_tabular.stream import ProcessedSplit

src = ProcessedSplit(a.folder, a.split)
def byte_range(rg):
    "(offset, length) of row group `rg`: from its first column chunk's first page to the end of its last"
    cols = [rg.column(k) for k in range(rg.num_columns)]
    starts = [c.dictionary_page_offset if c.has_dictionary_page and c.dictionary_page_offset else c.data_page_offset for c in cols]
    start = min(starts)
    return start, max(s + c.total_compressed_size for s, c in zip(starts, cols)) - start
mds = [pq.ParquetFile(f).metadata for f in src.files]
ranges = [(src.files[i], *byte_range(mds[i].row_group(j))) for i, j, _, _ in src.groups]
order = np.random.default_rng(a.seed).permutation(len(ranges)) if a.order == 'shuffled' else np.arange(len(ranges))
total = sum(r[2] for r in ranges)
print(f"{a.folder} ({a.split}): {len(src.files)} files, {len(ranges)} row groups, {total/1e9:.2f} GB, "
      f"{total/max(src.n, 1):.1f} bytes a row on disk", flush=True)

def drop_cache():
    for f in src.files:
        fd = os.open(f, os.O_RDONLY)
        try: os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally: os.close(fd)

def run(n:int)->dict:
    if a.cold: drop_cache()
    it, lock, got, stop = iter(order), threading.Lock(), [0]*n, time.perf_counter() + a.seconds
    def reader(k):
        fds = {}
        while time.perf_counter() < stop:
            with lock: g = next(it, None)
            if g is None: break
            f, off, ln = ranges[g]
            if f not in fds: fds[f] = os.open(f, os.O_RDONLY)
            got[k] += len(os.pread(fds[f], ln, off))
        for fd in fds.values(): os.close(fd)
    io0, t0 = psutil.disk_io_counters(), time.perf_counter()
    ts = [threading.Thread(target=reader, args=(k,)) for k in range(n)]
    for t in ts: t.start()
    for t in ts: t.join()
    s, io1 = time.perf_counter() - t0, psutil.disk_io_counters()
    return dict(threads=n, order=a.order, cold=a.cold, GB=round(sum(got)/1e9, 2), seconds=round(s, 2),
                GB_s=round(sum(got)/1e9/s, 2), device_read_GB=round((io1.read_bytes - io0.read_bytes)/1e9, 2) if io0 else None)

import pandas as pd
print(pd.DataFrame([run(int(n)) for n in a.threads.split(',')]).to_string(index=False), flush=True)
