"""Inputs that used to give a wrong number without a word, or lose a finished run: each is now refused with an error that
names the column or argument, converted exactly, or warned about. (Two-rank cases are in test_distributed.py.)"""
import json, warnings
from pathlib import Path
import numpy as np, pandas as pd, pytest, torch
from fastai.tabular.all import CategoryBlock, RegressionBlock, ProgressCallback
from fastai_gpu_tabular.procs import Categorify, FillMissing, Normalize
from fastai_gpu_tabular.tabular import TabularGPU, save_procs, load_procs
from fastai_gpu_tabular.loader import BatchDataLoader
from fastai_gpu_tabular.learner import tabular_learner
from fastai_gpu_tabular.backend import shrink
from fastai_gpu_tabular.train import main

PROCS = [Categorify, FillMissing, Normalize]

def frame(n=40, seed=0):
    rng = np.random.default_rng(seed)
    return pd.DataFrame({'u': rng.integers(100, 110, n), 's': rng.choice(list('abcd'), n), 'v': rng.standard_normal(n),
                         'w': rng.standard_normal(n), 'y': rng.integers(0, 2, n)})

def tab(df, **kw): return TabularGPU(df, procs=PROCS, **{**dict(cat_names=['u','s'], cont_names=['v','w'], y_names='y'), **kw})

def test_sharded_loader_without_a_seed_or_process_group_is_refused():
    to = tab(frame())
    with pytest.raises(ValueError, match='`seed`'): BatchDataLoader(to, bs=4, rank=0, world_size=2)
    assert BatchDataLoader(to, bs=4, rank=1, world_size=2, seed=5).seed == 5
    assert BatchDataLoader(to, bs=4).world_size == 1  # one process: unchanged

@pytest.mark.parametrize('n,bs,world', [(41, 4, 1), (43, 4, 2), (45, 10, 3), (20, 9, 2)])
def test_training_never_yields_a_batch_under_two_rows(n, bs, world):
    to = tab(frame(n))
    for r in range(world):
        dl = BatchDataLoader(to, bs=bs, shuffle=True, drop_last=False, seed=0, rank=r, world_size=world)
        sizes = [len(b[0]) for b in dl]
        assert min(sizes) >= 2 and len(sizes) == len(dl)
    valid = [BatchDataLoader(to, bs=bs, seed=0, rank=r, world_size=world) for r in range(world)]  # unshuffled: every row once
    assert sorted(torch.cat([torch.cat(dl.batch_idxs(dl.order())) for dl in valid]).tolist()) == list(range(n))
    assert len({len(dl) for dl in valid}) == 1

def test_batch_size_above_the_training_rows_fails_before_training():
    learn = tabular_learner(tab(frame(30)).dataloaders(bs=64, device='cpu'), layers=[8])
    learn.remove_cb(ProgressCallback)
    before = [p.clone() for p in learn.model.parameters()]
    with pytest.raises(ValueError, match='no batches'): learn.fit(1, 1e-2)
    assert all(torch.equal(a, b) for a, b in zip(before, learn.model.parameters()))

def test_target_listed_as_an_input_is_refused():
    for kw in (dict(cat_names=['u', 'y']), dict(cont_names=['v', 'y'])):
        with pytest.raises(ValueError, match="'y' is the target"): tab(frame(), **kw)

@pytest.mark.parametrize('y_block', [CategoryBlock(), RegressionBlock()])
def test_missing_targets_are_refused_with_their_count(y_block):
    df = frame().astype({'y': float})
    df.loc[[3, 7, 30], 'y'] = np.nan
    with pytest.raises(ValueError, match="target 'y' has 3 missing values"): tab(df, y_block=y_block)

def test_infinite_values_are_missing_with_a_warning():
    df = frame()
    df.loc[[1, 5], 'v'] = [np.inf, -np.inf]
    with pytest.warns(UserWarning, match="'v' has 2 infinite"): to = tab(df)
    assert np.isfinite(to.items['v']).all() and to.items['v_na'].tolist()[:6] == [1, 2, 1, 1, 1, 2]  # flagged as missing
    assert np.isfinite(df['v']).sum() == 38  # the caller's frame is untouched
    # shrink never lets a StopIteration escape: in `map` it would cut the caller's loop short
    frames = [pd.DataFrame({'a': [1., x]}) for x in (np.inf, 2., -np.inf)]
    assert len(list(map(shrink, frames))) == 3

