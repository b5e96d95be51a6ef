"""Issue 32: results that were silently wrong (group ids merged by float32, NaN scores ranked first, lengths unchecked), an
overwrite that deleted a raw-data folder, and errors that named nothing. One test a finding; each failed before the fix."""
import json, os, shutil, warnings
from pathlib import Path
import dask, dask.dataframe as dd, numpy as np, pandas as pd, pytest, torch
import pyarrow as pa, pyarrow.parquet as pq
from fastai.tabular.all import CategoryBlock, RegressionBlock, ProgressCallback
from fastai.tabular.data import TabularDataLoaders
from fastai_gpu_tabular.procs import Categorify, FillMissing, Normalize
from fastai_gpu_tabular.tabular import TabularGPU, RandomRowSplit
from fastai_gpu_tabular.tabular_dask import TabularDask
from fastai_gpu_tabular.stream import ParquetDataLoader
from fastai_gpu_tabular.learner import tabular_learner
from fastai_gpu_tabular.ranking import mrr, ndcg_at_k, recall_at_k, roc_auc
from fastai_gpu_tabular.train import main, predict

PROCS = [Categorify, FillMissing, Normalize]
SPLIT = RandomRowSplit(0.3, 0)

def id_frame(n=3_000, seed=0):
    "Rows with raw group ids that float32 would merge: floats above 2**24 with gaps, nullable int64 near 2**62, strings"
    rng = np.random.default_rng(seed)
    user = (2**24 + rng.integers(0, 200, n)).astype('float64')
    user[rng.random(n) < 0.05] = np.nan
    big = pd.array(2**62 + rng.integers(0, 200, n), dtype='Int64'); big[rng.random(n) < 0.05] = pd.NA
    return pd.DataFrame({'a': rng.integers(0, 5, n), 'x': rng.normal(size=n), 'y': rng.integers(0, 2, n), 'user': user, 'big': big,
                         'name': rng.choice([f'u{i}' for i in range(150)], n)})

IDS = ['user', 'big', 'name']
def tab(df, **kw): return TabularGPU(df, procs=PROCS, cat_names=['a'], cont_names=['x'], y_names='y', y_block=CategoryBlock(), splits=SPLIT,
                                     **kw)
def same_groups(a, b):
    codes = lambda o: pd.factorize(np.asarray(o), use_na_sentinel=False)[0]
    return np.array_equal(codes(a), codes(b))

def valid_extras(dl):
    "The pass-through columns of every batch of loader `dl`, in order"
    return [torch.cat(x).cpu().numpy() for x in zip(*[b[-1] for b in dl])]

def check_ids(extras, df):
    ref = df.iloc[SPLIT(df)[1]].reset_index(drop=True)
    rng = np.random.default_rng(1)
    s, t = torch.tensor(rng.random(len(ref))), torch.tensor(ref['y'].to_numpy())
    for n, got in zip(IDS, extras):
        exact = pd.factorize(ref[n].astype(object).where(ref[n].notna(), None), use_na_sentinel=False)[0]
        assert same_groups(got, exact), n
        assert len(pd.unique(got)) == len(np.unique(exact)) == ref[n].nunique(dropna=False)
        for f in (mrr, lambda *a: ndcg_at_k(*a, k=5), lambda *a: roc_auc(*a)):
            # groups summed in another order
            assert np.isclose(float(f(s, t, torch.as_tensor(got))), float(f(s, t, torch.tensor(exact))), rtol=1e-12), n

