"""What `CudaGraph`'s capture costs and where (issue 54: 2-3 s a process in a one-epoch `fgt-train`, a third of its training
phase): the first `--batches` training batches of a resident Criteo-shaped fit (fgt-train's click-log model: width 16, row-wise
Adagrad, LAMB, bf16), each timed on the host with the GPU drained around it, and the capture batch split into its parts: the
forward's capture, the backward's, each graph's first replay, the rest of the batch. No data to generate on disk: ~30 s.
With `--train`, the same parts in `fgt-train` (its arguments after `--`; under `accelerate launch` each rank prints its own),
and the captures' host ops under torch's profiler; `--trace DIR` profiles the first batches as they run instead (host and GPU,
a chrome trace a rank); `--no-drain` times each step of the capture as it runs (which call waits, and on what);
`--switch-interval` shortens the GIL's (whether the wait is the GIL's).

    python bench/profiles/profile_capture.py --rows 10000000 --bs 65536
    python bench/profiles/profile_capture.py --train -- --data /tmp/crit_proc --epochs 1 --bs 65536 --out /tmp/run
    python bench/profiles/profile_capture.py --train --no-drain -- --data /tmp/crit_proc --epochs 1 --bs 65536 --out /tmp/run"""
import argparse, os, sys, time
from functools import partial
p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument('--rows', type=int, default=10_000_000)
p.add_argument('--bs', type=int, default=65536)
p.add_argument('--batches', type=int, default=8)
p.add_argument('--width', type=int, default=16)
p.add_argument('--ops', type=int, default=25,
               help="the first and the capture batch's host ops by self time, under torch's profiler (0: off)")
p.add_argument('--train', action='store_true', help="`fgt-train` with the arguments after `--` instead of the resident fit")
p.add_argument('--trace', default='', help="with --train: the first `--batches` training batches as they run (no drain), each's "
               "host start, and torch's profiler over them (host and GPU), its chrome trace written to this folder")
p.add_argument('--no-drain', action='store_true', help="the capture's steps timed on the host as they run, the GPU not drained "
               "(whether the GPU was still busy when it began, too): which call waits")
p.add_argument('--switch-interval', type=float, default=0, help="`sys.setswitchinterval` in seconds (0: Python's 5 ms): a capture "
               "that waits less with a shorter one waited for the GIL (the loader's threads hold it)")
p.add_argument('--reader', default='', help="with --train: the streamed loader's reader ('cudf', 'pyarrow'; default: its own "
               "'auto'): a wait that goes with 'pyarrow' is cuDF's (its decode shares the training's stream)")
a, rest = p.parse_known_args()
if a.switch_interval: sys.setswitchinterval(a.switch_interval)
import torch
from fastai.tabular.all import CategoryBlock, ProgressCallback, Callback, CancelFitException
from fastai_gpu_tabular.data import synth_criteo, CRITEO_SCHEMA
from fastai_gpu_tabular.procs import Categorify, FillMissing, Normalize
from fastai_gpu_tabular.tabular import TabularGPU, RandomRowSplit
from fastai_gpu_tabular.learner import tabular_learner
from fastai_gpu_tabular.optimizer import ForeachLamb, ExcludeEmbeddings, SparseEmbedOpt
import fastai_gpu_tabular.graph as G

parts = []  # (name, seconds) of the capture batch, the GPU drained before and after each
def timed(name, f):
    def g(*args, **kw):
        torch.cuda.synchronize(); t = time.perf_counter()
        res = f(*args, **kw)
        torch.cuda.synchronize(); parts.append((name, time.perf_counter() - t))
        return res
    return g
_capture, n_cap = G._capture, [0]
def capture(g, pool, f):
    n_cap[0] += 1
    return timed(f"capture {'forward' if n_cap[0] % 2 else 'backward'}", _capture)(g, pool, f)
def host_capture(g, pool, f):
    "`G._capture` step by step, each step's host time, nothing drained"
    n_cap[0] += 1; w, cur, t = 'forward' if n_cap[0] % 2 else 'backward', torch.cuda.current_stream(), [time.perf_counter()]
    busy = not cur.query()
    s = torch.cuda.Stream(); s.wait_stream(cur); t.append(time.perf_counter())
    with torch.cuda.stream(s):
        g.capture_begin(pool=pool, capture_error_mode='thread_local'); t.append(time.perf_counter())
        try: res = f(); t.append(time.perf_counter())
        finally: g.capture_end(); t.append(time.perf_counter())
    parts.extend((f"{w} {n}", t1 - t0) for n, t0, t1 in zip(
        ('stream' + (' (the GPU busy)' if busy else ' (the GPU idle)'), 'capture_begin', 'record', 'capture_end'), t, t[1:]))
    return res
if not a.trace: G._capture = host_capture if a.no_drain else capture
for k in (() if a.trace or a.no_drain else ('forward', 'backward')):
    f = getattr(G._Captured, k)
    def first(self, *args, _f=f, _k=k):  # each graph's first replay, timed; later ones as they are
        if getattr(self, f'_seen_{_k}', False): return _f(self, *args)
        setattr(self, f'_seen_{_k}', True)
        return timed(f'first replay {_k}', _f)(self, *args)
    setattr(G._Captured, k, first)

