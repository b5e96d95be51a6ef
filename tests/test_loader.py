"BatchDataLoader on the CPU (pandas path): epochs, rank shards, memory, multi-hot, fastai integration, training."
import numpy as np, pandas as pd, pytest, torch
from fastai.tabular.all import (CategoryBlock, Learner, TabularPandas, Transform, accuracy, RocAucBinary, ProgressCallback,
                                Categorify as FCategorify, FillMissing as FFillMissing, Normalize as FNormalize, set_seed, ItemTransform)
from fastai.tabular.learner import tabular_learner as fai_tabular_learner
from sklearn.metrics import roc_auc_score
import fastai_gpu_tabular.loader as loader
from fastai_gpu_tabular.procs import Categorify, FillMissing, Normalize
from fastai_gpu_tabular.tabular import TabularGPU
from fastai_gpu_tabular.loader import BatchDataLoader
from fastai_gpu_tabular.learner import tabular_learner
from fastai_gpu_tabular.data import synth_movielens, BENCH_SCHEMA, synth_tabular
from fastai_gpu_tabular.tabular import random_splits

def rows_frame(n, seed=0):
    rng = np.random.default_rng(seed)
    return pd.DataFrame({'rid': np.arange(n), 'cat': rng.integers(0, 5, n), 'x': rng.standard_normal(n), 'y': rng.integers(0, 2, n)})

def rows_to(n, **kw):
    return TabularGPU(rows_frame(n), procs=[Categorify, Normalize], cat_names=['rid', 'cat'], cont_names=['x'], y_names='y',
                      y_block=CategoryBlock(), **kw)

def epoch_rows(dl): return torch.cat([b[0][:, 0] for b in dl]).tolist()