def test_nan_at_inference_where_training_had_none_is_filled_with_a_warning():
    to = tab(frame())
    test = to.new(frame(6, seed=1).assign(w=[np.nan, 1., 2., np.nan, 3., 4.]))
    with pytest.warns(UserWarning, match="'w' has 2 missing values but had none in training"): test.process()
    assert test.items['w'].notna().all()
    again = to.new(frame(6, seed=2).assign(w=np.nan))
    with warnings.catch_warnings():
        warnings.simplefilter('error')  # once per column: the second frame does not warn again
        again.process()

def test_type_drift_at_inference_is_converted_when_exact_else_warned():
    to = tab(frame())
    raw = frame(8, seed=3)
    ref = to.new(raw.copy()); ref.process()
    as_str = to.new(raw.assign(u=raw['u'].astype(str))); as_str.process()  # ints given as strings: converted exactly
    assert as_str.items['u'].tolist() == ref.items['u'].tolist() and (ref.items['u'] > 0).all()
    bad = to.new(raw.assign(s=np.arange(8)))  # strings given as ints that match nothing: a warning naming the dtypes
    with pytest.warns(UserWarning, match="'s' holds int64 values, but was trained on strings"): bad.process()

def test_save_procs_refuses_non_string_column_names(tmp_path):
    df = frame().rename(columns={'u': 0, 'v': 1})
    to = TabularGPU(df, procs=PROCS, cat_names=[0, 's'], cont_names=[1, 'w'], y_names='y')
    with pytest.raises(ValueError, match=r"column names \[0, 1\] are not strings.*astype\(str\)"): save_procs(to, tmp_path)
    assert not list(tmp_path.iterdir())  # refused before anything is written

def damage(d, how):
    "`d` (a procs.json's contents) damaged as users' files have been"
    cat = next(p for p in d['procs'] if p['type'] == 'Categorify')
    if how == 'procs not a list': d['procs'] = {}
    elif how == 'names as a string': d['names']['cat_names'] = 'u,s'
    elif how == 'column with no vocabulary': del cat['vocab']['s']
    elif how == 'mean not a number': next(p for p in d['procs'] if p['type'] == 'Normalize')['means']['v'] = 'x'
    elif how == 'unknown format': d['format'] = 99
    return d

@pytest.mark.parametrize('how,key', [('procs not a list', "'procs'"), ('names as a string', "'names.cat_names'"),
                                     ('column with no vocabulary', "column 's'"), ('mean not a number', ".means'"),
                                     ('unknown format', "'format'")])
def test_damaged_procs_json_is_refused_naming_the_file_and_key(tmp_path, how, key):
    save_procs(tab(frame()), tmp_path)
    fn = tmp_path/'procs.json'
    fn.write_text(json.dumps(damage(json.loads(fn.read_text()), how)))
    with pytest.raises(ValueError, match='procs.json') as e: load_procs(tmp_path)
    assert key in str(e.value)

def test_procs_json_versions(tmp_path):
    to = tab(frame())
    save_procs(to, tmp_path)
    d = json.loads((tmp_path/'procs.json').read_text())
    assert d['format'] == 1
    del d['format']  # as written before the format field: loads as version 0
    cat = next(p for p in d['procs'] if p['type'] == 'Categorify')
    cat['vocab']['u'] = [str(v) for v in cat['vocab']['u']]  # ints saved as strings: converted back exactly, not coded #na#
    (tmp_path/'procs.json').write_text(json.dumps(d))
    again = TabularGPU.from_saved(frame(), tmp_path)
    assert again.items['u'].tolist() == to.items['u'].tolist()

