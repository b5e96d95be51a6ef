"""Preprocessing MovieLens-shaped rows read from parquet: fit + transform + write of the processed format, by `TabularDask`
on 1 and on 2 workers, beside `TabularGPU` in memory (when the data fits) and pandas, all in one run.

    python bench/bench_dask.py --rows 200000000                # GPUs: a LocalCUDACluster, dask_cudf partitions
    python bench/bench_dask.py --rows 2000000 --cpu            # the same table with a LocalCluster of pandas workers
    python bench/bench_dask.py --shape criteo --rows 100000000 # Criteo-shaped rows (`synth_criteo`, ids capped at --cap)

Against an earlier version in the same run: `git show 237a929:fastai_gpu_tabular/tabular_dask.py >
fastai_gpu_tabular/_ref_tabular_dask.py`, then `--ref-module fastai_gpu_tabular._ref_tabular_dask` (delete the copy after).

Every path starts from the same parquet files, written first (row groups of `--rg` rows), and ends with the processed
folder written: `TabularGPU`/pandas read all rows into one process, the dask paths read and write partition by
partition. The ratios are against 1 worker's first round (a fresh cluster's first run, what a user runs once). Targets
(GPU-run issues): 2 GPUs >= 1.8x one; one dask-cuda worker within 1.5x of the in-memory `TabularGPU` time."""
import argparse, importlib, shutil, sys, tempfile, time, warnings
from pathlib import Path
sys.path.insert(0, str(Path(__file__).parent))
from common import report, sync

