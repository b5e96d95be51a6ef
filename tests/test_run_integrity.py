"""Issue 57: a saved run always loads, a resumed run is the run it resumes, inputs are never silently merged or ignored, and every
error names its file, column, flag or checkpoint. One test a finding (the item's number in its name); each failed before the fix."""
import json, os, shutil, subprocess, sys, time, warnings
from pathlib import Path
import numpy as np, pandas as pd, pytest, torch
import pyarrow as pa, pyarrow.parquet as pq
from fastai_gpu_tabular.train import main, predict
from fastai_gpu_tabular.data import main as prep

C = dict(cat_names='u,i', cont_names='x,z', y_names='y')
FAST = dict(cpu=True, epochs=1, bs=512, lr=1e-2, layers='16', emb_dim='4', opt='adam')

def base_frame(n=20_000, seed=0):
    "int ids `u` (300) and `i` (200), floats `x` and `z`, a 0/1 target `y` tied to them and a float target `r`"
    rng = np.random.default_rng(seed)
    u, i, x = rng.integers(0, 300, n), rng.integers(0, 200, n), rng.normal(size=n)
    y = ((u % 7 < 3) ^ (x > 0.5)).astype('int64')
    return pd.DataFrame({'u': u, 'i': i, 'x': x, 'z': rng.normal(size=n), 'y': y, 'r': x + 0.1*rng.normal(size=n)})

@pytest.fixture(scope='module')
def base(tmp_path_factory):
    fn = tmp_path_factory.mktemp('b')/'base.parquet'
    base_frame().to_parquet(fn)
    return fn

@pytest.fixture(scope='module')
def client():
    from distributed import Client, LocalCluster
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as cl, Client(cl) as c: yield c

def vocab(out):
    from fastai_gpu_tabular.tabular import load_procs
    procs, _ = load_procs(Path(out)/'procs')
    return {n: len(v) for p in procs if hasattr(p, 'classes') for n, v in p.classes.items()}

def test_01_a_row_sparse_run_loads_in_fgt_predict(base, tmp_path):
    from fastai_gpu_tabular.all import SparseEmbedOpt, SPARSE_RULES  # the class that the sparse error message names
    assert 'rowwise-adagrad' in SPARSE_RULES and SparseEmbedOpt
    main(data=str(base), out=str(tmp_path/'run'), emb_opt='rowwise-adagrad', emb_rule='fixed', **C, **FAST)
    res = predict(model=str(tmp_path/'run'), data=str(base), out=str(tmp_path/'p.parquet'), cpu=True)
    assert len(res) == 20_000 and res['prob_1'].between(0, 1).all()
    assert json.loads((tmp_path/'run'/'model'/'model.json').read_text())['sparse_rule'] == 'rowwise-adagrad'

def test_02_a_processed_folder_inside_the_input_is_never_read_as_raw_rows(base, tmp_path, client):
    inp = tmp_path/'in'; (inp/'sub').mkdir(parents=True)
    df = base_frame(4_000)
    df.iloc[:2_000].to_parquet(inp/'a.parquet'); df.iloc[2_000:].to_parquet(inp/'sub'/'b.parquet')  # a subfolder: read both ways
    prep(data=str(inp), out=str(inp/'proc'), cpu=True, **C)
    for dask in (False, True):
        with pytest.warns(UserWarning, match=r'left out the processed folder.*proc'):
            to = prep(data=str(inp), out=str(tmp_path/f'p{dask}'), cpu=True, dask=dask, **C)
        info = json.loads((tmp_path/f'p{dask}'/'dataset.json').read_text())
        assert info['train']['rows'] + info['valid']['rows'] == 4_000, dask
        assert vocab(tmp_path/f'p{dask}') == vocab(inp/'proc'), dask
    with pytest.raises(ValueError, match='is a processed folder'): prep(data=str(inp/'proc'), out=str(tmp_path/'again'), cpu=True, **C)