@pytest.mark.parametrize('case', ['mixed ints and strings', 'nullable Int64 with <NA>'])
def test_awkward_columns_that_fastai_accepts_work(case):
    df = frame()
    if case == 'mixed ints and strings':
        df['s'] = pd.Series([1, 'a', 2, 'b'] * 10, dtype=object)
        to = tab(df)
        assert list(to.classes['s']) == ['#na#', 1, 2, 'a', 'b']  # numbers, then strings
    else:
        df['w'] = pd.array([None, 1, 2, 3] * 10, dtype='Int64')
        to = tab(df)
        assert str(to.items['w'].dtype) == 'float32' and to.items['w_na'].tolist()[:4] == [2, 1, 1, 1]

def _run(tmp_path, **kw):
    "`fgt-train` on a small synthetic dataset in this process"
    return main(**{**dict(data='synth', rows=3_000, epochs=1, bs=256, cpu=True, out=str(tmp_path/'run')), **kw})

def _bad_inputs(tmp_path):
    df = frame()
    df.assign(g=[[1, 2]] * len(df)).to_parquet(tmp_path/'lists.parquet')
    to = tab(df.assign(d=pd.to_datetime('2020-01-01') + pd.to_timedelta(df['u'] - 100, unit='D')), cat_names=['u', 'd'])
    (tmp_path/'trunc').mkdir(); (tmp_path/'trunc'/'procs.json').write_text('{"format": 1, "names": {"cat_')
    (tmp_path/'empty').mkdir(); (tmp_path/'empty'/'procs.json').write_text('')
    return {'a list column in cat_names': (lambda: main(data=str(tmp_path/'lists.parquet'), cat_names='g', y_names='y', cpu=True,
                                                         out=str(tmp_path/'o')), "'g' holds lists: pass it in `mh_names`"),
            'a missing integer column name': (lambda: tab(frame(), cat_names=[3]), 'column 3 (in `cat_names`)'),
            'a datetime categorical saved': (lambda: save_procs(to, tmp_path/'dt'), "'d' holds Timestamp values"),
            'bs of 0': (lambda: tab(frame()).dataloaders(bs=0), '`bs` must be a positive'),
            'bs below 0 in fgt-train': (lambda: _run(tmp_path, bs=-5), '`bs` must be a positive'),
            'no epochs': (lambda: _run(tmp_path, epochs=0), '`epochs` must be at least 1'),
            'a truncated procs.json': (lambda: load_procs(tmp_path/'trunc'), 'trunc/procs.json is not valid JSON'),
            'an empty procs.json': (lambda: load_procs(tmp_path/'empty'), 'empty/procs.json is not valid JSON')}

@pytest.mark.parametrize('case', ['a list column in cat_names', 'a missing integer column name', 'a datetime categorical saved',
                                  'bs of 0', 'bs below 0 in fgt-train', 'no epochs', 'a truncated procs.json', 'an empty procs.json'])
def test_obscure_errors_name_the_column_or_argument(tmp_path, case):
    f, msg = _bad_inputs(tmp_path)[case]
    with pytest.raises(ValueError) as e: f()
    assert msg in str(e.value), str(e.value)

def test_fgt_train_without_validation_saves_the_model(tmp_path):
    _run(tmp_path, valid_pct=0.)
    out = tmp_path/'run'
    assert (out/'model'/'model.safetensors').exists() and (out/'model'/'procs'/'procs.json').exists()
    m = json.loads((out/'metrics.json').read_text())
    assert 'accuracy' not in m and 'valid_loss' not in m and m['train_rows_s'] > 0

def test_fgt_train_resume_keeps_a_finished_run_and_refuses_another_bs(tmp_path, capsys):
    _run(tmp_path)
    out = tmp_path/'run'
    before = (out/'metrics.json').read_text()
    assert _run(tmp_path, resume=True) is None and 'finished run' in capsys.readouterr().out
    assert (out/'metrics.json').read_text() == before
    with pytest.raises(ValueError, match='`--bs` was 256, now 128'): _run(tmp_path, resume=True, epochs=2, bs=128)  # run.json

def test_fgt_train_precision_on_a_cpu_warns_and_is_recorded(tmp_path):
    with pytest.warns(UserWarning, match="'bf16' has no effect on the CPU"): _run(tmp_path, precision='bf16')
    assert json.loads((tmp_path/'run'/'metrics.json').read_text())['precision'] == 'fp32'