def main():
    p = argparse.ArgumentParser()
    p.add_argument('--rows', type=int, default=200_000_000)
    p.add_argument('--rg', type=int, default=1_000_000, help='rows per row group of the input files (a dask partition each)')
    p.add_argument('--cpu', action='store_true', help='pandas workers on the CPU even where there are GPUs')
    p.add_argument('--workers', default='1,2')
    p.add_argument('--in-memory-max', type=int, default=100_000_000, help='run TabularGPU and pandas up to this many rows')
    p.add_argument('--shape', default='movielens', choices=['movielens', 'criteo'], help='`synth_movielens` or `synth_criteo` rows')
    p.add_argument('--cap', type=int, default=500_000, help='criteo: most distinct ids of a column')
    p.add_argument('--name', default=None, help='results file (default: dask, dask_cpu, or dask_criteo(_cpu))')
    p.add_argument('--ref-module', default=None, help="also time the `TabularDask` of this module (an earlier version, say)")
    p.add_argument('--no-persist', action='store_true', help='skip the persist=True runs')
    p.add_argument('--threads', default='default', help="threads a worker, e.g. 1,default (each a run; default: `dask_client`'s)")
    p.add_argument('--device-limits', default='default', help="dask-cuda's device_memory_limit of a worker, e.g. default,2.7GB "
                   "(each a run; out of core: the input's bytes over the limit)")
    p.add_argument('--no-pandas', action='store_true', help='skip TabularGPU on pandas in memory (on a GPU machine)')
    p.add_argument('--input', default=None, help='folder for the input files: written there if it has none (and kept), else read '
                   'as they are (--rows, --rg, --shape must be those it was written with): runs in several processes share one input')
    p.add_argument('--row-group-rows', type=int, default=None, help="rows of the written row groups (default `to_parquet`'s: ~64 MiB)")
    p.add_argument('--blocksize', default=None, help="dask partitions of about this many bytes of the input, e.g. 1GB (row groups "
                   "aggregated: `read_dask`'s, `fgt-prep --blocksize`); default `read_dask`'s (GPU: `GPU_BLOCKSIZE`; CPU: a row group)")
    p.add_argument('--rounds', type=int, default=1, help="time each path this many times in the same cluster (TabularDask) or "
                   "process (in memory): the first, a fresh cluster's or process's run (what a user runs once), is the figure the "
                   "ratios use; later rounds say what a warm one would add")
    p.add_argument('--tasks', action='store_true', help="each TabularDask run's task stream summed by worker and task name (where "
                   "a worker's time goes, and how long it waits), in the results file")
    a = p.parse_args()
    from distributed import Client
    from fastai.data.block import CategoryBlock
    from fastai_gpu_tabular.backend import gpu_available, read_frame
    from fastai_gpu_tabular.procs import Categorify, FillMissing, Normalize
    from fastai_gpu_tabular.tabular import TabularGPU, RandomRowSplit
    from fastai_gpu_tabular import data
    from fastai_gpu_tabular.data import synth_movielens, synth_criteo, CRITEO_SCHEMA
    # `read_dask`'s partitioning (fgt-prep --dask); a package from before eda935b (a same-run baseline) has none: a row group each
    _parquet_parts = getattr(data, '_parquet_parts', lambda blocksize, gpu: dict(split_row_groups=True))
    # and its partitions a multiple of the workers (`_read_parquet`, after 95e156b); before, `_parquet_parts`'s alone
    _read_parquet = getattr(data, '_read_parquet', lambda files, blocksize, gpu: importlib.import_module(
                            'dask_cudf' if gpu else 'dask.dataframe').read_parquet(files, **_parquet_parts(blocksize, gpu)))
    from fastai_gpu_tabular.tabular_dask import TabularDask, dask_client
    warnings.simplefilter('ignore')
    gpu = gpu_available() and not a.cpu
    tmp = Path(tempfile.mkdtemp())
    cols = dict(CRITEO_SCHEMA) if a.shape == 'criteo' else dict(cat_names=['userId', 'movieId', 'hour'], cont_names=['days', 'year'],
                                                              mh_names=['genres'], y_names='target')
    kw = dict(**{k: list(v) if isinstance(v, tuple) else v for k, v in cols.items()}, y_block=CategoryBlock(),
              procs=[Categorify, FillMissing, Normalize], splits=RandomRowSplit(0.2, seed=42))
    # the input: parquet files written in chunks (so that 200M rows never need to be in memory at once), or those of --input
    chunk, src = 10_000_000, Path(a.input) if a.input else tmp
    files = sorted(src.glob('in.*.parquet'))
    if files:
        import pyarrow.parquet as pq
        got = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
        if got != a.rows: raise SystemExit(f'{src} holds {got:,} rows, not --rows {a.rows:,}: another folder, or the same --rows')
        print(f'input: {len(files)} files of {src}, as they are', flush=True)
    for i, s in enumerate(range(0, a.rows, chunk) if not files else []):
        n = min(chunk, a.rows - s)
        df = synth_criteo(n, cap=a.cap, seed=i, gpu=gpu) if a.shape == 'criteo' else synth_movielens(n, seed=i, gpu=gpu)
        src.mkdir(parents=True, exist_ok=True); files.append(src/f'in.{i:04d}.parquet')
        df.to_parquet(files[-1], **({'row_group_size_rows': a.rg} if gpu else {'row_group_size': a.rg}))
        del df
    rows = []
    def timed(name, f, base=None):
        "`f` timed `--rounds` times (each a row): the first round's seconds"
        for r in range(a.rounds):
            sync(); t = time.perf_counter(); to = f(); sync(); s = time.perf_counter() - t
            rows.append(dict(path=name + (f' (round {r+1})' if a.rounds > 1 else ''), seconds=round(s, 2), rows_s=round(a.rows / s)))
            if hasattr(to, 'timings'): rows[-1]['phases'] = ', '.join(f'{k} {v:.2f}' for k, v in to.timings.items())
            if hasattr(to, 'ddf'): rows[-1]['partitions'] = to.ddf.npartitions
            print(rows[-1], flush=True)
            shutil.rmtree(tmp/'out', ignore_errors=True)
            if r == 0: first = s
        return first
    secs, tasks = {}, []
    in_bytes = sum(f.stat().st_size for f in files)
    for n, th, lim in [(int(o), None if t == 'default' else int(t), m) for o in a.workers.split(',') for t in a.threads.split(',')
                       for m in a.device_limits.split(',')]:
        if gpu and n > __import__('torch').cuda.device_count(): print(f'{n} workers: skipped, fewer GPUs here'); continue
        client = dask_client(n_workers=n, gpu=gpu, threads_per_worker=th, dashboard_address=None,
                             **({} if lim == 'default' or not gpu else dict(device_memory_limit=lim)))
        client.run(lambda: __import__('fastai_gpu_tabular.tabular_dask'))  # workers import the library before the clock starts
        read = lambda: _read_parquet(files, a.blocksize, gpu)  # `read_dask`'s (fgt-prep --dask), inside the timing as there
        def run(cls=TabularDask, **k):
            from contextlib import nullcontext
            from distributed import get_task_stream
            with get_task_stream(client) if a.tasks else nullcontext() as ts:  # the stream only when asked: it is inside the timing
                to = cls(read(), progress=False, **k, **kw); to.to_parquet(tmp/'out', row_group_rows=a.row_group_rows)
            if a.tasks: tasks.append(dict(run=f'{cls.__module__}, {n} worker(s)', **task_summary(ts.data)))
            return to
        w = f'{n} worker(s)' + (f', {th} thread(s) each' if th else '') + ('' if lim == 'default' else
            f', device_memory_limit {lim} (input {in_bytes/1e9:.1f} GB)')
        s1 = timed(f'TabularDask, {w}', run)
        if (th is None and lim == 'default') or n not in secs: secs[n] = s1  # the ratios' base: the defaults
        if not a.no_persist: timed(f'TabularDask, {w}, persist=True', lambda: run(persist=True))
        if a.ref_module: timed(f'{a.ref_module}.TabularDask, {w}', lambda: run(importlib.import_module(a.ref_module).TabularDask))
        client.close(); client.cluster.close()
    if a.rows <= a.in_memory_max:
        def mem(g): TabularGPU(read_frame_all(files, g), **kw).to_parquet(tmp/'out', row_group_rows=a.row_group_rows)
        def read_frame_all(fs, g):
            import pandas as pd
            if g: import cudf; return cudf.concat([cudf.read_parquet(f) for f in fs], ignore_index=True)
            return pd.concat([pd.read_parquet(f) for f in fs], ignore_index=True)
        if gpu: secs['gpu'] = timed('TabularGPU in memory (cuDF)', lambda: mem(True))
        if not (gpu and a.no_pandas): secs['pandas'] = timed('TabularGPU in memory (pandas)', lambda: mem(False))
    base = secs[min(k for k in secs if isinstance(k, int))]
    for r in rows: r['vs_1_worker'] = round(base / r['seconds'], 2)
    name = a.name or ('dask' + ('_criteo' if a.shape == 'criteo' else '') + ('' if gpu else '_cpu'))
    report(name, rows, ['path', 'seconds', 'rows_s', 'vs_1_worker', 'phases'],
           dict(bench='dask', shape=a.shape, n_rows=a.rows, row_group_rows=a.rg, gpu=gpu, input_bytes=in_bytes, blocksize=a.blocksize,
                written_row_group_rows=a.row_group_rows, rounds=a.rounds, **({'tasks': tasks} if tasks else {})))
    for t in tasks: print(t['run'], t['workers'])
    shutil.rmtree(tmp, ignore_errors=True)

