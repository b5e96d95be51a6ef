"""The whole training step in one CUDA graph (`CudaGraph`), what a CPU can check: a replay runs no Python, so the optimizers'
kernels read their hyper-parameters from a device buffer that `StepValues.write` fills before each replay, and the step counts
advance there. Emulated here: the launches of a capture are kept and run again after each `write`, as a replay would; the
weights, the values sent and the counts must be the eager step's. The GPU suite replays real graphs (tests/test_gpu_graph.py)."""
import os, subprocess, sys
from functools import partial
from pathlib import Path
import pytest, torch
from fastai.tabular.all import CategoryBlock, Callback
import fastai_gpu_tabular.optimizer as O
from fastai_gpu_tabular.graph import step_unfit
from fastai_gpu_tabular.learner import tabular_learner
from fastai_gpu_tabular.data import synth_criteo, CRITEO_SCHEMA
from fastai_gpu_tabular.procs import Categorify, FillMissing, Normalize
from fastai_gpu_tabular.tabular import TabularGPU, RandomRowSplit

SCHED = lambda i: dict(lr=1e-2*(i + 1)/4, mom=0.95 - 0.02*i)  # a schedule that moves every step, as `fit_one_cycle`'s

LAMB = r'''
import torch
from torch import nn
import fastai_gpu_tabular.optimizer as O
from test_step_graph import SCHED
O.ForeachLamb._can_fuse = lambda self, ps, sts: True  # CPU tensors: the interpreter runs the kernels
O._Table.BLOCK = 64
def run(graph, n=8, capture=2):
    torch.manual_seed(0)
    m, w = nn.Sequential(nn.Linear(60, 40), nn.ReLU(), nn.Linear(40, 1)), torch.randn(60, 1)
    opt, kept, v = O.ForeachLamb(m.parameters(), lr=1e-2, wd=0.1), [], None
    for i in range(n):
        opt.set_hypers(**SCHED(i))
        x = torch.randn(64, 60)
        (m(x) - x @ w).pow(2).mean().backward()
        if not graph or i < capture: opt.step()
        elif i == capture:  # the capture: the step's Python runs once, its launches kept (a graph records them), then replayed
            v, step = O.StepValues(torch.device('cpu')), O._Table.step
            O._Table.step = lambda t, hp, d: kept.append((t, hp, d))
            with O.captured_values(v): opt.step()
            O._Table.step = step
            v.write(count=False); [t.step(hp, d) for t, hp, d in kept]
        else: v.write(); [t.step(hp, d) for t, hp, d in kept]  # a replay: the values sent, no Python of the optimizer's
        opt.zero_grad()
    return [p.detach().clone() for p in m.parameters()], [opt.state[p]['step'] for p in m.parameters()]
(we, se), (wg, sg) = run(False), run(True)
assert se == sg == [8]*4, (se, sg)
for a, b in zip(we, wg): assert torch.equal(a, b), (a - b).abs().max()
print('ok')
'''