def test_03_a_processed_folder_refuses_the_flags_it_would_ignore(base, tmp_path):
    prep(data=str(base), out=str(tmp_path/'proc'), cpu=True, **C)
    kw = dict(data=str(tmp_path/'proc'), out=str(tmp_path/'run'), **FAST)
    for bad, match in ((dict(y_names='r', y_block='regression'), '`y_names` .r.'), (dict(y_block='regression'), '`y_block`'),
                       (dict(cat_names='i,u'), '`cat_names`'), (dict(cont_names='x'), '`cont_names`'),
                       (dict(valid_pct=0.3), '`valid_pct`')):
        with pytest.raises(ValueError, match=match): main(**kw, **bad)
    main(**kw, **C, y_block='category')  # the folder's own names and target: accepted

def interrupted(base, out, **kw):
    "A run of 2 epochs stopped in its second epoch (a checkpoint at the end of the first)"
    main(data=str(base), out=str(out), stop_after=35, **dict(C, **dict(FAST, epochs=2), **kw))
    assert (out/'checkpoint.pth').exists()

@pytest.mark.parametrize('change, flag', [(dict(seed=1), '--seed'), (dict(valid_pct=0.3), '--valid-pct'),
    (dict(cat_names='i,u'), '--cat-names'), (dict(emb_opt='lazy-adam', emb_rule='fixed'), '--emb-opt'), (dict(emb_dim='8'), '--emb-dim'),
    (dict(layers='32'), '--layers'), (dict(lr=3e-3), '--lr'), (dict(bs=256), '--bs')])
def test_04_resume_names_each_setting_that_differs(base, tmp_path, change, flag):
    interrupted(base, tmp_path/'r')
    kw = dict(C, **dict(FAST, epochs=2))
    with pytest.raises(ValueError, match=f'`{flag}` was'): main(data=str(base), out=str(tmp_path/'r'), resume=True, **dict(kw, **change))

def test_04_resume_refuses_other_data_and_goes_on_with_the_same(base, tmp_path):
    interrupted(base, tmp_path/'r')
    other = tmp_path/'other.parquet'
    base_frame().assign(u=lambda d: d.u + 1000*(d.index % 2)).to_parquet(other)  # another vocabulary of `u`
    kw = dict(C, **dict(FAST, epochs=2))
    with pytest.raises(ValueError, match=r'`--data` was .*vocabulary sizes'):
        main(data=str(other), out=str(tmp_path/'r'), resume=True, **kw)
    main(data=str(base), out=str(tmp_path/'r'), resume=True, **kw)
    assert json.loads((tmp_path/'r'/'metrics.json').read_text())['accuracy'] > 0.6

def no_metadata(df, fn):
    "Write `df` as parquet with no pandas metadata (as Spark or Arrow writers do)"
    t = pa.Table.from_pandas(df, preserve_index=False)
    pq.write_table(t.replace_schema_metadata(None), fn)

def test_05_int64_ids_above_2_53_with_nulls_keep_apart(tmp_path, client):
    df = base_frame(6_000)
    big = pd.array(2**60 + 3*df['u'].to_numpy(), dtype='Int64'); big[::50] = pd.NA  # 300 ids that float64 would merge
    d = tmp_path/'in'; d.mkdir()
    no_metadata(df.assign(u=big), d/'a.parquet')
    assert pq.read_schema(d/'a.parquet').metadata is None and pd.read_parquet(d/'a.parquet')['u'].dtype == 'float64'  # what pandas does
    for dask in (False, True):
        prep(data=str(d), out=str(tmp_path/f'p{dask}'), cpu=True, dask=dask, valid_pct=0.01, **C)
        assert vocab(tmp_path/f'p{dask}')['u'] == 301, dask  # 300 ids and #na#

