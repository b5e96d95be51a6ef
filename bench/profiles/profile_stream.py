"""Where a streamed window's time goes, by step (`load`: all of the reading thread's work, as the loader does it), on the MovieLens and Criteo shapes: the parquet decode, the host copy into
one block, the copy to the GPU, the batch gathers; the copy as it was (`np.stack` of the columns into (rows, columns),
`pin_memory`, `.to`) beside the one the loader does now (each column's chunks into a pinned (columns, rows) block by a
pool of threads, the copy, the transpose on the GPU).

    python bench/profiles/profile_stream.py --rows 30000000          # both shapes; processed folders under --dir are reused
Prints ms a window and rows/s for each step (median over the windows of an epoch, `--windows` at most)."""
import argparse, statistics, sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).parent.parent))  # bench/: common, roofline
from common import report
import numpy as np, torch
from fastai.tabular.all import CategoryBlock
from fastai_gpu_tabular.data import synth_movielens, synth_tabular, synth_criteo, CRITEO_SCHEMA
from fastai_gpu_tabular.procs import Categorify, FillMissing, Normalize
from fastai_gpu_tabular.tabular import TabularGPU, RandomRowSplit
from fastai_gpu_tabular.stream import ParquetDataLoader, _host_blocks, _chunk

p = argparse.ArgumentParser()
p.add_argument('--rows', type=int, default=30_000_000)
p.add_argument('--shape', nargs='+', default=['movielens', 'criteo'])
p.add_argument('--windows', type=int, default=12)
p.add_argument('--mem-frac', type=float, default=0.1)
p.add_argument('--dir', default='/tmp/fgt_profile_stream')
p.add_argument('--name', default='profile_stream')
a = p.parse_args()

def folder(shape):
    path = Path(a.dir)/shape
    if (path/'dataset.json').exists(): return path
    if shape == 'criteo': to = TabularGPU(synth_criteo(a.rows, cap=500_000, gpu=True), procs=[Categorify, FillMissing, Normalize],
                                          splits=RandomRowSplit(0.2, 42), y_block=CategoryBlock(), **CRITEO_SCHEMA)
    else: to = synth_tabular(synth_movielens(a.rows, gpu=True))
    to.to_parquet(path, overwrite=True); del to
    return path

def ms(f):
    torch.cuda.synchronize(); t = time.perf_counter(); r = f(); torch.cuda.synchronize()
    return r, (time.perf_counter() - t)*1e3

rows = []
for shape in a.shape:
    path = folder(shape)
    dl = ParquetDataLoader(path, bs=65536, shuffle=True, seed=0, device='cuda')
    dl.mem_bytes = int(dl.src.nbytes.sum()*a.mem_frac)
    src, steps = dl.src, {k: [] for k in ('decode', 'decode_rg_pool', 'old_copy', 'new_host', 'new_gpu', 'load', 'gather')}
    n_rows = []
    import pyarrow as pa, pyarrow.parquet as pq
    for win in dl.windows()[:a.windows]:
        gs = sorted({g for g,_,_ in win})
        by = {}
        for g in gs: by.setdefault(src.groups[g][0], []).append(src.groups[g][1])
        tbl, t = ms(lambda: pa.concat_tables([pq.ParquetFile(src.files[i], memory_map=True).read_row_groups(r, columns=src.columns) for i, r in by.items()]))
        steps['decode'].append(t)
        from concurrent.futures import ThreadPoolExecutor
        tasks = [(i, j) for i, r in by.items() for j in r]
        one = lambda ij: pq.ParquetFile(src.files[ij[0]], memory_map=True).read_row_group(ij[1], columns=src.columns, use_threads=False)
        with ThreadPoolExecutor(16) as ex: steps['decode_rg_pool'].append(ms(lambda: pa.concat_tables(list(ex.map(one, tasks))))[1])
        names = src.names
        def old():
            blk = lambda ns, dt: torch.from_numpy(np.stack([tbl.column(n).to_numpy().astype(dt, copy=False) for n in ns], 1))
            return [x.pin_memory().to('cuda', non_blocking=True) for x in (blk(names['cat_names'], np.int32), blk(names['cont_names'], np.float32))]
        steps['old_copy'].append(ms(old)[1])
        host, t = ms(lambda: _host_blocks(tbl, [(names['cat_names'], torch.int32), (names['cont_names'], torch.float32)], True))
        steps['new_host'].append(t)
        steps['new_gpu'].append(ms(lambda: [x.to('cuda', non_blocking=True).T.contiguous() for x in host])[1])
        steps['load'].append(ms(lambda: dl.load(win, 0, 0))[1])  # the reading thread's whole work: decode and copy overlapped, the window's order
        t = _chunk(tbl, names, src.ys, torch.device('cuda'))
        idx = torch.randperm(t.n, device='cuda')
        steps['gather'].append(ms(lambda: [dl.create_batch(idx[i:i+65536], t) for i in range(0, t.n, 65536)])[1])  # the window's batches
        n_rows.append(tbl.num_rows)
    n = statistics.median(n_rows)
    r = dict(shape=shape, columns=len(src.columns), window_rows=f'{n:,.0f}')
    for k, v in steps.items(): r[k+'_ms'] = f'{statistics.median(v):.1f}'; r[k+'_Mrows_s'] = f'{n/statistics.median(v)/1e3:.1f}'
    rows.append(r)
cols = list(rows[0])
report(a.name, rows, cols, dict(bench='profile_stream', n_rows=a.rows, mem_frac=a.mem_frac))