def test_lamb_replayed_from_kept_launches_equals_its_eager_steps():
    "`ForeachLamb`'s kernels (Triton's interpreter), their launches kept at a capture and rerun after each `write`: eager's weights"
    pytest.importorskip('triton')
    path = os.pathsep.join([str(Path(__file__).parent), os.environ.get('PYTHONPATH', '')])
    env = {**os.environ, 'TRITON_INTERPRET': '1', 'PYTHONPATH': path}
    r = subprocess.run([sys.executable, '-c', LAMB], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and 'ok' in r.stdout, r.stdout[-2000:] + r.stderr[-4000:]

@pytest.fixture(scope='module')
def to():
    return TabularGPU(synth_criteo(3000, cap=200, seed=0), procs=[Categorify, FillMissing, Normalize], splits=RandomRowSplit(0.2, 0),
                      y_block=CategoryBlock(), **CRITEO_SCHEMA)

def sparse_learner(to, rule='lazy-adam'):
    torch.manual_seed(0)
    return tabular_learner(to.dataloaders(bs=256, device='cpu', seed=0), layers=[16], emb_szs={n: 4 for n in to.cat_names},
                           config=dict(sparse=True), opt_func=partial(O.SparseEmbedOpt, opt_func=O.ForeachLamb, rule=rule, lr_mult=2.))

@pytest.mark.parametrize('rule', ['lazy-adam', 'rowwise-adagrad'])
def test_the_values_a_replay_sends_are_the_eager_steps(to, monkeypatch, rule):
    "The tables' and the MLP's hyper-parameters and step counts that `write` sends before each replay: each eager step's, in order"
    sent = []
    monkeypatch.setattr(O.ForeachLamb, '_can_fuse', lambda self, ps, sts: True)
    monkeypatch.setattr(O._Table, 'step', lambda self, hp, d: sent.append(('lamb', hp)))
    monkeypatch.setattr(O, '_fusable', lambda rows, parts: True)
    monkeypatch.setattr(O, '_rows_fused', lambda rule, rows, un, parts, hp: sent.append(('rows', hp)))
    def run(graph, n=6, capture=2):
        learn = sparse_learner(to, rule); learn.create_opt()
        m, opt, out, v = learn.model, learn.opt, [], None
        for i, (*x, y) in zip(range(n), learn.dls.train):
            opt.set_hypers(**SCHED(i))
            learn.loss_func(m(*x), y).backward()
            if not graph or i < capture:
                sent.clear(); opt.step(); out.append([(k, h.clone()) for k, h in sent])
            elif i == capture:
                v = O.StepValues(torch.device('cpu')); sent.clear()
                with O.captured_values(v): opt.step()
                slots = list(sent); v.write(count=False); out.append([(k, h.clone()) for k, h in slots])
            else:  # a replay: the model's backward gave its gradients; no Python of the optimizer's, only `write`
                v.write(); out.append([(k, h.clone()) for k, h in slots])
            opt.zero_grad()
        return out, sorted(s['step'] for s in opt.state.values() if 'step' in s)
    (e, se), (g, sg) = run(False), run(True)
    assert se == sg and se[-1] == 6 and [k for k, _ in e[-1]] == ['lamb', 'rows']
    for a, b in zip(e, g):
        assert [k for k, _ in a] == [k for k, _ in b]
        for (_, x), (_, y) in zip(a, b): assert torch.equal(x, y), (x, y)
    assert not torch.equal(e[3][1][1], e[4][1][1])  # the schedule and the debiasing moved between steps

def test_a_step_a_graph_cannot_hold_is_named(to):
    "Where the optimizer reads host floats or a callback acts inside the step, `step_unfit` says which"
    from fastai.tabular.all import Adam, GradientAccumulation
    learn = sparse_learner(to); learn.create_opt()
    assert step_unfit(learn) is None
    learn.add_cb(GradientAccumulation(2048))
    assert 'GradientAccumulation (after_loss, before_step)' in step_unfit(learn)
    class Looks(Callback):
        graph_safe = True  # a profiler's marks: its handlers only look
        def after_loss(self): pass
    learn.remove_cb(GradientAccumulation); learn.add_cb(Looks())
    assert step_unfit(learn) is None
    learn = tabular_learner(to.dataloaders(bs=512, device='cpu'), layers=[16], opt_func=Adam); learn.create_opt()
    assert 'its optimizer (Optimizer)' in step_unfit(learn)

def test_several_processes_hold_their_collectives_in_the_graph_where_none_reads_the_host(to, monkeypatch):
    """On several processes the whole step is one graph only with `ranks` (its collectives captured); the tables' exchange 'rows'
    (the ranks' row counts read on the host) and `SparseEmbeddingGrads` exchanging DDP's tables (its counts too) say why not;
    its `plain` mean of the dense gradients (one all-reduce of fixed size) runs inside the graph"""
    import fastai_gpu_tabular.graph as G
    from fastai_gpu_tabular.distributed import SparseEmbeddingGrads
    monkeypatch.setattr(G, 'num_distrib', lambda: 2); monkeypatch.setattr(O, 'distributed', lambda: True)
    learn = sparse_learner(to); learn.create_opt()
    assert 'CudaGraph(ranks=True)' in step_unfit(learn) and step_unfit(learn, ranks=True) is None  # 'auto': decided at the first step
    learn.opt._ex = 'rows'
    assert "exchange 'rows'" in step_unfit(learn, ranks=True) and "exchange 'rows'" in learn.opt.graph_unfit()
    learn.opt._ex = 'whole'; assert step_unfit(learn, ranks=True) is None
    sg = SparseEmbeddingGrads(); learn.add_cb(sg)
    sg.plain = True; assert sg.graph_events == ('before_step',) and step_unfit(learn, ranks=True) is None
    sg.plain, sg.names = False, ['embeds.0.weight']  # DDP's tables exchanged by touched rows: a host sync in `before_step`
    assert sg.graph_events == () and 'SparseEmbeddingGrads (before_step)' in step_unfit(learn, ranks=True)

def test_callbacks_held_in_the_graph_run_once_a_step_between_the_backward_and_the_step(to):
    """A callback's `graph_events` run where the capture records them (`_graph_events`: after the backward, before the optimizer's
    step, in fastai's order); after a replay fastai's step events skip it (`_held`) and call the others: the weights of fastai's
    eager steps, each handler once a step"""
    import fastai_gpu_tabular.graph as G
    from fastai.tabular.all import Learner, noop, CancelBackwardException, CancelStepException
    calls = []
    class Halve(Callback):  # device work of fixed sizes: what a graph can hold (`SparseEmbeddingGrads`' mean over the ranks)
        graph_events = ('after_backward', 'before_step')
        def after_backward(self): calls.append('after_backward')
        def before_step(self):
            calls.append('before_step')
            for p in self.learn.model.parameters():
                if p.grad is not None and not p.grad.is_sparse: p.grad.mul_(0.5)
    class Other(Callback):
        def before_step(self): calls.append('other')
    def run(graph, n=4):
        learn = sparse_learner(to); learn.add_cbs([Halve(), Other()]); learn.create_opt(); learn.training = True
        for i, (*x, y) in zip(range(n), learn.dls.train):
            learn.xb, learn.yb = x, [y]
            if not graph: Learner._do_one_batch(learn)
            else:  # as `_Step`'s capture and `_one_batch`'s replay call the events
                held = [cb for cb in learn.cbs if getattr(cb, 'graph_events', ())]
                learn.loss_func(learn.model(*x), y).backward(); G._graph_events(held); learn.opt.step(); learn.opt.zero_grad()
                with G._held(held):
                    learn._with_events(noop, 'backward', CancelBackwardException); learn._with_events(noop, 'step', CancelStepException)
                assert all(cb.run for cb in held)
            learn.opt.zero_grad()
        return [p.detach().clone() for p in learn.model.parameters()]
    e = run(False); ce = list(calls); calls.clear(); g = run(True)
    assert ce == ['after_backward', 'before_step', 'other']*4 and sorted(calls) == sorted(ce), (ce, calls)
    for a, b in zip(e, g): torch.testing.assert_close(b, a)

def test_under_a_capture_host_values_go_through_slots():
    "Under `captured_values` a constant list and a function of the step are slots of the buffer, sent by `write`; outside, tensors"
    v, state = O.StepValues(torch.device('cpu'), nbytes=64), {'step': 3}
    with O.captured_values(v):
        a = O._sent([7, -1], torch.int64, torch.device('cpu'))
        b = O.device_values(lambda: [0.5, state['step']], torch.float32, torch.device('cpu'))
        O.counted([state])
        assert O.capturing()
    assert not O.capturing() and state['step'] == 4
    v.write(count=False); assert a.tolist() == [7, -1] and b.tolist() == [0.5, 4.]
    v.write(); assert b.tolist() == [0.5, 5.] and state['step'] == 5  # a replay: the count one on, then sent
    with pytest.raises(O.GraphUnfit, match='more than 64 bytes'), O.captured_values(v):
        O._sent(list(range(20)), torch.int64, torch.device('cpu'))
    assert O._sent([1.5], torch.float32, torch.device('cpu')).tolist() == [1.5]

def test_warming_compiles_launches_from_any_thread_and_runs_none(monkeypatch):
    """Under `_warming` (`warm_step`'s dry step), a launch from this thread or another (autograd runs a GPU's backward on a thread
    of its own) sends its kernel's compile (`warmup`, then the launcher's `_init_handles`) to the pool and runs nothing; leaving
    waits for every compile; after it, launches run. A Triton kernel's interface stands in for one (no GPU here)"""
    import threading, time
    from types import SimpleNamespace
    import fastai_gpu_tabular.model as M
    from concurrent.futures import ThreadPoolExecutor
    monkeypatch.setattr(torch.cuda, 'current_device', lambda: 0); monkeypatch.setattr(torch.cuda, 'set_device', lambda d: None)
    monkeypatch.setattr(M, '_pool', ThreadPoolExecutor(4))  # the library's: 8 threads, or the CPUs if fewer
    class Kernel:  # Triton's cache too: a specialization compiled once (here: its arguments but the grid)
        def __init__(self): self.ran, self.compiled, self.device_caches, self.cache, self.spans = [], [], {}, set(), []
        def __getitem__(self, grid): return lambda *a, **k: self.ran.append((grid, a, k))
        def warmup(self, *a, grid, **k):
            if (a, tuple(k.items())) not in self.cache:
                t0 = time.perf_counter(); time.sleep(0.05)  # a compile takes time: leaving must wait for it
                self.cache.add((a, tuple(k.items()))); self.compiled.append((grid, a, k)); self.spans.append((a, t0, time.perf_counter()))
            return SimpleNamespace(_init_handles=lambda: self.compiled.append('handles'))
    k, k2 = Kernel(), Kernel()
    with M._warming() as fs:
        M._launch(k, (1,), 'x', C=2)
        t = threading.Thread(target=M._launch, args=(k, (2,), 'y')); t.start(); t.join()
        M._launch(k, (4,), 'x', C=2); M._launch(k2, (1,), 'x', C=2)  # a layer's second launch of a specialization; another kernel
    assert k.ran == [] and len(fs) == 4 and all(f.done() for f in fs)
    assert sorted(c for c in k.compiled if c != 'handles') == [((1,), ('x',), {'C': 2}), ((2,), ('y',), {})]  # 'x' once
    assert k.compiled.count('handles') == 3 and M._warm_fs is None
    (_, a0, a1), spans = next(o for o in k.spans if o[0] == ('x',)), [o for o in k.spans if o[0] == ('y',)] + k2.spans
    assert all(a0 < b1 and b0 < a1 for _, b0, b1 in spans)  # another specialization's compile, another kernel's: at once
    M._launch(k, (3,), 'z')
    assert k.ran == [((3,), ('z',), {})]

def test_warm_step_leaves_a_cpu_learner_alone(to):
    "`warm_step` compiles a GPU's kernels: a learner on the CPU is left as it is (False)"
    from fastai_gpu_tabular.graph import warm_step
    learn = tabular_learner(to.dataloaders(bs=256), layers=[8], config=dict(sparse=True),
                            opt_func=partial(O.SparseEmbedOpt, opt_func=O.ForeachLamb, rule='rowwise-adagrad'))
    learn.create_opt(); b = next(iter(learn.dls.train)); learn.xb, learn.yb = b[:2], b[2:]
    before = {k: v.clone() for k, v in learn.model.state_dict().items()}
    assert warm_step(learn, b) is False
    assert all(torch.equal(v, learn.model.state_dict()[k]) for k, v in before.items())
