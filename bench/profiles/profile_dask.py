"""Where a `TabularDask` partition's time goes at click-log width: each step of each pass timed on one partition (synchronised),
then the whole fit and write on the synchronous scheduler under cProfile (Python and host syncs, which no timer per step shows).

    python bench/profiles/profile_dask.py --rows 10000000       # Criteo-shaped rows (`synth_criteo`), row groups of 1M: one a partition

Prints one table (step, ms a partition, share of its pass) and cProfile's top functions; results/profile_dask.json."""
import argparse, cProfile, io, pstats, sys, tempfile, time, warnings
from pathlib import Path
sys.path.insert(0, str(Path(__file__).parent.parent))  # bench/: common, roofline
from common import report, sync

def main():
    p = argparse.ArgumentParser()
    p.add_argument('--rows', type=int, default=10_000_000)
    p.add_argument('--rg', type=int, default=1_000_000)
    p.add_argument('--cap', type=int, default=500_000)
    p.add_argument('--repeats', type=int, default=3)
    p.add_argument('--top', type=int, default=30)
    a = p.parse_args()
    import dask, dask.dataframe as dd, numpy as np
    from fastai.data.block import CategoryBlock
    from fastai_gpu_tabular.backend import gpu_available, read_frame, to_pandas, float32_exact, explode_rows
    from fastai_gpu_tabular.procs import Categorify, FillMissing, Normalize
    from fastai_gpu_tabular.tabular import RandomRowSplit, clean_conts, processed_frame, write_part
    from fastai_gpu_tabular.data import synth_criteo, CRITEO_SCHEMA
    import fastai_gpu_tabular.tabular_dask as tdm
    warnings.simplefilter('ignore')
    gpu = gpu_available()
    tmp = Path(tempfile.mkdtemp())
    synth_criteo(a.rows, cap=a.cap, seed=0, gpu=gpu, path=tmp/'in', file_rows=min(a.rows, 10_000_000), row_group_rows=a.rg)
    files = sorted((tmp/'in').glob('*.parquet'))
    kw = dict(**{k: list(v) if isinstance(v, tuple) else v for k, v in CRITEO_SCHEMA.items()}, y_block=CategoryBlock(),
              procs=[Categorify, FillMissing, Normalize], splits=RandomRowSplit(0.2, seed=42))
    read = lambda: (__import__('dask_cudf').read_parquet if gpu else dd.read_parquet)(files, split_row_groups=True)
    with dask.config.set(scheduler='sync'):
        td = tdm.TabularDask(read(), progress=False, **kw)
    conts, cats = list(td.cont_names), list(CRITEO_SCHEMA['cat_names'])
    rows = []
    def step(pass_, name, f, *args):
        ts = []
        for _ in range(a.repeats):
            sync(); t = time.perf_counter(); r = f(*args); sync(); ts.append(time.perf_counter() - t)
        rows.append(dict(pass_=pass_, step=name, ms=round(1e3 * float(np.median(ts)), 2)))
        return r
    cols = td._cols()
    def read_rg():
        if gpu: return __import__('cudf').read_parquet(files[0], columns=cols, row_groups=[0])
        import pyarrow.parquet as pq
        return pq.ParquetFile(files[0]).read_row_group(0, columns=cols).to_pandas()
    raw = step('any', f'read one row group ({a.rg:,} rows, {len(cols)} columns)', read_rg)
    part = step('statistics', 'clean_conts', lambda: clean_conts(raw.copy(), conts))
    num = [n for n in cols if part[n].dtype.kind in 'iuf']
    step('statistics', 'min and max of every column (to host)', lambda: (to_pandas(part[num].min()), to_pandas(part[num].max())))
    step('statistics', 'min and max of every column (_ranges: torch, a host copy a kind)', lambda: tdm._ranges(part, num))
    step('statistics', 'float32_exact', lambda: float32_exact(part, [n for n in num if n not in conts and part[n].dtype.kind == 'f']))
    valid = step('statistics', 'split flags', lambda: tdm._valid(part, 0, td.splits))
    tr = step('statistics', 'training rows', lambda: part[~valid])
    step('statistics', 'counts (to host)', lambda: dict(to_pandas(tr[conts + ['label']].count())))
    step('statistics', 'moments of 13 columns', lambda: tdm._moments(tr, conts))
    vcs = step('statistics', 'value counts of 26 columns (cuDF / pandas value_counts)', lambda: {n: tr[n].value_counts(dropna=True) for n in cats})
    step('statistics', 'merge two partitions\' value counts (concat, groupby)', lambda: {n: tdm._add_counts(v, v) for n, v in vcs.items()})
    vcs = step('statistics', 'value counts of 26 columns (_value_counts: unique)', lambda: {n: tdm._value_counts(tr[n]) for n in cats})
    step('statistics', 'merge two partitions\' value counts (_add_counts: unique, bincount)', lambda: {n: tdm._add_counts(v, v) for n, v in vcs.items()})
    step('statistics', 'first bins of 13 columns', lambda: {n: tdm._host_bins([tdm._value_bins(tdm._f64(tr, n))])[0] for n in conts})
    st = td._fused
    step('statistics', 'the whole _stats', lambda: tdm._stats(raw, 0, dict(tdm._plan(td, cols, True), vc=cats + ['label'])))
    prep = step('write', '_prepare', lambda: tdm._prepare(raw, conts, {n: t for n, t in td._layout['types'].items() if n in cols}, td.splits, 0))
    procs, names = list(td.procs), td._names
    for i, q in enumerate(procs):
        step('write', f'_apply up to {type(q).__name__}', lambda i=i: tdm._apply(prep, procs[:i+1], names))
    items = tdm._apply(prep, procs, names)
    out = step('write', 'processed_frame', lambda: tdm._processed(prep, procs, names, []))
    (tmp/'o'/'train').mkdir(parents=True); (tmp/'o'/'valid').mkdir(parents=True)
    step('write', '_write (train and valid files)', lambda: tdm._write(out, tmp/'o', 0, 131_072, 4_194_304))
    step('write', 'TabularGPU of the partition (a copy)', lambda: tdm.TabularGPU(prep, procs=list(procs), do_setup=False,
         reduce_memory=False, y_block=tdm.TransformBlock(), **names).process)
    tr_ = step('write', 'train and valid rows (two boolean masks)', lambda: out[~out[tdm._VALID]].drop(columns=[tdm._POS, tdm._VALID]))
    step('write', 'to host (to_arrow)', lambda: tr_.to_arrow() if gpu else None)
    for d,opts in (('disk', {}), ('disk', dict(compression=None)), ('disk', dict(statistics='NONE')), ('/dev/shm', {})):
        if not gpu and opts: continue
        f = (tmp if d == 'disk' else Path('/dev/shm'))/'x.parquet'
        step('write', f'train rows to_parquet to {d} {opts or "(snappy, row group statistics)"}',
             lambda f=f, opts=opts: tr_.to_parquet(f, index=False, row_group_size_rows=131_072, **opts) if gpu else tdm.write_parquet(tr_, f))
        f.unlink(missing_ok=True)
    step('write', 'the whole partition: read, _prepare, _processed, _write',
         lambda: tdm._write(tdm._processed(tdm._prepare(read_rg(), conts,
                                                        {n: t for n, t in td._layout['types'].items() if n in cols}, td.splits, 0),
                                           procs, names, []), tmp/'o', 0, 131_072, 4_194_304))
    # the whole thing in this process (the synchronous scheduler), with its passes' timings, then under cProfile
    with dask.config.set(scheduler='sync'):
        t = time.perf_counter(); to = tdm.TabularDask(read(), progress=False, **kw); to.to_parquet(tmp/'w1'); total = time.perf_counter() - t
        rows.append(dict(pass_='all', step=f'TabularDask + to_parquet, {a.rows:,} rows, sync scheduler', ms=round(1e3 * total, 1),
                         phases=', '.join(f'{k} {v:.2f}' for k, v in to.timings.items())))
        pr = cProfile.Profile(); pr.enable(); tdm.TabularDask(read(), progress=False, **kw).to_parquet(tmp/'w2'); pr.disable()
    s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats('tottime').print_stats(a.top); print(s.getvalue()[-12000:])
    report('profile_dask', rows, ['pass_', 'step', 'ms', 'phases'], dict(bench='profile_dask', n_rows=a.rows, row_group_rows=a.rg, gpu=gpu))

if __name__ == '__main__': main()
