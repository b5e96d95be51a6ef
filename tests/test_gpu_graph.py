"""GPU suite for `CudaGraph` (`pytest -m gpu`): graphed fits equal fastai's eager ones (the row-sparse model with `SparseEmbedOpt`
and the dense one with `ForeachLamb` as whole steps in one graph; an optimizer that sets gradients to `None` and gradient
accumulation through the forward's and backward's graphs), the graphs are replayed, and a graphed fit never waits for the device,
its capture included."""
from functools import partial
import pytest, torch
from fastai.tabular.all import set_seed, CategoryBlock, OptimWrapper, GradientAccumulation
from fastai_gpu_tabular.graph import CudaGraph
from fastai_gpu_tabular.optimizer import SparseEmbedOpt, ForeachLamb
from fastai_gpu_tabular.learner import tabular_learner
from fastai_gpu_tabular.recorder import CheckNoSync
from fastai_gpu_tabular.data import synth_criteo, CRITEO_SCHEMA
from fastai_gpu_tabular.procs import Categorify, FillMissing, Normalize
from fastai_gpu_tabular.tabular import TabularGPU, RandomRowSplit

pytestmark = pytest.mark.gpu
OPTS = dict(sparse=partial(SparseEmbedOpt, opt_func=ForeachLamb, rule='rowwise-adagrad'), lamb=ForeachLamb,
            adamw=partial(OptimWrapper, opt=torch.optim.AdamW))  # AdamW: torch's `zero_grad` sets the gradients to None

@pytest.fixture(scope='module')
def to():
    return TabularGPU(synth_criteo(50_000, cap=5_000, gpu=True, seed=1), procs=[Categorify, FillMissing, Normalize],
                      splits=RandomRowSplit(0.2, 0), y_block=CategoryBlock(), **CRITEO_SCHEMA)

def fit(to, opt, cbs=(), bf16=True, epochs=2, bs=2048):
    "A learner fitted with `fit_one_cycle` from seed 0: the row-sparse model for `opt='sparse'`, else the dense one"
    set_seed(0)
    learn = tabular_learner(to.dataloaders(bs=bs, seed=0), layers=[64, 32], emb_szs={n: 8 for n in to.cat_names},
                            config=dict(sparse=opt == 'sparse'), opt_func=OPTS[opt], cbs=list(cbs))
    if bf16: learn.to_bf16()
    with learn.no_bar(): learn.fit_one_cycle(epochs, 1e-2)
    return learn

def assert_same_fit(a, b):
    for (n, p), (_, q) in zip(a.model.named_parameters(), b.model.named_parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5, msg=n)
    for k, v in a.model.state_dict().items(): torch.testing.assert_close(v, b.model.state_dict()[k], rtol=1e-4, atol=1e-5, msg=k)
    torch.testing.assert_close(torch.tensor(a.recorder.values), torch.tensor(b.recorder.values), rtol=1e-4, atol=1e-5)

@pytest.mark.parametrize('opt,bf16', [('sparse', True), ('lamb', True), ('adamw', False)])
def test_graphed_fit_equals_fastais(to, opt, bf16):
    "Whole steps (forward to `zero_grad`, the one-cycle schedule sent each replay) over 78 steps: fastai's eager fit, to bf16's noise"
    cb = CudaGraph()
    g, e = fit(to, opt, [cb], bf16, bs=1024), fit(to, opt, (), bf16, bs=1024)
    n = len(g.dls.train)  # 2 epochs: `warmup` batches run, one capture, the rest (both epochs, validation between) replayed
    assert cb.captures == 1 and 2*(n-1) - cb.warmup <= cb.replays <= 2*n - cb.warmup, (cb.captures, cb.replays, n)  # a last batch: run
    assert cb.why is None if opt != 'adamw' else 'its optimizer (OptimWrapper)' in cb.why  # the whole step, or the passes
    assert_same_fit(g, e)
    assert cb.graphs == {} and 'forward' not in g.model.__dict__  # the graphs' memory back, the model's own forward
    if opt == 'sparse': assert g.model.embeds[0].weight.grad is None  # the tables' gradients stayed row-sparse