def test_group_ids_stay_exact_in_memory_streamed_and_on_dask(tmp_path):
    df = id_frame()
    to = tab(df)
    check_ids(valid_extras(to.dataloaders(bs=256, shuffle=False, device='cpu', extra_names=IDS).valid), df)
    path = to.to_parquet(tmp_path/'mem', pass_names=IDS, row_group_rows=400)
    dls = TabularDataLoaders.from_processed(path, bs=256, shuffle=False, device='cpu', extra_names=IDS)
    check_ids(valid_extras(dls.valid), df)
    with dask.config.set(scheduler='synchronous'):
        td = TabularDask(dd.from_pandas(df, npartitions=3), procs=PROCS, cat_names=['a'], cont_names=['x'], y_names='y',
                         y_block=CategoryBlock(), splits=SPLIT, progress=False)
        path = td.to_parquet(tmp_path/'dask', pass_names=IDS, row_group_rows=400)
    assert pq.read_schema(path/'valid'/'part.00000.000.parquet').field('user').type == pa.float64()
    check_ids(valid_extras(TabularDataLoaders.from_processed(path, bs=256, shuffle=False, device='cpu', extra_names=IDS).valid), df)

def test_a_float_column_narrows_only_where_it_is_continuous_or_exact():
    df = pd.DataFrame({'a': [0, 1, 0, 1], 'x': [2.**24 + 1, 1., 2., 3.], 'id': [2.**24 + 1, 5., np.nan, 1.], 'half': [0.5, 1.5, np.nan, 2.],
                       'y': [0, 1, 0, 1]})
    to = TabularGPU(df, procs=[Categorify, Normalize], cat_names=['a'], cont_names=['x'], y_names='y')
    assert to.items['x'].dtype == np.float32 and to.items['id'].dtype == np.float64 and to.items['half'].dtype == np.float32
    assert to.items['id'][0] == 2**24 + 1

FUNCS = dict(mrr=mrr, ndcg=lambda p, t, g: ndcg_at_k(p, t, g, k=3), recall=lambda p, t, g: recall_at_k(p, t, g, k=3), auc=roc_auc)

@pytest.mark.parametrize('f', FUNCS.values(), ids=FUNCS.keys())
def test_nan_scores_give_nan_not_a_plausible_metric(f):
    p, t, g = torch.tensor([0.5, np.nan, 0.1, 0.9]), torch.tensor([0, 1, 0, 1]), torch.tensor([1, 1, 1, 1])
    assert np.isnan(float(f(p, t, g))) and np.isnan(float(f(torch.full((4,), np.nan), t, g)))
    assert not np.isnan(float(f(torch.tensor([0.5, 0.2, 0.1, 0.9]), t, g)))

@pytest.mark.parametrize('f', FUNCS.values(), ids=FUNCS.keys())
def test_lengths_must_match(f):
    x = torch.tensor([0.5, 0.2, 0.1, 0.9])
    for p, t, g, msg in ((x[:3], x > .3, torch.zeros(4), '3, 4 and 4'), (x, x[:3] > .3, torch.zeros(4), '4, 3 and 4'),
                         (x, x > .3, torch.zeros(5), '4, 4 and 5')):
        with pytest.raises(ValueError, match=f'`preds`, `targs` and `groups` must have one entry a row, not {msg}'): f(p, t, g)

@pytest.mark.parametrize('f', FUNCS.values(), ids=FUNCS.keys())
def test_column_vectors_and_string_groups(f):
    p, t, g = torch.tensor([0.5, 0.2, 0.1, 0.9, 0.3]), torch.tensor([0, 1, 1, 0, 1]), torch.tensor([0, 0, 1, 1, 1])
    want = float(f(p, t, g))
    assert float(f(p[:, None], t[:, None], g[:, None])) == want
    assert float(f(p, t, ['x', 'x', 'y', 'y', 'y'])) == want == float(f(p, t, np.array(['x', 'x', None, None, None], dtype=object)))
    with pytest.raises(ValueError, match=r'`preds` must be 1-D or of shape \(n, 1\), not \(5, 2\)'): f(torch.stack([p, p], 1), t, g)

@pytest.mark.parametrize('f', FUNCS.values(), ids=FUNCS.keys())
def test_empty_input_gives_nan_for_every_metric(f):
    e = torch.zeros(0)
    assert np.isnan(float(f(e, e, e.long())))