def test_06_mismatched_files_of_a_folder_are_refused_with_and_without_dask(tmp_path, client):
    df = base_frame(4_000)
    for name, other, match in (('missing', df.drop(columns=['z']), r"b.parquet has no column 'z', which .*a.parquet has"),
                               ('strings', df.assign(u=df.u.astype(str)),
                                r"column 'u' is (large_)?string in .*b.parquet but int64 in .*a.parquet")):
        d = tmp_path/name; d.mkdir()
        df.iloc[:2_000].to_parquet(d/'a.parquet'); other.iloc[2_000:].to_parquet(d/'b.parquet')
        for dask in (False, True):
            with pytest.raises(ValueError, match=match): prep(data=str(d), out=str(tmp_path/'o'), cpu=True, dask=dask, **C)
            assert not (tmp_path/'o').exists()
    d = tmp_path/'widths'; d.mkdir()  # int32 in one file, int64 in the other: one column of int64
    df.iloc[:2_000].astype({'u': 'int32'}).to_parquet(d/'a.parquet'); df.iloc[2_000:].to_parquet(d/'b.parquet')
    for dask in (False, True):
        prep(data=str(d), out=str(tmp_path/f'w{dask}'), cpu=True, dask=dask, **C)
    assert vocab(tmp_path/'wFalse') == vocab(tmp_path/'wTrue')
    d = tmp_path/'nulls'; d.mkdir()  # a column of nulls only in one file: another schema (files that dask would merge, too)
    df.iloc[:2_000].to_parquet(d/'a.parquet')
    t = pa.Table.from_pandas(df.iloc[2_000:].drop(columns=['x']), preserve_index=False)
    pq.write_table(t.append_column('x', pa.nulls(len(t))).select(list(df.columns)), d/'b.parquet')
    prep(data=str(d), out=str(tmp_path/'n'), cpu=True, **C)
    with pytest.raises(ValueError, match="column 'x' has different dtypes"):
        prep(data=str(d), out=str(tmp_path/'nd'), cpu=True, dask=True, **C)

def test_07_a_diverged_run_stops_with_an_error_naming_epoch_and_batch(base, tmp_path):
    with pytest.raises(FloatingPointError, match=r'not finite .* from batch \d+ of epoch 0'):
        main(data=str(base), out=str(tmp_path/'r'), **dict(FAST, lr=1e8, bs=256), cat_names='u,i', cont_names='x,z', y_names='r',
             y_block='regression')
    assert not (tmp_path/'r'/'model').exists()
    for lr in (float('nan'), 0., -1.):
        with pytest.raises(ValueError, match='`lr` must be a positive finite'):
            main(data=str(base), out=str(tmp_path/'q'), **dict(FAST, lr=lr), **C)

def test_07_report_baseline_warns_on_a_nan_metric():
    from fastai_gpu_tabular.train import report_baseline
    with pytest.warns(UserWarning, match='does not beat'):
        report_baseline(dict(metric='_rmse', value=1., guess='the mean'), {'_rmse': float('nan')})

@pytest.fixture(scope='module')
def run(base, tmp_path_factory):
    out = tmp_path_factory.mktemp('run')/'r'
    main(data=str(base), out=str(out), **C, **FAST)
    return out

def test_08_predict_refuses_to_overwrite_its_input(run, base, tmp_path):
    shutil.copy(base, tmp_path/'p.parquet')
    with pytest.raises(ValueError, match='is the input `data`'): predict(model=str(run), data=str(tmp_path/'p.parquet'),
                                                                         out=str(tmp_path/'p.parquet'), cpu=True)
    assert pd.read_parquet(tmp_path/'p.parquet').equals(pd.read_parquet(base))

def test_09_a_run_is_not_replaced_without_resume_or_overwrite(base, tmp_path):
    interrupted(base, tmp_path/'r')
    before = (tmp_path/'r'/'checkpoint.pth').read_bytes()
    with pytest.raises(FileExistsError, match='pass `--resume`.*`--overwrite`'): main(data=str(base), out=str(tmp_path/'r'), **C, **FAST)
    assert (tmp_path/'r'/'checkpoint.pth').read_bytes() == before
    main(data=str(base), out=str(tmp_path/'r'), overwrite=True, **C, **FAST)
    assert json.loads((tmp_path/'r'/'metrics.json').read_text())['accuracy'] > 0.6

