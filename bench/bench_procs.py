"""fastai's pandas procs against ours on cuDF, on MovieLens-shaped rows of the benchmark schema.

    python bench/bench_procs.py --rows 25000000

Times building the `TabularPandas` / `TabularGPU` (Categorify, FillMissing, Normalize fitted on the training split and
applied to all rows; fastai's defaults otherwise; the splits made beforehand, as lists for fastai and as arrays on
the data's device for ours), warm (median of repeats after a first call) and cold (the first call in
the process). Multi-hot genres, which stock fastai has not, get a row of their own."""
import argparse, sys, warnings
from pathlib import Path
sys.path.insert(0, str(Path(__file__).parent))
from common import timed, report
from fastai.tabular.core import TabularPandas, Categorify as FCategorify, FillMissing as FFillMissing
from fastai.data.transforms import Normalize as FNormalize
from fastai.data.block import CategoryBlock
from fastai_gpu_tabular.backend import to_pandas, gpu_available
from fastai_gpu_tabular.procs import Categorify, FillMissing, Normalize
from fastai_gpu_tabular.tabular import TabularGPU
from fastai_gpu_tabular.data import synth_movielens, BENCH_SCHEMA, BENCH_MH, synth_tabular
from fastai_gpu_tabular.tabular import random_splits

p = argparse.ArgumentParser()
p.add_argument('--rows', type=int, default=25_000_000)
p.add_argument('--repeats', type=int, default=5)
p.add_argument('--fastai-repeats', type=int, default=2)
a = p.parse_args()

gpu = gpu_available()
df = synth_movielens(a.rows, gpu=gpu)
pdf = to_pandas(df)
tr, va = random_splits(a.rows)
lists = [tr.tolist(), va.tolist()]
def ours(d, **kw):
    sp = random_splits(a.rows, like=d)  # made once, on the data's device: fastai gets its lists the same way
    return lambda: synth_tabular(d, splits=sp, **kw)
def fastai():
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        TabularPandas(pdf.drop(columns=list(BENCH_MH)), procs=[FCategorify, FFillMissing, FNormalize], splits=lists, y_block=CategoryBlock(), **BENCH_SCHEMA)

rows = []
def row(name, f, repeats, warmup=1):
    med, first, ts = timed(f, repeats, warmup)
    rows.append(dict(run=name, warm_s=round(med, 3), cold_s=round(first, 3), repeats=repeats, times=[round(t, 3) for t in ts]))
    print(f"  {name}: median {med:.3f}s, first {first:.3f}s", flush=True)

if gpu: row('ours, cuDF (GPU)', ours(df.drop(columns=list(BENCH_MH))), a.repeats)
row('fastai TabularPandas (CPU)', fastai, a.fastai_repeats)
row('ours, pandas (CPU)', ours(pdf.drop(columns=list(BENCH_MH))), a.fastai_repeats)
if gpu: row('ours, cuDF (GPU) + multi-hot genres', ours(df, mh_names=BENCH_MH), a.repeats)
base = rows[[r['run'] for r in rows].index('fastai TabularPandas (CPU)')]['warm_s']
for r in rows: r['speedup_vs_fastai'] = round(base / r['warm_s'], 1)
print(f"\nprocs on {a.rows:,} rows (Categorify, FillMissing, Normalize; fit on {len(tr):,}, apply to all)")
out = report('procs', rows, ['run', 'warm_s', 'cold_s', 'speedup_vs_fastai'], dict(bench='procs', n_rows=a.rows))
print('wrote', out)