def task_summary(data)->dict:
    """Seconds of dask's task stream `data` by worker (computing by task name, transfers and disk, the span from its first to its
    last task), and the timeline: [worker, task name, partition, start, stop] of each step, in seconds from the first"""
    from collections import defaultdict
    from dask.utils import key_split
    ws, t0 = sorted({t['worker'] for t in data}), min((s['start'] for t in data for s in t['startstops']), default=0)
    out, line = {}, []
    for t in data:
        for s in t['startstops']:
            line.append([ws.index(t['worker']), key_split(t['key']) if s['action'] == 'compute' else s['action'],
                         t['key'][1] if isinstance(t['key'], tuple) and len(t['key']) > 1 else None, round(s['start']-t0, 3), round(s['stop']-t0, 3)])
    for i, w in enumerate(ws):
        by = defaultdict(float)
        for _, name, _, a, b in (l for l in line if l[0] == i): by[name] += b - a
        mine = [l for l in line if l[0] == i]
        out[w] = dict(span=round(max(l[4] for l in mine) - min(l[3] for l in mine), 2), busy=round(sum(by.values()), 2),
                      tasks=len([t for t in data if t['worker'] == w]), by={k: round(v, 2) for k, v in sorted(by.items(), key=lambda o: -o[1])[:12]})
    return dict(workers=out, timeline=sorted(line, key=lambda l: l[3]))

if __name__ == '__main__': main()