@pytest.mark.parametrize('opt', ['sparse', 'adamw'])
def test_gradient_accumulation_adds_over_replays(to, opt):
    "fastai's `GradientAccumulation` skips `zero_grad`: the replays add into the gradients (dense ones in place, sparse ones summed)"
    cb = CudaGraph()
    g, e = fit(to, opt, [cb, GradientAccumulation(4096)]), fit(to, opt, [GradientAccumulation(4096)])
    assert cb.replays > 0 and ('GradientAccumulation' in cb.why or 'OptimWrapper' in cb.why)  # a step it skips: the passes graphed
    assert_same_fit(g, e)

def test_graphed_fit_never_synchronises():
    "A graphed bf16 fit never waits for the device, its capture included (no `torch.cuda.synchronize` in it)"
    set_seed(0)
    to = TabularGPU(synth_criteo(60_000, cap=20_000, gpu=True), procs=[Categorify, FillMissing, Normalize],
                    splits=RandomRowSplit(0.2, 0), y_block=CategoryBlock(), **CRITEO_SCHEMA)
    cb = CudaGraph()
    learn = tabular_learner(to.dataloaders(bs=4096), layers=[64], emb_szs={n: 16 for n in to.cat_names}, config=dict(sparse=True),
                            opt_func=partial(SparseEmbedOpt, opt_func=ForeachLamb, rule='rowwise-adagrad'), cbs=cb).to_bf16()
    v0 = learn.validate()[0]
    try: learn.fit_one_cycle(2, 1e-2, cbs=CheckNoSync())
    finally: torch.cuda.set_sync_debug_mode('default')
    assert cb.replays > 0 and cb.why is None and learn.recorder.values[-1][1] < v0 - 0.01  # whole steps

def test_a_new_shape_or_moved_parameters_are_captured_again_or_run(to):
    "The epoch's last, smaller batch gets its own graphs (up to `max_graphs`); a model whose parameters moved is not replayed stale"
    cb = CudaGraph(warmup=1, max_graphs=1)
    learn = tabular_learner(to.dataloaders(bs=3000, seed=0), layers=[32], emb_szs={n: 4 for n in to.cat_names}, cbs=cb)
    m = learn.model
    x = next(iter(learn.dls.train))
    learn.model.train()
    cb.learn = learn; cb.before_fit()
    ys = [m(*x[:2]).detach().clone() for _ in range(3)]  # run, capture (then replay), replay
    assert cb.captures == 1 and cb.replays == 2 and torch.equal(ys[1], ys[2])
    torch.testing.assert_close(ys[0], ys[1], rtol=1e-5, atol=1e-6)
    m(*[t[:100] for t in x[:2]])  # another shape, past `max_graphs`: run as it is
    assert cb.captures == 1 and cb.replays == 2
    m.layers[0][0].weight.data = m.layers[0][0].weight.data.clone()  # a parameter in a new tensor: a new key, run (max_graphs)
    cb.params = list(m.parameters())
    y = m(*x[:2]).detach()
    assert cb.replays == 2
    torch.testing.assert_close(y, ys[2], rtol=1e-5, atol=1e-6)
    cb.after_fit()
    assert 'forward' not in m.__dict__

def test_fgt_train_cuda_graph(tmp_path):
    "`fgt-train --cuda-graph` on Criteo-shaped rows: the graphs replayed, the fit equal to the same run without them"
    import json
    from fastai_gpu_tabular.train import main
    common = dict(data='synth-criteo', rows=200_000, epochs=1, bs=8192, layers='64', lr=1e-2, precision='bf16', emb_opt='rowwise-adagrad',
                  emb_rule='fixed', emb_dim='16', opt='lamb')
    g, e = main(out=str(tmp_path/'g'), cuda_graph=True, **common), main(out=str(tmp_path/'e'), **common)
    m = json.loads((tmp_path/'g'/'metrics.json').read_text())
    assert m['cuda_graph_replays'] >= len(g.dls.train) - 3 and m['cuda_graph_capture_s'] > 0 and m['roc_auc_score'] > 0.6, m
    assert m['cuda_graph_whole_step'] is True, m
    for (k, v), w in zip(g.model.state_dict().items(), e.model.state_dict().values()):
        torch.testing.assert_close(v, w, rtol=1e-4, atol=1e-5, msg=k)

