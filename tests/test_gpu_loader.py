"GPU suite for the loader (`pytest -m gpu`): cuDF → device tensors, epochs on the device, host mode, training, export."
import pickle, subprocess, sys, numpy as np, pandas as pd, pytest, torch
from fastai.tabular.all import CategoryBlock, ProgressCallback, load_learner, set_seed
from sklearn.metrics import roc_auc_score
import fastai_gpu_tabular.loader as loader
from fastai_gpu_tabular.backend import to_backend, to_pandas, is_cudf
from fastai_gpu_tabular.procs import Categorify, FillMissing, Normalize
from fastai_gpu_tabular.tabular import TabularGPU
from fastai_gpu_tabular.loader import BatchDataLoader, TabTensors, col_tensor
from fastai_gpu_tabular.learner import tabular_learner
from fastai_gpu_tabular.data import synth_movielens, BENCH_SCHEMA, synth_tabular
from fastai_gpu_tabular.tabular import random_splits

pytestmark = pytest.mark.gpu

def both(n=50_000):
    df = synth_movielens(n, n_users=2_000, n_items=1_000, gpu=True)
    mk = lambda d: synth_tabular(d, mh=True)
    return mk(to_pandas(df)), mk(df)

def test_dlpack_is_zero_copy():
    s = to_backend(pd.DataFrame({'a': np.arange(10)}), gpu=True)['a']
    t = col_tensor(s)
    assert t.is_cuda and t.data_ptr() == s.values.data.ptr

def test_cudf_tensors_equal_pandas_tensors():
    p, g = both()
    tp, tg = TabTensors(p, 'cuda'), TabTensors(g, 'cuda')
    assert tg.cats.is_cuda and tg.cats.is_contiguous() and tg.cats.dtype == torch.int64
    for k in ('cats', 'conts', 'ys'): assert torch.equal(getattr(tp, k), getattr(tg, k)), k
    for (vp, op), (vg, og) in zip(tp.mh.values(), tg.mh.values()): assert torch.equal(vp, vg) and torch.equal(op, og)

def test_epochs_and_shards_on_device():
    _, g = both(20_001)
    dls = g.dataloaders(bs=1000, seed=0)
    rows = lambda dl: torch.cat([b[0] for b in dl])
    assert dls.train.device.type == 'cuda' and dls.one_batch()[0].is_cuda
    e0, e1 = rows(dls.train), rows(dls.train)
    assert len(e0) == len(dls.train) * 1000 and not torch.equal(e0, e1)
    val = torch.cat([torch.cat([b[0] for b in BatchDataLoader(g.valid, bs=333, rank=r, world_size=3, seed=0,
                                                              device="cuda")]) for r in range(3)])
    assert len(val) == len(g.valid) and torch.equal(val.sort(0).values, TabTensors(g.valid, 'cuda').cats.sort(0).values)

def test_host_mode_gives_the_same_batches():
    _, g = both(20_000)
    dev, host = BatchDataLoader(g, bs=512, device='cuda'), BatchDataLoader(g, bs=512, device='cuda', host=True)
    assert host.tensors().cats.device.type == 'cpu' and host.tensors().cats.is_pinned()
    n = 0
    for bd, bh in zip(dev, host):
        assert bh[0].is_cuda and torch.equal(bd[0], bh[0]) and torch.equal(bd[1], bh[1]) and torch.equal(bd[3], bh[3])
        assert all(torch.equal(x, y) for (vd, od), (vh, oh) in zip(bd[2], bh[2]) for x, y in ((vd, vh), (od, oh)))
        n += len(bd[0])
    assert n == len(g)
    shuffled = torch.cat([b[0] for b in BatchDataLoader(g, bs=512, shuffle=True, seed=1, device='cuda', host=True)])
    assert torch.equal(shuffled.sort(0).values, TabTensors(g, 'cuda').cats.sort(0).values)

def test_memory_error_before_allocating(monkeypatch):
    _, g = both(10_000)
    monkeypatch.setattr(loader, 'device_bytes_free', lambda d: 1000 if torch.device(d).type == 'cuda' else 2**40)
    before = torch.cuda.memory_allocated()
    with pytest.raises(MemoryError, match='host=True'): g.dataloaders(bs=512)
    assert torch.cuda.memory_allocated() == before
    dls = g.dataloaders(bs=512, host=True, seed=0)
    assert dls.one_batch()[0].is_cuda

def test_training_on_gpu_and_export_to_cpu(tmp_path):
    set_seed(0)
    _, g = both(200_000)
    dls = g.dataloaders(bs=4096, seed=0)
    learn = tabular_learner(dls, layers=[64, 32])
    learn.remove_cb(ProgressCallback)
    learn.fit_one_cycle(3, 1e-2)
    p, t = learn.get_preds()
    assert len(p) == len(g.valid)
    assert roc_auc_score(t.view(-1).cpu().numpy(), p[:, 1].cpu().numpy()) > 0.7
    learn.export(tmp_path/'learn.pkl')
    assert b'cudf' not in (tmp_path/'learn.pkl').read_bytes()
    row = to_pandas(synth_movielens(5, n_users=2_000, n_items=1_000, gpu=False)).iloc[0]
    row.to_pickle(tmp_path/'row.pkl')
    code = (f"import torch; from fastai.tabular.all import load_learner; import fastai_gpu_tabular.all, pandas as pd\n"
            f"l = load_learner({str(tmp_path/'learn.pkl')!r}, cpu=True)\n"
            f"print(l.predict(pd.read_pickle({str(tmp_path/'row.pkl')!r}))[2].tolist())")
    env = {**__import__('os').environ, 'CUDA_VISIBLE_DEVICES': ''}
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    probs = eval(out.stdout.strip().splitlines()[-1])
    np.testing.assert_allclose(probs, learn.predict(row)[2].cpu().tolist(), rtol=1e-4, atol=1e-5)

SHARED = r'''
import torch, rmm
from fastai.tabular.all import CategoryBlock
from fastai_gpu_tabular.loader import share_gpu_memory
share_gpu_memory()
import rmm.statistics
rmm.statistics.enable_statistics()
before = rmm.statistics.get_statistics().current_bytes
x = torch.empty(2**28, device='cuda')  # 1 GiB through torch ...
assert rmm.statistics.get_statistics().current_bytes - before >= 2**30  # ... counted by RMM
del x
from fastai_gpu_tabular.procs import Categorify, FillMissing, Normalize
from fastai_gpu_tabular.tabular import TabularGPU
from fastai_gpu_tabular.learner import tabular_learner
from fastai_gpu_tabular.data import synth_movielens, synth_tabular
df = synth_movielens(50_000, n_users=2_000, n_items=1_000, gpu=True)
to = synth_tabular(df)
learn = tabular_learner(to.dataloaders(bs=1024, seed=0), layers=[64, 32])
with learn.no_bar(): learn.fit(1, 1e-3)
assert next(learn.model.parameters()).is_cuda and 0 < learn.recorder.values[-1][1] < 1  # trained, finite validation loss
try: share_gpu_memory(); raise SystemExit('a second call should fail')
except RuntimeError as e: assert 'first' in str(e)
print('ok')
'''

def test_share_gpu_memory_puts_torch_on_rmm():
    "a fresh process (the allocator is chosen once): torch allocates through RMM, training works, a late call fails clearly"
    r = subprocess.run([sys.executable, '-c', SHARED], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and 'ok' in r.stdout, r.stdout[-2000:] + r.stderr[-4000:]