def report(prefix=''):
    print('\n'.join(f'{prefix}  {n:24s} {t*1e3:9.1f} ms' for n, t in parts))
    print('\n'.join(f"{prefix}{n}'s host ops (with the profiler's cost):\n{t}" for n, t in tables))

tables = []  # (name, torch profiler's table of host ops)
if a.train:  # each capture's host ops, and fgt-train as its command line has it
    init = G._Captured.__init__
    def profiled(self, *args):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof: init(self, *args)
        tables.append((f'capture {len(tables)+1}', prof.key_averages().table(sort_by='self_cpu_time_total', row_limit=a.ops,
                                                                              max_name_column_width=60)))
    if a.ops and not a.trace and not a.no_drain: G._Captured.__init__ = profiled
    if a.no_drain:
        def whole(self, *args):
            t = time.perf_counter(); init(self, *args); parts.append(('the capture in all (CudaGraph.capture_s)', time.perf_counter() - t))
        G._Captured.__init__ = whole
    if a.trace:  # the batches' starts, and the profiler from the first training batch to the end of the last of `a.batches`
        from fastai.learner import Learner
        one, starts, prof = Learner._do_one_batch, [], torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA])
        def traced(self):
            if self.training and len(starts) <= a.batches:
                if not starts: prof.__enter__()
                starts.append(time.perf_counter())
                if len(starts) > a.batches:
                    prof.__exit__(None, None, None); r = os.environ.get('RANK', '0')
                    os.makedirs(a.trace, exist_ok=True); prof.export_chrome_trace(f'{a.trace}/rank{r}.json')
                    ka = prof.key_averages()
                    for by in ('self_cpu_time_total', 'self_device_time_total'): tables.append((f'{a.batches} batches by {by}',
                        ka.table(sort_by=by, row_limit=a.ops, max_name_column_width=60)))
                    gaps = ' '.join(f'{(t1-t0)*1e3:.1f}' for t0, t1 in zip(starts, starts[1:]))
                    tables.append(('the batches (host start to start, ms)', gaps))
            return one(self)
        Learner._do_one_batch = traced
    if a.reader:
        from functools import partialmethod
        from fastai_gpu_tabular.stream import ParquetDataLoader
        ParquetDataLoader.__init__ = partialmethod(ParquetDataLoader.__init__, reader=a.reader)
    from fastcore.script import anno_parser
    from fastai_gpu_tabular.train import main
    args = anno_parser(main).parse_args([r for r in rest if r != '--']).__dict__
    main(**{k: v for k, v in args.items() if k not in ('pdb', 'xtra')})
    report(f"[rank {os.environ.get('RANK', 0)}] "); sys.exit()

class Batches(Callback):
    "Each training batch's host time, the GPU drained at its start and end; the fit stops after `a.batches`"
    order = 100
    def before_fit(self): self.ts = []
    def before_batch(self):
        if not self.training: return
        if a.ops and len(self.ts) in (0, graph.warmup):  # the first batch and the capture batch
            self.prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]); self.prof.__enter__()
        torch.cuda.synchronize(); self.t = time.perf_counter()
    def after_batch(self):
        if not self.training: return
        torch.cuda.synchronize(); self.ts.append(time.perf_counter() - self.t)
        if getattr(self, 'prof', None) is not None:
            self.prof.__exit__(None, None, None)
            tables.append(('the first batch' if len(self.ts) == 1 else 'the capture batch', self.prof.key_averages().table(
                sort_by='self_cpu_time_total', row_limit=a.ops, max_name_column_width=60)))
            self.prof = None
        if len(self.ts) == a.batches: raise CancelFitException()

to = TabularGPU(synth_criteo(a.rows, cap=500_000, gpu=torch.cuda.is_available()), procs=[Categorify, FillMissing, Normalize],
                splits=RandomRowSplit(0.2, 42), y_block=CategoryBlock(), **CRITEO_SCHEMA)
graph, marks = G.CudaGraph(), Batches()
learn = tabular_learner(to.dataloaders(bs=a.bs, seed=0), layers=[512, 256], emb_szs={n: a.width for n in to.cat_names},
                        config=dict(sparse=True), opt_func=partial(SparseEmbedOpt, opt_func=ForeachLamb, rule='rowwise-adagrad'),
                        cbs=[ExcludeEmbeddings(), graph, marks])
learn.remove_cb(ProgressCallback); learn.to_bf16()
learn.fit(1, 1e-2)
print(f"{torch.cuda.get_device_name()}: {a.rows:,} rows, bs {a.bs:,}; captures {graph.captures}, replays {graph.replays}, "
      f"capture_s (host, not drained) {graph.capture_s:.3f}")
print('batch  ms (GPU drained around each)'); print('\n'.join(f'{i:5d}  {t*1e3:9.1f}' for i, t in enumerate(marks.ts)))
print('the capture batch:'); report()