@pytest.mark.parametrize('opt', ['adam', 'sparse'])
def test_a_fit_cut_short_then_a_graphed_fit(to, opt):
    """An exception cuts a graphed fit short (fastai runs no `after_fit`): the next graphed fit captures, replays and ends as usual,
    the graphed forward (fastai's Adam: the passes graphed) or the whole step (`SparseEmbedOpt`) taken back from where it was left"""
    from fastai.tabular.all import Callback, Adam
    class Boom(Callback):
        def after_batch(self):
            if self.training and self.iter == 6: raise RuntimeError('boom')
    cb, left = CudaGraph(), ('forward', 'model') if opt == 'adam' else ('_do_one_batch', 'learner')
    set_seed(0)
    learn = tabular_learner(to.dataloaders(bs=2048, seed=0), layers=[32], emb_szs={n: 8 for n in to.cat_names}, cbs=cb,
                            config=dict(sparse=opt == 'sparse'), opt_func=Adam if opt == 'adam' else OPTS['sparse'])
    where = lambda: (learn.model if left[1] == 'model' else learn).__dict__
    with learn.no_bar(), pytest.raises(RuntimeError, match='boom'): learn.fit(1, 1e-2, cbs=Boom())
    assert cb.replays > 0 and left[0] in where()  # left on the model or the learner
    with learn.no_bar(): learn.fit(1, 1e-2)
    assert cb.captures == 1 and cb.replays > 0 and left[0] not in where() and (cb.why is None) == (opt == 'sparse')

@pytest.mark.parametrize('opt', ['sparse', 'lamb'])
def test_warm_step_compiles_the_step_at_once_and_changes_nothing(to, opt):
    """`CudaGraph(warm=True)` (the default) compiles the step's Triton kernels on threads before the first batch runs: the first
    batches then compile nothing on the training thread (with `warm=False` they do), and the fit is the one without it (buffers,
    gradients, random generators and step counts put back: a step counted twice moves Lamb's first update ~2x, BatchNorm's
    running statistics ~10%)"""
    import threading, triton.compiler as TC, triton.runtime.jit as J
    import fastai_gpu_tabular.model as M, fastai_gpu_tabular.optimizer as O
    from fastai.tabular.all import Callback
    orig, log = TC.compile, []
    def counted(src, *a, **k):  # the thread and the kernel: a failure names what was missed
        log.append(f"{threading.current_thread().name}:{getattr(getattr(src, 'fn', None), '__name__', src)}"); return orig(src, *a, **k)
    class Mark(Callback):  # the training thread's compiles in the first three batches (warm-up, capture, replay)
        order = 20
        def before_batch(self):
            if self.training and self.iter == 0: log.append('start')
        def after_batch(self):
            if self.training and self.iter == 2: log.append('end')
    def run(warm):
        for mod in (M, O):
            for k in vars(mod).values():
                if isinstance(k, J.JITFunction): k.device_caches.clear()  # compiled again (from the disk's cache: still a compile)
        log.clear(); cb = CudaGraph(warm=warm)
        learn = fit(to, opt, [cb, Mark()], epochs=1, bs=1024)
        i, j = log.index('start'), log.index('end')
        return learn, [n for n in log[i+1:j] if not n.startswith('fgt-compile_')], [n for n in log if n.startswith('fgt-compile_')]
    TC.compile = counted
    try: (w, main_w, pool_w), (c, main_c, pool_c) = run(True), run(False)
    finally: TC.compile = orig
    assert len(pool_w) >= 6 and main_w == [], (pool_w, main_w)  # the step's kernels on the pool, none on the training thread
    assert pool_c == [] and len(main_c) >= 6, (pool_c, main_c)  # without: each at its first launch
    for (k, v), u in zip(w.model.state_dict().items(), c.model.state_dict().values()):
        torch.testing.assert_close(v, u, rtol=1e-5, atol=1e-6, msg=k)
    torch.testing.assert_close(torch.tensor(w.recorder.values), torch.tensor(c.recorder.values), rtol=1e-5, atol=1e-6)
    for o, p in ((w.opt, c.opt), (getattr(w.opt, 'dense', None), getattr(c.opt, 'dense', None))):
        if o is not None: assert [s.get('step') for s in o.state.values()] == [s.get('step') for s in p.state.values()]

