"""What a `TabularDask` partition of 2M Criteo rows costs on the GPU, step by step: `_stats`, `_prepare`, `_apply`, `_processed`,
the pieces of `Categorify`'s encoding (cuDF calls against torch's), `FillMissing` and `Normalize` alone, then cProfile of `_processed` and `_stats` (cumulative).

    python bench/profiles/partition_costs.py        # prints the table and the profiles (results/partition_costs_h100_2579301.log: at
                                           # 2579301, where `nans_to_nulls` counted every column's NaNs in one copy, since reverted)"""
import time, cProfile, pstats, io, sys, warnings, tempfile
from pathlib import Path
import numpy as np, cudf, torch, dask, dask_cudf
sys.path.insert(0, str(Path(__file__).parent.parent))  # bench/: common, roofline
from common import sync
from fastai.data.block import CategoryBlock
from fastai_gpu_tabular.data import synth_criteo, CRITEO_SCHEMA
from fastai_gpu_tabular.procs import Categorify, FillMissing, Normalize
from fastai_gpu_tabular.tabular import RandomRowSplit
from fastai_gpu_tabular.backend import cat_codes, device_tensor, like_series, _device_cats
import fastai_gpu_tabular.tabular_dask as tdm
warnings.simplefilter('ignore')
tmp = Path(tempfile.mkdtemp())
synth_criteo(6_000_000, cap=500_000, seed=0, gpu=True, path=tmp/'in', file_rows=6_000_000, row_group_rows=2_000_000)
files = sorted((tmp/'in').glob('*.parquet'))
kw = dict(**{k: list(v) if isinstance(v, tuple) else v for k, v in CRITEO_SCHEMA.items()}, y_block=CategoryBlock(),
          procs=[Categorify, FillMissing, Normalize], splits=RandomRowSplit(0.2, seed=42))
with dask.config.set(scheduler='sync'):
    td = tdm.TabularDask(dask_cudf.read_parquet(files, split_row_groups=True), progress=False, **kw)
cols, cats = td._cols(), list(CRITEO_SCHEMA['cat_names'])
raw = cudf.read_parquet(files[0], columns=cols, row_groups=[0])
types = {k: v for k, v in td._layout['types'].items() if k in cols}
prep = tdm._prepare(raw, list(td.cont_names), types, td.splits, 0)
procs, names = list(td.procs), td._names
cat = td.procs.categorify
plan = dict(tdm._plan(td, cols, True), vc=cats + ['label'])
def t(name, f, k=5):
    f(); sync(); s = time.perf_counter()
    for _ in range(k): r = f()
    sync(); print(f'{name:55s} {(time.perf_counter()-s)/k*1e3:8.2f} ms', flush=True); return r
print('dtypes', dict(prep.dtypes.astype(str).value_counts()))
t('_stats', lambda: tdm._stats(raw, 0, plan))
from fastai_gpu_tabular.tabular import clean_conts
tr = clean_conts(raw, plan['conts'])
t('  bins x13 (one copy)', lambda: tdm._host_bins([tdm._value_bins(tdm._f64(tr, n)) for n in td.cont_names]))
t('  bins x13 (a copy each)', lambda: [tdm._host_bins([tdm._value_bins(tdm._f64(tr, n))])[0] for n in td.cont_names])
t('  value counts x27', lambda: [tdm._value_counts(tr[n]) for n in plan['vc']])
t('  ranges', lambda: tdm._ranges(tr, [n for n in cols if tr[n].dtype.kind in 'iuf']))
t('  moments', lambda: tdm._moments(tr, plan['moments']))
t('_prepare', lambda: tdm._prepare(raw, list(td.cont_names), types, td.splits, 0))
t('_apply', lambda: tdm._apply(prep, procs, names))
t('_processed', lambda: tdm._processed(prep, procs, names, []))
fill, norm = (next(p for p in procs if isinstance(p, k)) for k in (FillMissing, Normalize))
t('_apply FillMissing (13 columns)', lambda: tdm._apply(prep, [fill], names))
filled = tdm._apply(prep, [fill], names)
t('_apply Normalize (13 filled columns)', lambda: tdm._apply(filled, [norm], names))
t('_apply nothing (the TabularGPU around the procs)', lambda: tdm._apply(prep, [], names))
t('Categorify._encode x26', lambda: [cat._encode(n, prep[n]) for n in cats])
t('cat_codes x26', lambda: [cat_codes(prep[n], cat._array(n)) for n in cats])
dts = {n: _device_cats(cat._array(n), prep[n].dtype) for n in cats}
t('  astype x26', lambda: [prep[n].astype(dts[n][1]) for n in cats])
vs = {n: device_tensor(prep[n].astype(dts[n][1])) for n in cats}
t('  device_tensor x26', lambda: [device_tensor(prep[n]) for n in cats])
t('  searchsorted+where x26', lambda: [torch.where(dts[n][2][(i := torch.searchsorted(dts[n][2], vs[n]).clamp_(max=len(dts[n][2])-1))] == vs[n], i, -1) for n in cats])
t('  isna x26', lambda: [prep[n].isna() for n in cats])
t('  has_nulls x26', lambda: [prep[n].has_nulls for n in cats])
z = torch.zeros(len(prep), dtype=torch.int64, device='cuda')
t('  like_series x26', lambda: [like_series(z, prep[n]) for n in cats])
c = like_series(z, prep[cats[0]])
t('  +1 (cuDF) x26', lambda: [c + 1 for n in cats])
p2 = prep.copy(deep=False)
t('  setitem x26', lambda: [p2.__setitem__(n, c) for n in cats])
for name, f in (('_processed', lambda: tdm._processed(prep, procs, names, [])), ('_stats', lambda: tdm._stats(raw, 0, plan))):
    pr = cProfile.Profile(); pr.enable()
    for _ in range(5): f()
    pr.disable(); s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats('cumtime').print_stats(45); print(name, s.getvalue()[:9000])
