"""Where dask puts a `TabularDask` write pass on two workers: partitions read (and prepared) by each worker, seconds spent moving
data between them, and the pass's wall time; each `_write` slowed by `--sleep` seconds on the workers, as a GPU's longer tasks.

    python bench/profiles/dask_placement.py                   # CPU, LocalCluster of 2 workers, ~1 minute
    python bench/profiles/dask_placement.py --runs 2 --sleep 0.3

The case (issue 29, tenth session): 4M rows, 4 id columns of up to 3M ids (procs of ~63 MB), 10 partitions. With the procs a key
of the graph dask ran that key late, on one worker, while the other read and prepared all 10 partitions and then sent half of
them over; `_shared` scatters the procs to every worker before the pass."""
import argparse, collections, sys, tempfile, time
from pathlib import Path

def slow(s):
    "Make this worker's `_write` sleep `s` seconds first"
    import fastai_gpu_tabular.tabular_dask as m, time
    f = m._write
    def w(*a, **k): time.sleep(s); return f(*a, **k)
    m._write = w

def main():
    p = argparse.ArgumentParser()
    p.add_argument('--rows', type=int, default=4_000_000)
    p.add_argument('--ids', type=int, default=3_000_000, help='most distinct ids of each of the 4 id columns')
    p.add_argument('--sleep', type=float, default=0.3)
    p.add_argument('--runs', type=int, default=1)
    p.add_argument('--parts', type=int, default=10, help='partitions (a row group each)')
    a = p.parse_args()
    import numpy as np, pandas as pd
    from dask.utils import key_split
    from distributed import LocalCluster, Client, get_task_stream
    from fastai.data.block import CategoryBlock
    from fastai_gpu_tabular.procs import Categorify, FillMissing, Normalize
    from fastai_gpu_tabular.tabular import RandomRowSplit
    from fastai_gpu_tabular.data import read_dask
    from fastai_gpu_tabular.tabular_dask import TabularDask
    tmp, rng, n = Path(tempfile.mkdtemp()), np.random.default_rng(0), a.rows
    pd.DataFrame({**{c: rng.integers(0, a.ids, n) for c in 'abcd'}, 'x': rng.standard_normal(n).astype('float32'),
                  'y': rng.integers(0, 2, n)}).to_parquet(tmp/'in.parquet', row_group_size=-(-n // a.parts))
    for r in range(a.runs):
        with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None, memory_limit='6GB') as cl, Client(cl) as c:
            c.run(slow, a.sleep)
            ddf, cols = read_dask(str(tmp/'in.parquet'), cat_names='a,b,c,d', cont_names='x', y_names='y')
            td = TabularDask(ddf, procs=[Categorify, FillMissing, Normalize], y_block=CategoryBlock(), splits=RandomRowSplit(0.2, seed=1),
                             progress=False, **cols)
            with get_task_stream(c) as ts:
                t = time.perf_counter(); td.to_parquet(tmp/'out', overwrite=True); t = time.perf_counter() - t
        ws = sorted({t['worker'] for t in ts.data})
        by = collections.Counter((key_split(t['key']), ws.index(t['worker'])) for t in ts.data)
        moved = sum(s['stop'] - s['start'] for t in ts.data for s in t['startstops'] if s['action'] == 'transfer')
        print(dict(run=r, reads=[by['read_parquet', i] for i in range(2)], writes=[by['write_pass', i] + by['write', i] for i in range(2)],
                   transfer_s=round(moved, 2), write_pass_s=round(t, 2)), flush=True)

if __name__ == '__main__': main()