def test_10_predict_warns_when_a_categorical_column_is_unseen(run, base, tmp_path):
    df = pd.read_parquet(base).drop(columns=['y', 'r']).iloc[:500]
    df.assign(u=df.u + 10_000).to_parquet(tmp_path/'shifted.parquet')
    with pytest.warns(UserWarning, match=r"100% of the values of categorical column 'u' were never seen"):
        predict(model=str(run), data=str(tmp_path/'shifted.parquet'), out=str(tmp_path/'o.parquet'), cpu=True)
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        predict(model=str(run), data=str(base), out=str(tmp_path/'o2.parquet'), cpu=True)  # the training ids: no warning

def test_10_multi_hot_values_joined_by_another_separator_are_named(tmp_path):
    from fastai_gpu_tabular.data import synth_movielens
    df = synth_movielens(3_000, gpu=False)
    df.to_parquet(tmp_path/'ml.parquet')
    main(data=str(tmp_path/'ml.parquet'), out=str(tmp_path/'r'), cat_names='userId', mh_names='genres', cont_names='days',
         y_names='target', **FAST)
    df.assign(genres=df.genres.str.replace('|', ',')).drop(columns=['target']).to_parquet(tmp_path/'comma.parquet')
    with pytest.warns(UserWarning, match=r"categorical column 'genres' .*joined by '\|'"):
        predict(model=str(tmp_path/'r'), data=str(tmp_path/'comma.parquet'), out=str(tmp_path/'o.parquet'), cpu=True)

def test_11_13_metrics_that_do_not_fit_the_target_are_refused_before_training(base, tmp_path):
    df = base_frame(3_000).assign(k=lambda d: d.u % 3)
    df.to_parquet(tmp_path/'k.parquet')
    cases = ((dict(y_names='r', y_block='regression', metrics='accuracy'), 'accuracy is for a classifier'),
             (dict(y_names='r', y_block='regression', metrics='auc'), 'auc is for two classes'),
             (dict(y_names='k', metrics='auc'), 'auc is for two classes.*3 classes'),
             (dict(y_names='y', metrics='rmse'), 'rmse is for a regression'))
    for kw, match in cases:
        with pytest.raises(ValueError, match=match):
            main(data=str(tmp_path/'k.parquet'), out=str(tmp_path/'o'), cat_names='u,i', cont_names='x,z', **dict(FAST, **kw))
        assert not (tmp_path/'o'/'checkpoint.pth').exists()

