"""Where a training step's time goes, event by event: host time (perf_counter) and GPU time (CUDA events, no sync) between
fastai's batch events, over `--steps` resident steps of the Criteo shape; then the torch profiler's busiest host ops and kernels.
The GPU's time between two events includes its waits for the host, so a segment's two figures say which side bounds it.

    python bench/profiles/profile_step.py --width 16 --opt rowwise-adagrad --rows 10000000"""
import argparse, time
from collections import defaultdict
from functools import partial
p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument('--width', type=int, default=16, help="one width for every table; 0: fastai's rule")
p.add_argument('--opt', default='rowwise-adagrad', help="the tables' step: dense, adagrad, rowwise-adagrad, lazy-adam")
p.add_argument('--rows', type=int, default=10_000_000)
p.add_argument('--bs', type=int, default=65536)
p.add_argument('--steps', type=int, default=60)
p.add_argument('--top', type=int, default=30)
p.add_argument('--graph', action='store_true', help="with `CudaGraph`: the forward and backward replayed")
p.add_argument('--stack', default=None, help="also the Python stacks and shapes of the ops whose names hold this, e.g. 'gather'")
a = p.parse_args()
import torch
from fastai.tabular.all import CategoryBlock, ProgressCallback, Callback, CancelFitException
from fastai_gpu_tabular.data import synth_criteo, CRITEO_SCHEMA
from fastai_gpu_tabular.procs import Categorify, FillMissing, Normalize
from fastai_gpu_tabular.tabular import TabularGPU, RandomRowSplit
from fastai_gpu_tabular.learner import tabular_learner
from fastai_gpu_tabular.optimizer import ForeachLamb, ExcludeEmbeddings, SparseEmbedOpt
from fastai_gpu_tabular.graph import CudaGraph

to = TabularGPU(synth_criteo(a.rows, cap=500_000, gpu=True), procs=[Categorify, FillMissing, Normalize],
                splits=RandomRowSplit(0.2, 42), y_block=CategoryBlock(), **CRITEO_SCHEMA)
kw = dict(opt_func=ForeachLamb) if a.opt == 'dense' else dict(
    config=dict(sparse=True), opt_func=partial(SparseEmbedOpt, opt_func=ForeachLamb, rule=a.opt))
learn = tabular_learner(to.dataloaders(bs=a.bs, seed=0), layers=[512, 256], emb_szs={n: a.width for n in to.cat_names} if a.width else None,
                        cbs=[ExcludeEmbeddings()] + ([CudaGraph()] if a.graph else []), **kw)
learn.remove_cb(ProgressCallback); learn.to_bf16()
EVENTS = ['before_batch', 'after_pred', 'after_loss', 'before_backward', 'after_backward', 'before_step', 'after_step', 'after_batch']

class Marks(Callback):
    "A host time and a CUDA event at each of `EVENTS` of `n` training batches after `warm`, then stop the fit"
    graph_safe = True  # marks only: `CudaGraph` replays the whole step, the marks after it
    order = 100
    def __init__(self, n, warm=10): self.n, self.warm, self.marks = n, warm, []
    def _mark(self, e):
        if self.training and self.iter >= self.warm:
            ev = torch.cuda.Event(enable_timing=True); ev.record(); self.marks.append((e, time.perf_counter(), ev))
for e in EVENTS: setattr(Marks, e, (lambda e: lambda self: self._mark(e))(e))
STEPS = []  # the whole step's graphs (`CudaGraph`), kept past the fit (its `after_fit` lets them go)
def _after_batch(self):
    self._mark('after_batch')
    if self.iter >= self.warm + self.n:
        STEPS.extend(v for v in getattr(getattr(self.learn, 'cuda_graph', None), 'graphs', {}).values() if hasattr(v, 'g'))
        raise CancelFitException()
Marks.after_batch = _after_batch

m = Marks(a.steps); learn.fit(1, 1e-2, cbs=m); torch.cuda.synchronize()
host, gpu, n = defaultdict(float), defaultdict(float), defaultdict(int)
for (e0, t0, g0), (e1, t1, g1) in zip(m.marks, m.marks[1:]):
    k = f'{e0} -> {e1}'; host[k] += (t1-t0)*1e3; gpu[k] += g0.elapsed_time(g1); n[k] += 1
steps = n['before_batch -> after_pred']
print(f'width {a.width}, {a.opt}, bs {a.bs}: {steps} steps; ms a step: host {sum(host.values())/steps:.2f}, gpu {sum(gpu.values())/steps:.2f}')
for k in host: print(f'  {k:36s} host {host[k]/n[k]:6.2f}  gpu {gpu[k]/n[k]:6.2f}')
if STEPS:  # the GPU's own time a step: the whole step's graph replayed back to back, no host between (it trains on)
    e = [torch.cuda.Event(enable_timing=True) for _ in range(2)]; torch.cuda.synchronize(); e[0].record()
    for _ in range(50): STEPS[0].g.replay()
    e[1].record(); torch.cuda.synchronize()
    print(f'whole step graph replayed back to back: {e[0].elapsed_time(e[1])/50:.2f} ms a step (the GPU alone)')
from torch.profiler import profile, ProfilerActivity
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=bool(a.stack), record_shapes=bool(a.stack)) as prof:
    learn.fit(1, 1e-2, cbs=Marks(20, 5))
if a.stack:
    for e in prof.key_averages(group_by_input_shape=True, group_by_stack_n=15):
        if a.stack in e.key: print(f'--- {e.key} x{e.count}, CUDA {e.self_device_time_total/max(e.count, 1):.0f} us each, shapes {e.input_shapes}',
                                   *e.stack[:15], sep='\n  ')
ev = prof.key_averages()
print(ev.table(sort_by='self_cpu_time_total', row_limit=a.top, max_name_column_width=60))
print(ev.table(sort_by='self_cuda_time_total', row_limit=a.top//2, max_name_column_width=60))
