"GPU suite (`pytest -m gpu`): our cuDF path equals our pandas path on the same data, multi-hot included."
import pickle, numpy as np, pandas as pd, pytest
from hypothesis import given, settings, assume, HealthCheck
from fastai.data.block import CategoryBlock, RegressionBlock
from fastai_gpu_tabular.backend import *
from fastai_gpu_tabular.procs import Categorify, FillMissing, FillStrategy, Normalize
from fastai_gpu_tabular.tabular import TabularGPU, save_procs
from fastai_gpu_tabular.data import synth_movielens, BENCH_SCHEMA, BENCH_MH, main
from fastai_gpu_tabular.tabular import random_splits
from frames import frames, usable, CAT, CONT, MH

pytestmark = pytest.mark.gpu

def pair(df, procs, **kw):
    "The same `TabularGPU` built on pandas and on cuDF"
    mk = lambda d: TabularGPU(d, procs=procs(), **kw)
    return mk(to_pandas(df)), mk(to_backend(to_pandas(df), gpu=True))

def assert_same(p, g):
    assert is_cudf(g.items) and not is_cudf(p.items)
    assert list(p.cat_names) == list(g.cat_names) and list(p.items.columns) == list(g.items.columns)
    gi = to_pandas(g.items)
    for n in p.cat_names: np.testing.assert_array_equal(gi[n].to_numpy(), p.items[n].to_numpy(), err_msg=n)
    for n in p.cont_names:
        assert gi[n].dtype == np.float32, n
        np.testing.assert_allclose(gi[n].to_numpy(), p.items[n].to_numpy(), rtol=1e-6, atol=1e-7, err_msg=n)
    for n in p.mh_names: assert [list(o) for o in gi[n]] == [list(o) for o in p.items[n]], n
    for n in p.y_names:
        if n in p.items.columns: np.testing.assert_allclose(gi[n].to_numpy(np.float64), p.items[n].to_numpy(np.float64), rtol=1e-6,
                                                            err_msg=n)
    for n,c in getattr(p, 'classes', {}).items(): assert list(c) == list(g.classes[n]), n

@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(frames())
def test_cudf_equals_pandas_random(d):
    _check_random(d)

def test_cudf_equals_pandas_constant_float32_column():
    "Regression: one training value in a float32 column (std 0) once normalised to +1.19 on pandas and -1.19 on cuDF"
    df = pd.DataFrame({'ci': [np.nan]*5 + [0.] + [np.nan]*3, 'cs': [None]*5 + ['a'] + [None]*3, 'cc': [7]*9,
                       'mh': pd.Series([None]*5 + [''] + [None]*3, dtype=object),
                       'xf': np.array([np.nan]*5 + [1.603822] + [np.nan]*3, np.float32),
                       'xi': [0]*9, 'yc': ['no']*9, 'yr': [0.]*9})
    _check_random((df, 6))

def _check_random(d):
    df, n_train = d
    assume(usable(df, n_train))
    splits = [list(range(n_train)), list(range(n_train, len(df)))]
    for y, blk in (('yc', CategoryBlock()), ('yr', RegressionBlock())):
        p, g = pair(df, lambda: [Categorify, FillMissing, Normalize], cat_names=CAT, cont_names=CONT, mh_names=MH,
                    y_names=y, y_block=blk, splits=splits)
        assert_same(p, g)
    test = df.assign(ci=df['ci'].where(df.index % 3 > 0, 99.), xi=df['xi'].astype('float64').where(df.index % 2 > 0))
    tp, tg = p.new(test), g.new(to_backend(test, gpu=True))
    tp.process(); tg.process()
    assert_same(tp, tg)

@pytest.mark.parametrize('opts', [dict(), dict(freq_threshold=3), dict(max_size=1000, unseen=True), dict(unseen=True)])
def test_cudf_equals_pandas_synthetic(opts):
    df = synth_movielens(200_000, gpu=True)
    tr, va = random_splits(len(df))
    p, g = pair(df, lambda: [Categorify(**opts), FillMissing(fill_strategy=FillStrategy.mode), Normalize],
                splits=(tr, va), y_block=CategoryBlock(), mh_names=BENCH_MH, **BENCH_SCHEMA)
    assert_same(p, g)

def test_synthetic_on_gpu_has_signal():
    df = synth_movielens(500_000, gpu=True)
    assert is_cudf(df) and len(df) == 500_000
    assert 0.4 < float(df['target'].mean()) < 0.6
    assert 0.02 < float(df['year'].isna().mean()) < 0.08
    vc = df['movieId'].value_counts()
    assert int(vc.iloc[0]) > 20 * float(vc.median())

def test_sliced_list_column_values_offsets():
    df = synth_movielens(1_000, gpu=True)
    g = TabularGPU(df, procs=[Categorify], mh_names=['genres'], cat_names=['userId'])
    s = g.items['genres'].iloc[300:310]
    vals, offs = list_values_offsets(s)
    rows = [list(o) for o in s.to_pandas()]
    assert [vals[int(offs[i]):int(offs[i+1])].get().tolist() for i in range(10)] == rows

def test_saved_state_from_gpu_applies_on_pandas(tmp_path):
    df = synth_movielens(50_000, gpu=True)
    splits = random_splits(len(df))
    p, g = pair(df, lambda: [Categorify(max_size=2_000), FillMissing, Normalize], splits=splits, y_block=CategoryBlock(),
                mh_names=BENCH_MH, **BENCH_SCHEMA)
    save_procs(g, tmp_path, parquet_min=100)
    again = TabularGPU.from_saved(to_pandas(df).iloc[splits[0]].reset_index(drop=True), tmp_path)
    for n in p.cat_names + ['target']: np.testing.assert_array_equal(again.items[n].to_numpy(), p.items[n].iloc[:len(p.train)].to_numpy())
    assert b'cudf' not in pickle.dumps(g.new_empty())