@pytest.mark.parametrize('n,bs,drop_last', [(1000, 64, False), (1000, 64, True), (64, 64, False), (7, 3, False)])
def test_each_row_once_per_epoch(n, bs, drop_last):
    dl = BatchDataLoader(rows_to(n), bs=bs, shuffle=True, drop_last=drop_last, seed=1, device='cpu')
    e0, e1 = epoch_rows(dl), epoch_rows(dl)
    r = n % bs
    kept = n - r if drop_last or r == 1 else n  # the small-share rule: a shuffled loader never yields a 1-row batch
    assert len(e0) == len(set(e0)) == kept and set(e0) <= set(range(1, n+1))
    if kept == n: assert sorted(e0) == list(range(1, n+1))
    assert len(dl) == -(-kept // bs)
    if n > bs: assert e0 != e1  # a new order each epoch
    again = BatchDataLoader(rows_to(n), bs=bs, shuffle=True, drop_last=drop_last, seed=1, device='cpu')
    assert epoch_rows(again) == e0 and epoch_rows(again) == e1  # same (seed, epoch), same order
    assert epoch_rows(BatchDataLoader(rows_to(n), bs=bs, shuffle=True, drop_last=drop_last, seed=2, device='cpu')) != e0 or n <= bs

@pytest.mark.parametrize('n,bs,world,drop_last', [(1000, 64, 3, False), (1000, 64, 3, True), (10, 4, 4, False), (1024, 128, 2, False)])
def test_rank_shards(n, bs, world, drop_last):
    to = rows_to(n)
    shards = [epoch_rows(BatchDataLoader(to, bs=bs, shuffle=True, drop_last=drop_last, seed=3, rank=r, world_size=world, device='cpu'))
              for r in range(world)]
    lens = {len(BatchDataLoader(to, bs=bs, drop_last=drop_last, rank=r, world_size=world, seed=3)) for r in range(world)}
    assert len(lens) == 1  # the same number of batches on every rank
    rows = [i for s in shards for i in s]
    assert len(rows) == len(set(rows))  # disjoint
    if drop_last: assert len(rows) == n // (bs*world) * bs * world
    else: assert sorted(rows) == list(range(1, n+1))  # together they cover the epoch

def test_memory_error_names_host_mode(monkeypatch):
    free = loader.device_bytes_free
    monkeypatch.setattr(loader, 'device_bytes_free', lambda d: 1000 if torch.device(d).type == 'cuda' else free(d))
    to = rows_to(5000)
    with pytest.raises(MemoryError, match='host=True'): loader.TabTensors(to, 'cuda')  # raised before anything is allocated
    t = loader.TabTensors(to, 'cuda', host=True)  # host-resident: the data stays on the CPU
    assert t.cats.device.type == 'cpu' and t.cats.shape == (5000, 2)
    dl = BatchDataLoader(to, bs=64, device='cpu', host=True, shuffle=True, seed=0)
    assert sorted(epoch_rows(dl)) == list(range(1, 5001))

def test_multi_hot_matches_reference():
    rng = np.random.default_rng(0)
    g = [None if rng.random() < .1 else '|'.join(rng.choice(list('abcdefg'), rng.integers(0, 4), replace=False)) for _ in range(500)]
    df = pd.DataFrame({'rid': np.arange(500), 'g': g, 'y': rng.integers(0, 2, 500)})
    to = TabularGPU(df, procs=[Categorify], cat_names=['rid'], mh_names=['g'], y_names='y', y_block=CategoryBlock())
    voc = list(to.classes['g'])
    ref = {r+1: sorted([voc.index(t) if t in voc else 0 for t in s.split('|')] if s else [0]) for r, s in enumerate(g)}
    dl = BatchDataLoader(to, bs=37, shuffle=True, seed=0, device='cpu')
    seen = 0
    for x_cat, x_cont, ((v, o),), y in dl:
        ends = o.tolist()[1:] + [len(v)]
        for i, r in enumerate(x_cat[:, 0].tolist()): assert sorted(v[o[i]:ends[i]].tolist()) == ref[r]
        seen += len(x_cat)
    assert seen == 500

class AddOne(ItemTransform):
    def encodes(self, b): return (b[0], b[1] + 1, *b[2:])

def test_fastai_integration():
    to = rows_to(2000, splits=random_splits(2000))
    dls = to.dataloaders(bs=100, seed=0, device='cpu')
    assert (len(dls.train), len(dls.valid), dls.train.drop_last, dls.train.shuffle) == (16, 4, True, True)
    assert dls.train.bs == 100 and dls.n_inp == 2 and dls.cat_names == ['rid', 'cat'] and dls.cont_names == ['x']
    b = dls.valid.one_batch()
    assert b[0].dtype == torch.int64 and b[1].dtype == torch.float32 and b[2].shape == (100, 1)
    shifted = dls.valid.new(after_batch=[loader.ReadTabBatchGPU(to), AddOne()]).one_batch()
    assert torch.allclose(shifted[1], b[1] + 1)
    test = dls.test_dl(rows_frame(30, seed=5).drop(columns='y'))
    assert len(test.dataset) == 30 and len(test.one_batch()) == 2
    dls.to('cpu')
    assert dls.train.device == torch.device('cpu') and dls.valid.one_batch()[0].device.type == 'cpu'
    dec = dls.valid.decode(b)
    assert list(dec.items.columns)[:2] == ['rid', 'cat'] and len(dec) == 100
    learn = tabular_learner(dls, layers=[8])
    learn.remove_cb(ProgressCallback)
    sug = learn.lr_find(num_it=12, show_plot=False)
    assert sug.valley > 0 and len(learn.recorder.lrs) > 0
    preds, targs = learn.get_preds()
    assert len(preds) == 400 and targs.view(-1).tolist() == to.valid.items['y'].tolist()

def synth_dls(n, shuffle_labels=False, bs=512):
    df = synth_movielens(n, n_users=500, n_items=300, gpu=False)
    if shuffle_labels: df['target'] = df['target'].sample(frac=1, random_state=0).to_numpy()
    splits = random_splits(n)
    return df, splits, synth_tabular(df, splits=splits).dataloaders(bs=bs, seed=0, device='cpu')

def valid_auc(learn):
    p, t = learn.get_preds()
    return roc_auc_score(t.view(-1).numpy(), p[:, 1].numpy())

def test_training_learns_the_signal_like_fastai():
    set_seed(0)
    df, splits, dls = synth_dls(40_000)
    learn = tabular_learner(dls, layers=[64, 32])
    learn.remove_cb(ProgressCallback)
    learn.fit_one_cycle(4, 1e-2)
    ours = valid_auc(learn)
    set_seed(0)
    _, _, bad = synth_dls(40_000, shuffle_labels=True)
    lb = tabular_learner(bad, layers=[64, 32]); lb.remove_cb(ProgressCallback)
    lb.fit_one_cycle(4, 1e-2)
    chance = valid_auc(lb)
    set_seed(0)
    fto = TabularPandas(df, procs=[FCategorify, FFillMissing, FNormalize], splits=[list(s) for s in splits],
                        y_block=CategoryBlock(), **{k: list(v) if isinstance(v, tuple) else v for k, v in BENCH_SCHEMA.items()})
    fl = fai_tabular_learner(fto.dataloaders(bs=512, device='cpu'), layers=[64, 32]); fl.remove_cb(ProgressCallback)
    fl.fit_one_cycle(4, 1e-2)
    theirs = valid_auc(fl)
    print(f"AUC ours {ours:.4f}, fastai {theirs:.4f}, shuffled labels {chance:.4f}")
    assert ours > 0.65 and abs(chance - 0.5) < 0.03
    assert abs(ours - theirs) < 0.02

def test_col_tensor_of_a_read_only_pandas_column_warns_nothing():
    "pandas 3's columns are read-only: `col_tensor` views them (the library only reads them) without torch's non-writable warning"
    import os, subprocess, sys
    from pathlib import Path
    code = ("import warnings, pandas as pd; from fastai_gpu_tabular.loader import col_tensor\n"
            "with warnings.catch_warnings(record=True) as w: t = col_tensor(pd.Series([1, 2]))\n"
            "print(t.tolist(), [str(o.message)[:30] for o in w])")
    r = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=str(Path(__file__).parent.parent)))
    assert r.returncode == 0 and r.stdout.strip() == '[1, 2] []', r.stdout + r.stderr[-2000:]