@pytest.mark.parametrize('entry', ['data', 'cli'])  # `cli` (`fgt-prep`) starts the cluster on a thread first
def test_12_fgt_prep_ends_with_an_error_when_dask_workers_cannot_start(base, tmp_path, entry):
    (tmp_path/'bad.py').write_text('raise RuntimeError("this worker cannot start")\n')  # a preload of dask's config: kept beside ours
    env = dict(os.environ, DASK_DISTRIBUTED__WORKER__PRELOAD=json.dumps([str(tmp_path/'bad.py')]))
    t = time.perf_counter()
    r = subprocess.run([sys.executable, '-m', f'fastai_gpu_tabular.{entry}', '--data', str(base), '--cat-names', 'u,i',
                        '--cont-names', 'x,z', '--y-names', 'y', '--dask', '--cpu', '--out', str(tmp_path/'o')], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and 'the dask workers could not start' in r.stderr and time.perf_counter() - t < 60
    assert not (tmp_path/'o').exists()

@pytest.mark.parametrize('kw, match', [(dict(layers='abc'), '`layers` must be'), (dict(layers='0'), '`layers` must be'),
    (dict(layers='64,'), '`layers` must be'), (dict(stop_after=-1), '`stop_after` must be'),
    (dict(checkpoint_every=-1), '`checkpoint_every`'),
    (dict(valid_pct=-0.1), r'`valid_pct` must be a share in \[0, 1\)'), (dict(valid_pct=1.5), r'`valid_pct` must be')])
def test_13_flags_that_cannot_work_are_named(base, tmp_path, kw, match):
    with pytest.raises(ValueError, match=match): main(data=str(base), out=str(tmp_path/'o'), **C, **dict(FAST, **kw))

def test_13_a_truncated_checkpoint_or_weights_file_is_named(base, tmp_path):
    interrupted(base, tmp_path/'r')
    kw = dict(data=str(base), out=str(tmp_path/'r'), resume=True, **C, **dict(FAST, epochs=2))
    w = next((tmp_path/'r').glob('checkpoint-*.safetensors'))
    good = w.read_bytes(); w.write_bytes(good[:len(good)//2])
    with pytest.raises(ValueError, match=f'{w.name}: not a readable safetensors'): main(**kw)
    w.write_bytes(good)
    ck = tmp_path/'r'/'checkpoint.pth'
    ck.write_bytes(ck.read_bytes()[:100])
    with pytest.raises(ValueError, match='checkpoint.pth: not a readable checkpoint'): main(**kw)

def test_13_bad_files_are_named_with_and_without_dask(tmp_path, client):
    df = base_frame(2_000)
    d = tmp_path/'corrupt'; d.mkdir(); df.to_parquet(d/'a.parquet'); (d/'b.parquet').write_bytes(b'')
    e = tmp_path/'empty'; e.mkdir()
    z = tmp_path/'zero'; z.mkdir(); df.iloc[:0].to_parquet(z/'a.parquet'); df.iloc[:0].to_parquet(z/'b.parquet')
    for dask in (False, True):
        for data, match, err in ((d, r'b.parquet: not a readable parquet file', ValueError),
                                 (e, 'no .parquet files there', FileNotFoundError),
                                 (z, r'zero.: no rows in its file\(s\)', ValueError), (tmp_path/'none_*.parquet', 'no .parquet files there',
                                                                             FileNotFoundError)):
            with pytest.raises(err, match=match): prep(data=str(data), out=str(tmp_path/'o'), cpu=True, dask=dask, **C)

def test_13_a_class_only_in_validation_names_the_flags(tmp_path):
    from fastai_gpu_tabular.tabular import RandomRowSplit
    df = base_frame(2_000)
    df.loc[np.asarray(RandomRowSplit(0.2, 42)(df)[1])[:3], 'y'] = 7  # a class of three validation rows (the default split)
    df.to_parquet(tmp_path/'c.parquet')
    with pytest.raises(ValueError, match=r"target 'y' has labels not seen in the training rows.*`--seed`"):
        main(data=str(tmp_path/'c.parquet'), out=str(tmp_path/'o'), **C, **FAST)

def test_13_a_second_run_on_one_out_is_refused_naming_the_first(base, tmp_path):
    out = tmp_path/'r'; out.mkdir()
    p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])
    try:
        (out/'.fgt-train.lock').write_text(json.dumps(dict(host=__import__('socket').gethostname(), pid=p.pid)))
        with pytest.raises(RuntimeError, match=rf'in use by another `fgt-train` \(process {p.pid}'):
            main(data=str(base), out=str(out), **C, **FAST)
    finally: p.kill(); p.wait()
    main(data=str(base), out=str(out), **C, **FAST)  # its process ended: the lock is taken over, and released at the end
    assert not (out/'.fgt-train.lock').exists()

def test_a_categorical_column_named_c_is_not_the_class_count(tmp_path):
    "`to.c` gathered the procs' `c`, `Categorify['c']` (a column c's vocabulary) with it: `fgt-train` crashed building the model"
    rng = np.random.default_rng(0)
    pd.DataFrame({'a': rng.integers(0, 5, 4_000), 'c': rng.integers(0, 7, 4_000), 'x': rng.normal(size=4_000),
                  'y': rng.integers(0, 2, 4_000)}).to_parquet(tmp_path/'c.parquet')
    learn = main(data=str(tmp_path/'c.parquet'), out=str(tmp_path/'r'), cat_names='a,c', cont_names='x', y_names='y', **FAST)
    assert learn.dls.c == 2 and 'roc_auc_score' in json.loads((tmp_path/'r'/'metrics.json').read_text())
    prep(data=str(tmp_path/'c.parquet'), out=str(tmp_path/'p'), cpu=True, cat_names='a,c', cont_names='x', y_names='y')
    from fastai.tabular.data import TabularDataLoaders
    assert TabularDataLoaders.from_processed(tmp_path/'p', bs=256, device='cpu').c == 2