def test_padded_multi_hot_fit_is_graphed_and_equals_fastais():
    """A multi-hot column in the padded layout (`mh_width`: its codes and lengths a batch, sizes fixed) goes through the whole
    step's graph as the other inputs: replayed, and the fit equal to fastai's eager one ((values, offsets) change shape each batch:
    those run as fastai's)"""
    from fastai_gpu_tabular.data import synth_movielens, synth_tabular
    to = synth_tabular(synth_movielens(60_000, n_users=2_000, n_items=500, gpu=True), mh=True)
    def fit(cbs):
        set_seed(0)
        learn = tabular_learner(to.dataloaders(bs=2048, seed=0, mh_width='max'), layers=[64, 32], opt_func=OPTS['lamb'], cbs=cbs)
        learn.to_bf16()
        with learn.no_bar(): learn.fit_one_cycle(2, 1e-2)
        return learn
    cb = CudaGraph()
    g, e = fit([cb]), fit([])
    assert len(g.model.bags) == 1 and g.dls.one_batch()[2][0][0].dim() == 2
    assert cb.why is None and cb.captures == 1 and cb.replays >= 2*len(g.dls.train) - 4, (cb.why, cb.captures, cb.replays)
    assert_same_fit(g, e)

def test_graphed_tables_sum_their_gradients_where_the_block_holds_them(to, monkeypatch):
    """Under the whole step (its graph and its eager batches) `SparseEmbedOpt` sums the tables' bf16 gradients where the block
    holds them (`_BlockCols`: no float32 copy, `_cols`), the fit as fastai's eager one; a fit without `CudaGraph` copies them"""
    import fastai_gpu_tabular.optimizer as O
    kinds, f = [], O._sums_fused
    def spy(seg, perm, e, vals, most): kinds.append({type(v).__name__ for v in vals}); return f(seg, perm, e, vals, most)
    monkeypatch.setattr(O, '_sums_fused', spy)
    cb = CudaGraph()
    g = fit(to, 'sparse', [cb], bs=1024)
    assert cb.why is None and cb.replays > 0 and kinds and all(k == {'_BlockCols'} for k in kinds), kinds  # the capture's, once
    kinds.clear(); e = fit(to, 'sparse', (), bs=1024)
    assert kinds and all(k == {'Tensor'} for k in kinds)
    assert_same_fit(g, e)

def test_a_streamed_fit_compiles_its_step_while_its_first_windows_are_read(to, tmp_path, monkeypatch):
    """On a processed folder `CudaGraph` warms the step on the training loader's `shape_batch` at the fit's first epoch, its first
    windows read meanwhile (`read_ahead`): `warm_step` once, before the first batch (whose layout it matched: no second warm), every
    training window read once (those read ahead taken by the pass), and the fit graphed"""
    import fastai_gpu_tabular.graph as G
    from fastai.tabular.all import Callback
    from fastai.tabular.data import TabularDataLoaders
    from fastai_gpu_tabular.stream import ProcessedSplit
    path = to.to_parquet(tmp_path/'p', row_group_rows=4_000)
    log, warm, read = [], G.warm_step, ProcessedSplit.read
    monkeypatch.setattr(G, 'warm_step', lambda learn, ins, n_inp=None: log.append('warm') or warm(learn, ins, n_inp))
    monkeypatch.setattr(ProcessedSplit, 'read', lambda self, gs, *a, **k: log.append((self.split, tuple(gs))) or read(self, gs, *a, **k))
    class Mark(Callback):
        order = 20
        def before_batch(self):
            if self.training and self.iter == 0: log.append('batch 0')
    set_seed(0)
    dls = TabularDataLoaders.from_processed(path, bs=1024, seed=0, device='cuda', mem_bytes=8*2**20)
    cb = CudaGraph()
    learn = tabular_learner(dls, layers=[64, 32], emb_szs={n: 8 for n in to.cat_names}, config=dict(sparse=True), opt_func=OPTS['sparse'],
                            cbs=[cb, Mark()])
    learn.to_bf16()
    with learn.no_bar(): learn.fit_one_cycle(1, 1e-2)
    assert log.count('warm') == 1 and log.index('warm') < log.index('batch 0'), log[:8]
    train = [e for e in log if isinstance(e, tuple) and e[0] == 'train']
    assert len(dls.train.windows(0)) > 2 and len(train) == len(dls.train.windows(0)), train  # no window read twice
    assert cb.why is None and cb.captures == 1 and cb.replays >= len(dls.train) - 3
