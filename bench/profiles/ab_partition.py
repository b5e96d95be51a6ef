"""A/B in one process, alternating: a base package's `FillMissing` and `Normalize`, `_stats` and `_kth_pass` against this one's on a
2M-row Criteo partition (timings of two processes differ by up to 1.5x on the same machine; one process alternating does not).

    git archive <commit> fastai_gpu_tabular | tar -x -C /tmp/base
    python bench/profiles/ab_partition.py --base /tmp/base      # results/ab_procs_h200_a92521f.log, ab_stats_h200_1a5c738.log (base ce75072)

It checks that both give the same frames, bins, moments and keys first, then prints each step's median and minimum
(`_kth_pass`: 13 first-level requests and two narrowing ones, then a narrowing pass of each continuous column alone)."""
import sys, os, time, statistics, warnings, importlib, tempfile, argparse
from pathlib import Path
p = argparse.ArgumentParser()
p.add_argument('--base', required=True, help='folder holding the base `fastai_gpu_tabular` package')
p.add_argument('--reps', type=int, default=20)
a = p.parse_args()
warnings.simplefilter('ignore')
root = Path(tempfile.mkdtemp()); (root/'basepkg').mkdir(); (root/'basepkg'/'__init__.py').touch()
os.symlink(Path(a.base, 'fastai_gpu_tabular').resolve(), root/'basepkg'/'fastai_gpu_tabular')  # the base under another name
sys.path.insert(0, str(root))
import numpy as np, cudf, torch, dask, dask_cudf
from fastai.data.block import CategoryBlock
import fastai_gpu_tabular.tabular_dask as new_tdm, fastai_gpu_tabular.procs as new_procs
from fastai_gpu_tabular.tabular import TabularGPU, RandomRowSplit, clean_conts
from fastai_gpu_tabular.data import synth_criteo, CRITEO_SCHEMA
base = lambda m: importlib.import_module(f'basepkg.fastai_gpu_tabular.{m}')
old_tdm, old_procs = base('tabular_dask'), base('procs')

def ab(cases:dict, reps:int):
    "Median and minimum of each case, the cases alternated `reps` times (the first 3 rounds left out of the median)"
    times = {k: [] for k in cases}
    for _ in range(reps):
        for k, f in cases.items():
            torch.cuda.synchronize(); t = time.perf_counter(); f(); torch.cuda.synchronize(); times[k].append(time.perf_counter() - t)
    for k, v in times.items(): print(f'{k:25s} median {statistics.median(v[3:])*1e3:7.2f} ms  min {min(v)*1e3:7.2f}', flush=True)

# FillMissing and Normalize on a prepared partition of the 13 continuous columns
conts = list(CRITEO_SCHEMA['cont_names'])
df = synth_criteo(2_000_000, cap=500_000, seed=0, gpu=True)[conts + ['label']]
to = TabularGPU(df, procs=[new_procs.FillMissing, new_procs.Normalize], cont_names=conts, y_names='label', reduce_memory=False)
fill, norm = to.procs.fill_missing, to.procs.normalize
names = dict(cat_names=list(to.cat_names), cont_names=conts, y_names=['label'], mh_names=[])
prep = clean_conts(df.copy(), conts)
ofill, onorm = old_procs.FillMissing.from_state(fill.state()), old_procs.Normalize.from_state(norm.state())
x, y = old_tdm._apply(prep, [ofill, onorm], names).to_pandas(), new_tdm._apply(prep, [fill, norm], names).to_pandas()
print('same frames:', x.equals(y), list(x.columns) == list(y.columns), dict(x.dtypes) == dict(y.dtypes), flush=True)
ab({'base FillMissing': lambda: old_tdm._apply(prep, [ofill], names), 'new FillMissing': lambda: new_tdm._apply(prep, [fill], names),
    'base both': lambda: old_tdm._apply(prep, [ofill, onorm], names), 'new both': lambda: new_tdm._apply(prep, [fill, norm], names),
    'base none': lambda: old_tdm._apply(prep, [], names)}, a.reps)

# the statistics pass and a medians' pass over a partition of a fitted TabularDask
tmp = Path(tempfile.mkdtemp())
synth_criteo(6_000_000, cap=500_000, seed=0, gpu=True, path=tmp/'in', file_rows=6_000_000, row_group_rows=2_000_000)
files = sorted((tmp/'in').glob('*.parquet'))
kw = dict(**{k: list(v) if isinstance(v, tuple) else v for k, v in CRITEO_SCHEMA.items()}, y_block=CategoryBlock(),
          procs=[new_procs.Categorify, new_procs.FillMissing, new_procs.Normalize], splits=RandomRowSplit(0.2, seed=42))
with dask.config.set(scheduler='sync'):
    td = new_tdm.TabularDask(dask_cudf.read_parquet(files, split_row_groups=True), progress=False, **kw)
cols = td._cols()
raw = cudf.read_parquet(files[0], columns=cols, row_groups=[0])
plan = dict(new_tdm._plan(td, cols, True), vc=list(CRITEO_SCHEMA['cat_names']) + ['label'])
oplan = dict(plan, splits=base('tabular').RandomRowSplit(0.2, seed=42))  # the base's `_valid` knows its own class
part = clean_conts(raw.copy(), conts)
s0, s1 = old_tdm._stats(raw, 0, oplan), new_tdm._stats(raw, 0, plan)
same = all((np.asarray(u) == np.asarray(v)).all() for n in conts for u, v in zip(s0['bins'][n], s1['bins'][n]))
print('same bins and moments:', same and s0['moments'] == s1['moments'], flush=True)
def prefix(n):
    "The top 12 bits of column `n`'s median key: a narrowing pass's prefix, most keys outside it"
    x = new_tdm._f64(part, n); return int(torch.median(new_tdm.float_keys(x)[~x.isnan()] >> 52))
pre = prefix(conts[0])
reqs = [(n, 64, 0, False) for n in conts] + [(conts[0], 52, pre, False), (conts[0], 52, pre, True)]
narrow = [(n, 52, prefix(n), False) for n in conts]  # the second level of every column: the bins' keys left out
k0, k1 = old_tdm._kth_pass(part, reqs + narrow), new_tdm._kth_pass(part, reqs + narrow)
print('same kth:', all((np.asarray(u) == np.asarray(v)).all() for p, q in zip(k0, k1)
                       for u, v in (zip(p, q) if isinstance(p, tuple) else [(np.sort(p), np.sort(q))])), flush=True)
ab({'base _stats': lambda: old_tdm._stats(raw, 0, oplan), 'new _stats': lambda: new_tdm._stats(raw, 0, plan),
    f'base _kth_pass x{len(reqs)}': lambda: old_tdm._kth_pass(part, reqs), f'new _kth_pass x{len(reqs)}': lambda: new_tdm._kth_pass(part, reqs),
    f'base narrowing x{len(narrow)}': lambda: old_tdm._kth_pass(part, narrow),
    f'new narrowing x{len(narrow)}': lambda: new_tdm._kth_pass(part, narrow)}, a.reps)
