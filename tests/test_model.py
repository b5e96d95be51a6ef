"FastTabularModel through tabular_learner on the CPU: same weights and function as fastai's model, same AUC after training."
import pytest, torch
from fastai.tabular.all import CategoryBlock, ProgressCallback, RocAucBinary, TabularModel, set_seed
from fastai_gpu_tabular.procs import Categorify, FillMissing, Normalize
from fastai_gpu_tabular.tabular import TabularGPU
from fastai_gpu_tabular.learner import tabular_learner
from fastai_gpu_tabular.model import FastTabularModel, TabularModelMH
from fastai_gpu_tabular.data import synth_movielens, synth_tabular

def tabular(n=60_000, mh=False):
    df = synth_movielens(n, n_users=2_000, n_items=500, gpu=False)
    return synth_tabular(df, mh=mh)

def learner(to, fast, **kw):
    set_seed(0)
    learn = tabular_learner(to.dataloaders(bs=1024, seed=0, device='cpu', **kw), layers=[64, 32], metrics=RocAucBinary(), fast=fast)
    learn.remove_cb(ProgressCallback)
    return learn

def test_learner_builds_fast_model_with_fastai_weights():
    to = tabular()
    ours, theirs = learner(to, True), learner(to, False)
    assert type(ours.model) is FastTabularModel and type(theirs.model) is TabularModel
    assert ours.model.width % 64 == 0 and ours.model.width >= ours.model.n_emb + ours.model.n_cont
    a, b = ours.model.state_dict(), theirs.model.state_dict()
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)  # same seed, same initial weights

def test_trained_auc_equals_fastai_model():
    to = tabular()
    res = []
    for fast in (True, False):
        learn = learner(to, fast)
        learn.fit_one_cycle(2, 5e-3)
        res.append((learn, learn.recorder.values[-1][-1]))
    (ours, auc), (theirs, fai_auc) = res
    assert fai_auc > 0.65 and abs(auc - fai_auc) < 2e-3, (auc, fai_auc)
    # the fastai model takes our trained weights and gives our predictions
    theirs.model.load_state_dict(ours.model.state_dict())
    p, _ = ours.get_preds(); q, _ = theirs.get_preds()
    torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-5)

def test_padded_multi_hot_layout_gives_the_same_predictions():
    to = tabular(mh=True)
    a, b = learner(to, True), learner(to, True, mh_width='max')
    assert type(a.model) is FastTabularModel and len(a.model.bags) == 1
    a.fit_one_cycle(1, 5e-3)
    b.model.load_state_dict(a.model.state_dict())
    assert b.dls.one_batch()[2][0][0].dim() == 2
    p, _ = a.get_preds(); q, _ = b.get_preds()
    torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    fai = learner(to, False)
    assert type(fai.model) is TabularModelMH
    fai.model.load_state_dict(a.model.state_dict())
    torch.testing.assert_close(fai.get_preds()[0], p, rtol=1e-5, atol=1e-6)

def test_warm_triton_computes_tritons_key_once_on_a_thread(monkeypatch):
    """Triton's per-process key (its sources and library hashed, ~0.4 s) is made on a thread before the first batch, once a
    process, where Triton and a GPU are; on a CPU-only machine nothing starts"""
    import sys, types
    import fastai_gpu_tabular.model as M
    calls = []
    mods = {n: types.ModuleType(n) for n in ('triton', 'triton.runtime', 'triton.runtime.cache', 'triton.experimental',
                                              'triton.experimental.gluon')}
    mods['triton.runtime.cache'].triton_key = lambda: calls.append(1) or 'key'
    for n, m in mods.items(): monkeypatch.setitem(sys.modules, n, m)
    monkeypatch.setattr(M, '_warm', None)
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    assert M.warm_triton() is None and calls == []
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True); monkeypatch.setattr(M, 'triton', mods['triton'])
    t = M.warm_triton(); t.join(10)
    assert t.name == 'triton-warm' and calls == [1]
    assert M.warm_triton() is t and calls == [1]  # once a process
