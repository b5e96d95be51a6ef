"""What the client does while no worker computes: `TabularDask`'s fit and write on Criteo-shaped rows with dask's task stream and a
sampler of the client's main thread (its stack every `--interval` s). Each stretch of at least `--min-gap` s in which no worker
ran a task is reported with the client's frames sampled in it (the innermost frame of this package, and the innermost of all).

    python bench/profiles/client_gaps.py --rows 100000000 --input /tmp/etl_in     # GPU: dask_cudf on a LocalCUDACluster; CPU: pandas

Runs `--runs` times in one cluster (the first pays the workers' warm-up); prints each run's gaps and their frames;
results/client_gaps(_cpu).json."""
import argparse, collections, shutil, sys, tempfile, threading, time, warnings
from pathlib import Path
sys.path.insert(0, str(Path(__file__).parent.parent))  # bench/: common, roofline
from common import report

class Sampler:
    "The stack of thread `ident` every `dt` seconds, as (wall time, ((file, function, line), ... innermost last))"
    def __init__(self, ident, dt=0.005): self.ident,self.dt,self.samples,self.stop = ident,dt,[],threading.Event()
    def run(self):
        while not self.stop.wait(self.dt):
            f, st = sys._current_frames().get(self.ident), []
            while f is not None: st.append((f.f_code.co_filename, f.f_code.co_name, f.f_lineno)); f = f.f_back
            self.samples.append((time.time(), tuple(reversed(st))))
    def __enter__(self): self.t = threading.Thread(target=self.run, daemon=True); self.t.start(); return self
    def __exit__(self, *a): self.stop.set(); self.t.join()

def idle(data, t0, t1, min_gap):
    "Stretches of [t0, t1] of at least `min_gap` s in which no task of the task stream `data` computed"
    ss, out, end = sorted((s['start'], s['stop']) for x in data for s in x['startstops'] if s['action'] == 'compute'), [], t0
    for a, b in ss + [(t1, t1)]:
        if a - end >= min_gap: out.append((end, a))
        end = max(end, b)
    return out

def where(st, pkg='fastai_gpu_tabular'):
    "The innermost frame of this package in stack `st`, and the innermost of all, as short strings"
    short = lambda f: f"{Path(f[0]).parent.name}/{Path(f[0]).name}:{f[1]}:{f[2]}"
    mine = [f for f in st if f'/{pkg}/' in f[0]]
    return (short(mine[-1]) if mine else '-'), (short(st[-1]) if st else '-')

def main():
    p = argparse.ArgumentParser()
    p.add_argument('--rows', type=int, default=10_000_000)
    p.add_argument('--input', default=None, help='folder of in.*.parquet files (written there if it has none; bench_dask.py --input)')
    p.add_argument('--workers', type=int, default=1)
    p.add_argument('--runs', type=int, default=2)
    p.add_argument('--interval', type=float, default=0.005)
    p.add_argument('--min-gap', type=float, default=0.05)
    p.add_argument('--top', type=int, default=4)
    a = p.parse_args()
    from distributed import get_task_stream
    from fastai.data.block import CategoryBlock
    from fastai_gpu_tabular.backend import gpu_available
    from fastai_gpu_tabular.procs import Categorify, FillMissing, Normalize
    from fastai_gpu_tabular.tabular import RandomRowSplit
    from fastai_gpu_tabular.data import synth_criteo, CRITEO_SCHEMA, _read_parquet
    from fastai_gpu_tabular.tabular_dask import TabularDask, dask_client
    warnings.simplefilter('ignore')
    gpu, tmp = gpu_available(), Path(tempfile.mkdtemp())
    src = Path(a.input) if a.input else tmp/'in'
    if not sorted(src.glob('in.*.parquet')):
        for i, s in enumerate(range(0, a.rows, 10_000_000)):
            df = synth_criteo(min(10_000_000, a.rows - s), cap=500_000, seed=i, gpu=gpu)
            src.mkdir(parents=True, exist_ok=True)
            df.to_parquet(src/f'in.{i:04d}.parquet', **({'row_group_size_rows': 1_000_000} if gpu else {'row_group_size': 1_000_000}))
    files = sorted(src.glob('in.*.parquet'))
    kw = dict(**{k: list(v) if isinstance(v, tuple) else v for k, v in CRITEO_SCHEMA.items()}, y_block=CategoryBlock(),
              procs=[Categorify, FillMissing, Normalize], splits=RandomRowSplit(0.2, seed=42), progress=False)
    client = dask_client(n_workers=a.workers, gpu=gpu, dashboard_address=None)
    client.run(lambda: __import__('fastai_gpu_tabular.tabular_dask'))
    rows, runs = [], []
    for r in range(a.runs):
        shutil.rmtree(tmp/'out', ignore_errors=True)  # not timed: the bench's runs write to an empty place
        with get_task_stream(client) as ts, Sampler(threading.get_ident(), a.interval) as sm:
            t0 = time.time()
            to = TabularDask(_read_parquet(files, None, gpu), **kw)  # read_dask's partitions
            t_fit = time.time()
            to.to_parquet(tmp/'out')
            t1 = time.time()
        gaps, run = idle(ts.data, t0, t1, a.min_gap), []
        for g0, g1 in gaps:
            inside = [st for t, st in sm.samples if g0 <= t < g1]
            mine, last = (collections.Counter(where(st)[i] for st in inside) for i in (0, 1))
            run.append(dict(start=round(g0 - t0, 3), seconds=round(g1 - g0, 3), samples=len(inside),
                            mine=mine.most_common(a.top), innermost=last.most_common(a.top)))
        idle_s = sum(g['seconds'] for g in run)
        rows.append(dict(run=r, seconds=round(t1 - t0, 2), fit=round(t_fit - t0, 2), idle=round(idle_s, 2), gaps=len(run),
                         phases=', '.join(f'{k} {v:.2f}' for k, v in to.timings.items())))
        runs.append(run)
        print(rows[-1], flush=True)
        for g in run: print(f"  +{g['start']:7.3f} s idle {g['seconds']:.3f} s: {g['mine']} | {g['innermost'][:2]}", flush=True)
    report('client_gaps' + ('' if gpu else '_cpu'), rows, ['run', 'seconds', 'fit', 'idle', 'gaps', 'phases'],
           dict(bench='client_gaps', n_rows=a.rows, workers=a.workers, gpu=gpu, interval=a.interval, gaps=runs))
    client.close(); client.cluster.close()

if __name__ == '__main__': main()
