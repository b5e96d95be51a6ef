"""Vocabularies at click-log scale from the command line: `--freq-threshold` and `--max-size` (one number or per column) give
pandas' reference vocabularies in memory and under `TabularDask`, are recorded in procs.json, and `fgt-train` says what the
model needs in memory, warns over half and refuses what cannot fit."""
import json, warnings
import dask, dask.dataframe as dd, numpy as np, pandas as pd, pytest, torch
from fastai.data.block import CategoryBlock
from fastai_gpu_tabular.procs import Categorify, FillMissing, Normalize, RARE
from fastai_gpu_tabular.tabular import TabularGPU, RandomRowSplit, load_procs
from fastai_gpu_tabular.tabular_dask import TabularDask
from fastai_gpu_tabular.data import main as prep, categorify
from fastai_gpu_tabular.train import main, model_memory
import fastai_gpu_tabular.train as train_mod

def frame(n=6_000, seed=0):
    rng = np.random.default_rng(seed)
    return pd.DataFrame({'a': rng.zipf(1.5, n) % 5_000, 'b': rng.zipf(1.3, n).astype(str), 'x': rng.normal(size=n),
                         'y': rng.integers(0, 2, n)})

def reference(s, ft=1, ms=None):
    "Kept ids by pandas: seen at least `ft` times, the `ms` most frequent (ties: the smaller id), sorted"
    vc = s.value_counts()
    keep = vc[vc >= ft]
    keep = sorted(keep.index, key=lambda v: (-keep[v], v))[:ms] if ms else list(keep.index)
    return sorted(keep)

KW = dict(cat_names=['a', 'b'], cont_names=['x'], y_names='y', y_block=CategoryBlock(), splits=RandomRowSplit(0.2, 1))

def test_per_column_limits_equal_pandas_in_memory_and_on_dask():
    df = frame()
    cat = lambda: categorify('a=3', 'b=40', ['a', 'b'])
    to = TabularGPU(df, procs=[cat(), FillMissing, Normalize], **KW)
    tr = df.iloc[np.sort(RandomRowSplit(0.2, 1)(df)[0])]
    p = to.procs.categorify
    assert p.vocab['a'] == reference(tr['a'], ft=3) and p.vocab['b'] == reference(tr['b'], ms=40)
    assert list(to.classes['a'])[-1] == RARE and len(to.classes['b']) == 1 + 40 + 1  # #na#, the kept ids, #rare#
    with dask.config.set(scheduler='sync'):
        dk = TabularDask(dd.from_pandas(df, npartitions=3), procs=[cat(), FillMissing, Normalize], progress=False, **KW)
    assert dk.procs.categorify.vocab == p.vocab and dk.procs.categorify.rare == p.rare
    plain = TabularGPU(df, procs=[Categorify, FillMissing, Normalize], **KW)  # no limits: no #rare# code
    assert RARE not in list(plain.classes['a']) and len(plain.classes['a']) > len(to.classes['a'])

def test_fgt_prep_records_the_limits_and_fgt_train_refuses_them_on_a_processed_folder(tmp_path):
    df = frame(); df.to_parquet(tmp_path/'raw.parquet')
    names = dict(cat_names='a,b', cont_names='x', y_names='y')
    prep(data=str(tmp_path/'raw.parquet'), out=str(tmp_path/'p'), cpu=True, freq_threshold='2', max_size='b=10', **names)
    st = next(p for p in json.loads((tmp_path/'p'/'procs'/'procs.json').read_text())['procs'] if p['type'] == 'Categorify')
    assert (st['freq_threshold'], st['max_size']) == ({'a': 2, 'b': 2}, {'b': 10})
    assert len(next(p for p in load_procs(tmp_path/'p'/'procs')[0] if isinstance(p, Categorify)).vocab['b']) == 10
    with pytest.raises(ValueError, match='is processed, its vocabularies fitted'):
        main(data=str(tmp_path/'p'), epochs=1, cpu=True, out=str(tmp_path/'r'), freq_threshold='2')
    with pytest.raises(ValueError, match="`max_size`: 'zz' is not a categorical column"):
        main(data=str(tmp_path/'raw.parquet'), epochs=1, cpu=True, out=str(tmp_path/'r'), max_size='zz=3', **names)
    learn = main(data=str(tmp_path/'raw.parquet'), epochs=1, bs=512, lr=1e-2, cpu=True, out=str(tmp_path/'r'), max_size='a=7', **names)
    assert len(learn.dls.classes['a']) == 1 + 7 + 1
    m = json.loads((tmp_path/'r'/'metrics.json').read_text())['model']
    assert m['params'] == sum(p.numel() for p in learn.model.parameters()) and 0 < m['emb_params'] < m['params']

def test_model_memory_warns_over_half_and_refuses_what_cannot_fit(monkeypatch):
    model = torch.nn.Sequential(torch.nn.Embedding(1000, 16), torch.nn.Linear(16, 2))
    w = 4 * (1000*16 + 16*2 + 2)
    monkeypatch.setattr(train_mod, 'device_bytes_free', lambda d: 100 * w)
    with warnings.catch_warnings(): warnings.simplefilter('error'); res = model_memory(model, 'cpu')
    assert res['emb_params'] == 16_000 and res['weights_bytes'] == w and res['opt_state_bytes'] == 2*w
    monkeypatch.setattr(train_mod, 'device_bytes_free', lambda d: 5 * w)  # the weights are there: 6w free, 4w needed
    with pytest.warns(UserWarning, match='over half.*`--emb-dim`, `--freq-threshold` or `--max-size`'): model_memory(model, 'cpu')
    monkeypatch.setattr(train_mod, 'device_bytes_free', lambda d: 2 * w)
    with pytest.raises(MemoryError, match='cannot train there; shrink the tables with `--emb-dim`'): model_memory(model, 'cpu')