def test_overwrite_replaces_only_a_processed_or_empty_folder(tmp_path):
    to = tab(id_frame(500))
    raw = tmp_path/'raw.parquet'; raw.mkdir(); to.items.to_parquet(raw/'part.0.parquet')
    with pytest.raises(FileExistsError, match=r'raw.parquet is not a processed folder \(no dataset.json\) and holds part.0.parquet'):
        to.to_parquet(raw, overwrite=True)
    assert (raw/'part.0.parquet').exists() and not list(tmp_path.glob('.raw*'))
    (tmp_path/'empty').mkdir(); to.to_parquet(tmp_path/'empty', overwrite=True)
    p = to.to_parquet(tmp_path/'p'); to.to_parquet(p, overwrite=True, row_group_rows=100)
    assert json.loads((p/'dataset.json').read_text())['row_group_rows'] == 100 and not (p/'.writer').exists()
    f = tmp_path/'file'; f.write_text('keep me')
    for ow in (False, True):
        with pytest.raises(FileExistsError, match='is a file, not a folder'): to.to_parquet(f, overwrite=ow)
    assert f.read_text() == 'keep me' and not list(tmp_path.glob('.file*'))

def test_a_killed_writers_temporary_folder_is_named_and_removed(tmp_path):
    to = tab(id_frame(500))
    dead = tmp_path/'.p.tmp-0badf00d'; (dead/'train').mkdir(parents=True)
    (dead/'.writer').write_text(json.dumps(dict(host=os.uname().nodename, pid=2**22 + 12345)))  # no such process
    live = tmp_path/'.p.tmp-1111aaaa'; live.mkdir()
    (live/'.writer').write_text(json.dumps(dict(host=os.uname().nodename, pid=os.getpid())))
    with pytest.warns(UserWarning, match=r'removed .*\.p\.tmp-0badf00d: the temporary folder of an earlier write'):
        to.to_parquet(tmp_path/'p')
    assert not dead.exists() and live.exists()

def processed(tmp_path, name='ok', df=None, **kw):
    return tab(id_frame(2_000) if df is None else df, **kw).to_parquet(tmp_path/name, row_group_rows=300)

def rewrite(path, f):
    "Apply `f` to the table of every part file of `path`"
    for fn in sorted(path.glob('*/part.*.parquet')): pq.write_table(f(pq.read_table(fn)), fn)

def test_a_damaged_page_names_its_file(tmp_path):
    path = processed(tmp_path)
    fn = path/'train'/'part.00000.parquet'
    b = bytearray(fn.read_bytes()); b[4:40] = b'\xff'*36; fn.write_bytes(bytes(b))  # the first page header
    with pytest.raises(ValueError, match=r'train/part.00000.parquet: cannot read row groups \[0'):
        for _ in ParquetDataLoader(path, bs=256, device='cpu'): pass

def test_fgt_predict_on_an_empty_file_says_so(tmp_path):
    df = id_frame(2_000)
    df.to_parquet(tmp_path/'in.parquet')
    main(data=str(tmp_path/'in.parquet'), cat_names='a', cont_names='x', y_names='y', epochs=1, bs=256, cpu=True, out=str(tmp_path/'run'))
    df.iloc[:0].to_parquet(tmp_path/'empty.parquet')
    with pytest.raises(ValueError, match=r'empty.parquet has no rows: nothing to score'):
        predict(model=str(tmp_path/'run'), data=str(tmp_path/'empty.parquet'), out=str(tmp_path/'o.parquet'), cpu=True)

def test_a_folder_without_its_target_is_refused_before_training(tmp_path):
    path = processed(tmp_path)
    rewrite(path, lambda t: t.drop_columns(['y']))
    with pytest.raises(ValueError, match=r'the training rows have no target column .*\[.y.\]'):
        TabularDataLoaders.from_processed(path, bs=256, device='cpu')
    with pytest.raises(ValueError, match='no target column'): main(data=str(path), epochs=1, bs=256, cpu=True, out=str(tmp_path/'run'))
    assert len(ParquetDataLoader(path, bs=256, device='cpu')) > 0  # to predict, a folder without targets is fine