def test_main_job_on_gpu(capsys, tmp_path):
    main(data='synth', rows=100_000, out=str(tmp_path/'proc'))
    assert 'cuDF (GPU)' in capsys.readouterr().out and (tmp_path/'proc'/'dataset.json').exists()

def test_fill_missing_and_normalize_on_cudf_equal_pandas():
    "The procs' torch paths (float columns, set as arrays) and cuDF's (a nullable integer) give pandas' frame, flags and warning"
    import cudf, warnings
    from fastai_gpu_tabular.tabular import TabularGPU
    from fastai_gpu_tabular.procs import FillMissing, Normalize
    rng = np.random.default_rng(0)
    tr = pd.DataFrame(dict(a=rng.standard_normal(1_000).astype('float32'), b=rng.standard_normal(1_000) * 1e6,
                           c=pd.array(rng.integers(-50, 50, 1_000), dtype='Int64'), y=rng.integers(0, 2, 1_000)))
    tr.loc[::7, 'a'] = np.nan; tr.loc[::9, 'c'] = None
    te = tr.copy(); te.loc[::5, 'b'] = np.nan  # `b` had no missing values in training
    kw = dict(procs=[FillMissing, Normalize], cont_names=['a', 'b', 'c'], y_names='y')
    p, g = TabularGPU(tr, **kw), TabularGPU(cudf.from_pandas(tr), **kw)
    for t in (p, g): assert list(t.cat_names) == ['a_na', 'c_na'] and list(t.items.columns) == ['a', 'b', 'c', 'y', 'a_na', 'c_na']
    pd.testing.assert_frame_equal(g.items.to_pandas(), p.items, check_dtype=False)
    assert dict(g.items.dtypes.astype(str)) == dict(p.items.dtypes.astype(str))
    out = []
    for t in (p, g):
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter('always')
            x = t.new(cudf.from_pandas(te) if t is g else te.copy()); x.process(); out.append(to_pandas(x.items))
        assert [str(o.message)[:48] for o in w] == ["continuous column 'b' has 200 missing values but"]
    assert out[0]['b'].notna().all() and list(out[0].columns) == list(out[1].columns)
    pd.testing.assert_frame_equal(out[1], out[0], check_dtype=False)

def test_column_helpers_on_cudf_equal_pandas():
    "`fill_nulls`, `nan_tensor`, `cat_codes`, `clean_conts` and `TabularDask`'s `_ranges` give on cuDF what they give on pandas"
    import cudf, warnings
    from fastai_gpu_tabular.tabular import clean_conts
    from fastai_gpu_tabular.tabular_dask import _ranges
    pdf = pd.DataFrame(dict(a=np.array([3, 1, 2], dtype='int8'), b=pd.array([None, 5, -7], dtype='Int64'), c=[np.nan, 1.5, -np.inf],
                            e=[np.nan]*3, f=np.array([2**63+5, 1, 3], dtype='uint64'), h=np.array([1., 2., 3.], dtype='float32'),
                            i=np.array([-2**63, 0, 2**63-1])))
    gdf = cudf.from_pandas(pdf).nans_to_nulls()
    lo, hi = _ranges(gdf, list(pdf.columns))
    assert (lo['i'], hi['i'], hi['f'], lo['b'], hi['b']) == (-2**63, 2**63-1, 2**63+5, -7, 5) and np.isnan(lo['e'])
    assert {k: v for k, v in lo.items() if k != 'e'} == {k: v for k, v in _ranges(pdf, list(pdf.columns))[0].items() if k != 'e'}
    for n in 'ceh':
        assert fill_nulls(gdf[n], 7.5).to_pandas().tolist() == fill_nulls(pdf[n], 7.5).tolist()
        assert fill_nulls(gdf[n], 7.5).dtype == gdf[n].dtype and not fill_nulls(gdf[n], 7.5).has_nulls
        np.testing.assert_array_equal(nan_tensor(gdf[n]).cpu().numpy(), nan_tensor(pdf[n]).numpy())
    from fastai_gpu_tabular.backend import _CATS
    cats, s = np.array([2, 5, 9]), cudf.Series([5, 9, None, 7, 2], dtype='int32')
    assert cat_codes(s, cats).to_pandas().tolist() == cat_codes(s, cats).to_pandas().tolist() == [1, 2, -1, -1, 0]
    assert cat_codes(s.to_pandas(), cats).tolist() == [1, 2, -1, -1, 0]
    assert sum(v[0]() is cats for v in _CATS.values()) == 1  # a vocabulary array goes to the GPU once, not once a call
    n = len(_CATS); del cats
    assert len(_CATS) == n - 1  # and its copy goes with it
    cats = np.array([2, 5, 9])
    for dt in ('int8', 'int16', 'uint16', 'uint64', 'float32', 'int64'):  # no missing values: cast by torch, or by cuDF (uint16, uint64)
        s = cudf.Series([5, 9, 3, 7, 2], dtype=dt)
        assert cat_codes(s, cats, add=1).to_pandas().tolist() == cat_codes(s.to_pandas(), cats, add=1).tolist() == [2, 3, 0, 0, 1], dt
    assert cat_codes(cudf.Series([True, False, True]), np.array([False, True]), add=1).to_pandas().tolist() == [2, 1, 2]
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter('always')
        g, p = clean_conts(gdf.copy(), ['c', 'e', 'h']), clean_conts(pdf.copy(), ['c', 'e', 'h'])
    assert sum("'c' has 1 infinite" in str(o.message) for o in w) == 2
    pd.testing.assert_frame_equal(g.to_pandas()[['c', 'e', 'h']], p[['c', 'e', 'h']], check_dtype=False)