def test_multi_hot_padding_is_cheap_for_short_rows_not_a_long_tail(tmp_path):
    """`cheap_padding`: rows up to 16 codes, or 4x the mean row, pad (fgt-train's default on a GPU, so that `CudaGraph` replays the
    whole step); a long tail does not. A processed folder's `dataset.json` holds each split's longest row and codes for it"""
    import json
    from fastai_gpu_tabular.loader import cheap_padding
    from fastai_gpu_tabular.train import multi_hot_width
    assert cheap_padding(3, 2.9) and cheap_padding(16, 1.01) and cheap_padding(40, 13.) and not cheap_padding(17, 1.01)
    assert not cheap_padding(0, 0.)  # no codes at all: nothing to pad to
    df = synth_movielens(2_000, n_users=100, n_items=50, gpu=False)
    lens = df['genres'].str.split('|').map(len)
    to = synth_tabular(df, mh=True)
    to.to_parquet(tmp_path/'p')
    info = json.loads((tmp_path/'p'/'dataset.json').read_text())
    st = info['multi_hot']
    assert max(s['genres']['longest'] for s in st.values()) == lens.max() and sum(s['genres']['codes'] for s in st.values()) == lens.sum()
    assert multi_hot_width(info) == lens.max()  # genres: a few a film
    st['train']['genres'] = dict(longest=500, codes=3*info['train']['rows'])  # a long tail
    assert multi_hot_width(info) is None and multi_hot_width({**info, 'multi_hot': {}}) is None  # or a folder written before

@pytest.mark.parametrize('host', [False, True])
def test_a_shape_batch_is_laid_out_as_the_batches_without_pass_through_columns(host):
    "`shape_batch`: inputs and targets laid out as the batches' (pass-through columns left out), row 0's values, nothing drawn"
    import random
    from torch.utils._pytree import tree_flatten
    layout = lambda b: [(tuple(x.shape), x.stride(), x.dtype, x.device) for x in tree_flatten(list(b))[0]]
    df = rows_frame(1000); df['rid_group'] = df['rid']
    to = TabularGPU(df, procs=[Categorify, Normalize], cat_names=['rid', 'cat'], cont_names=['x'], y_names='y', y_block=CategoryBlock())
    dl = BatchDataLoader(to, bs=64, shuffle=True, seed=0, device='cpu', host=host, extra_names=['rid_group'])
    st = random.getstate(), torch.get_rng_state().tolist(), dl.epoch
    s = dl.shape_batch()
    assert (random.getstate(), torch.get_rng_state().tolist(), dl.epoch) == st
    b = next(iter(dl))
    assert len(b) == 4 and isinstance(b[-1], tuple) and layout(s) == layout(b[:3])  # the extras' tuple left out
    assert (s[0] == s[0][:1]).all() and torch.equal(s[0][0], dl.tensors().cats[0].long())