def test_a_float_target_in_a_classification_folder_is_refused(tmp_path):
    path = processed(tmp_path)
    rewrite(path, lambda t: t.set_column(t.schema.get_field_index('y'), 'y', t['y'].cast('float64')))
    with pytest.raises(ValueError, match=r"target 'y' is double, but the saved procs classify it"):
        TabularDataLoaders.from_processed(path, bs=256, device='cpu')

def test_codes_outside_the_vocabulary_are_refused_naming_the_column(tmp_path):
    path = processed(tmp_path)
    fn = path/'train'/'part.00000.parquet'
    t = pq.read_table(fn); a = t['a'].to_numpy().copy(); a[7] = 99
    pq.write_table(t.set_column(t.schema.get_field_index('a'), 'a', pa.array(a)), fn, row_group_size=300)
    with pytest.raises(ValueError, match=r"part.00000.parquet: column 'a' holds codes from \d+ to 99, but its vocabulary .* has 6 entries"):
        TabularDataLoaders.from_processed(path, bs=256, device='cpu')
    path = processed(tmp_path, 'short')  # a vocabulary shortened in procs.json
    pj = path/'procs'/'procs.json'; d = json.loads(pj.read_text())
    cat = next(p for p in d['procs'] if p['type'] == 'Categorify'); cat['vocab']['a'] = cat['vocab']['a'][:3]
    pj.write_text(json.dumps(d))
    with pytest.raises(ValueError, match=r"column 'a' holds codes from \d to 5, but its vocabulary in the saved procs has 4 entries"):
        ParquetDataLoader(path, bs=256, device='cpu')

def test_missing_continuous_values_are_refused_before_training(tmp_path):
    df = id_frame(2_000); df.loc[::50, 'x'] = np.nan
    to = TabularGPU(df, procs=[Categorify, Normalize], cat_names=['a'], cont_names=['x'], y_names='y', y_block=CategoryBlock(),
                    splits=SPLIT)
    path = to.to_parquet(tmp_path/'nan', row_group_rows=300)
    with pytest.raises(ValueError, match=r"continuous column 'x' has missing or infinite values \(\d+ missing.*`FillMissing`"):
        TabularDataLoaders.from_processed(path, bs=256, device='cpu')

def test_load_run_and_save_run_are_in_all():
    import fastai_gpu_tabular.all as a
    from fastai_gpu_tabular.learner import load_run, save_run
    assert a.load_run is load_run and a.save_run is save_run and {'load_run', 'save_run'} <= set(a.__all__)

@pytest.mark.gpu
def test_on_the_gpu_ids_stay_exact_and_checked_metrics_do_not_sync(tmp_path):
    from fastai_gpu_tabular.backend import to_backend
    df = id_frame()
    to = tab(to_backend(df, gpu=True))
    assert to.items['user'].dtype == np.float64
    check_ids(valid_extras(to.dataloaders(bs=256, shuffle=False, device='cuda', extra_names=IDS).valid), df)
    path = to.to_parquet(tmp_path/'gpu', pass_names=IDS, row_group_rows=400)
    for reader in ('cudf', 'pyarrow'):
        check_ids(valid_extras(TabularDataLoaders.from_processed(path, bs=256, shuffle=False, device='cuda', reader=reader,
                                                                 extra_names=IDS).valid), df)
    rng = np.random.default_rng(0)
    P, T = torch.tensor(rng.random(50_000), device='cuda')[:, None], torch.tensor(rng.integers(0, 2, 50_000), device='cuda')
    G = torch.tensor(2.**24 + rng.integers(0, 900, 50_000), device='cuda'); G[::97] = np.nan
    want = [float(f(P, T, G)) for f in FUNCS.values()]
    torch.cuda.set_sync_debug_mode('error')  # the checks of valid input add no host sync
    try: got = [f(P, T, G) for f in FUNCS.values()] + [f(P.clone().fill_(np.nan), T, G) for f in FUNCS.values()]
    finally: torch.cuda.set_sync_debug_mode('default')
    assert [float(o) for o in got[:4]] == want and all(np.isnan(float(o)) for o in got[4:])
