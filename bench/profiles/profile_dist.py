"""Where a training step's time goes on each rank of `accelerate launch` (issue 54): `fgt-train` as a user runs it, with a host
time (perf_counter) and a CUDA event (no sync) at fastai's batch events over `--steps` training batches after `--warm`, then the
torch profiler's busiest host ops and kernels over `--prof` more. One file a rank in `--log`: `rank<r>_of<w>.txt` (the segments)
and `rank<r>_of<w>.json`. The GPU's time between two events includes its waits for the host, so a segment's two figures say
which side bounds it; `after_batch -> before_batch` is the loader's `next` and fastai's loop between batches. Every run also
writes what the fit held outside its batches on each rank (`events<r>_of<w>.json`: the setup, each event's callbacks, the 5 slowest
callback events, when each rank reached `before_fit`): what `fgt-train` reports as `fit_other`; `--cprofile CALLBACK.EVENT` profiles one.

    accelerate launch --num_processes 2 bench/profiles/profile_dist.py --log /tmp/prof -- --data <processed folder> --epochs 1"""
import argparse, json, os, sys, time
from collections import defaultdict
from pathlib import Path
p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument('--log', default='/tmp/profile_dist')
p.add_argument('--warm', type=int, default=20)
p.add_argument('--steps', type=int, default=40)
p.add_argument('--prof', type=int, default=8)
p.add_argument('--top', type=int, default=25)
p.add_argument('--timeline', action='store_true', help="instead: each training batch's host time over the whole fit: the first batch's wait and the stalls")
p.add_argument('--trace', action='store_true', help="also: the profiled batches' chrome trace, `trace<r>_of<w>.json` in `--log` (each stream's kernels and gaps)")
p.add_argument('--links', action='store_true', help="first: the ranks' all-reduce and all-gather bandwidth (16, 64, 256 MB), printed by rank 0")
p.add_argument('--exchange', default=None, help="`SparseEmbedOpt`'s exchange of the tables' rows: 'rows', 'whole' (default: 'auto')")
p.add_argument('--reader', default=None, help="the streaming loader's reader: 'pyarrow' or 'cudf' (fgt-train's where cuDF is)")
p.add_argument('--decode', default='auto', choices=['auto', 'host', 'path'],
               help="cuDF's source for local part files: 'host' their bytes read by the loader (to the device on a side stream), 'path' cuDF's "
                    "read of the path, 'auto' the library's default (`stream.CUDF_FROM_HOST`)")
p.add_argument('--prefetch', type=int, default=None, help="the streaming loader's windows read ahead (`ParquetDataLoader`'s `prefetch`)")
p.add_argument('--switch-interval', type=float, default=None, help="`sys.setswitchinterval` (seconds; Python's default 0.005)")
p.add_argument('--stacks', type=float, default=0, metavar='MS',
               help="with --timeline: every thread's Python stack each MS ms; for the 4 longest gaps after batch 0, what each thread was "
                    "in (`stacks<r>_of<w>.txt`), and the longest pause of the sampler (a thread holding the GIL)")
p.add_argument('--reads', action='store_true',
               help="with --timeline: what each window's read held on this rank (`reads<r>_of<w>.json`): the part files' bytes read on the "
                    "host, the conversion to tensors (`_chunk`), the rest (cuDF's decode and the concatenation), summed over its windows")
p.add_argument('--first-batch', type=int, default=0, metavar='N',
               help="with --timeline: cProfile the first N training batches' steps (main thread), `first<r>_of<w>.txt` in `--log`")
p.add_argument('--first-sort', default='cumulative', help="with --first-batch: pstats' order ('tottime': the host's own time a function)")
p.add_argument('--cprofile', nargs='*', default=[], metavar='CALLBACK.EVENT',
               help="cProfile these callbacks' calls at the fit's events (e.g. DistributedTrainer.before_fit): `<name>_<r>_of<w>.txt` in `--log`")
a, rest = p.parse_known_args()
rest = [o for o in rest if o != '--']
import torch
from fastai.callback.core import Callback
import fastai_gpu_tabular.train as T
from fastai_gpu_tabular.comm import rank_world

CUDA = torch.cuda.is_available()
EVENTS = ['before_batch', 'after_pred', 'after_loss', 'after_backward', 'before_step', 'after_step', 'after_batch']

class Marks(Callback):
    "Marks at `EVENTS` of training batches `warm`..`warm+n`, then the torch profiler over `prof` batches; a report a rank"
    graph_safe = True  # marks only: `CudaGraph` replays the whole step, the marks after it
    order = 100
    def __init__(self): self.marks, self.prof, self.done = [], None, False
    def _mark(self, e):
        if not self.training or self.done: return
        i = self.train_iter
        if a.warm <= i < a.warm + a.steps or (e == 'before_batch' and i == a.warm + a.steps):
            ev = CUDA and torch.cuda.Event(enable_timing=True)
            if CUDA: ev.record()
            self.marks.append((e, time.perf_counter(), ev))
        if e == 'before_batch' and i == a.warm + a.steps:
            from torch.profiler import profile, ProfilerActivity
            self.prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]); self.prof.__enter__()
        if e == 'after_batch' and i == a.warm + a.steps + a.prof - 1: self.report()
    def report(self):
        if CUDA: torch.cuda.synchronize()
        self.prof.__exit__(None, None, None); self.done = True
        r, w = rank_world()
        host, gpu, n = defaultdict(float), defaultdict(float), defaultdict(int)
        for (e0, t0, g0), (e1, t1, g1) in zip(self.marks, self.marks[1:]):
            k = f'{e0} -> {e1}'; host[k] += (t1 - t0) * 1e3; gpu[k] += g0.elapsed_time(g1) if CUDA else 0; n[k] += 1
        steps = a.steps
        res = dict(rank=r, world=w, steps=steps, host_ms=sum(host.values()) / steps, gpu_ms=sum(gpu.values()) / steps,
                   bs=self.dls.train.bs, segments={k: dict(host=host[k] / n[k], gpu=gpu[k] / n[k], n=n[k]) for k in host})
        res['rows_s_rank'] = res['bs'] / max(res['gpu_ms'], res['host_ms']) * 1e3
        lines = [f"rank {r} of {w}: {steps} steps, ms a step: host {res['host_ms']:.2f}, gpu {res['gpu_ms']:.2f}; "
                 f"{res['rows_s_rank']/1e6:.2f}M rows/s this rank, {res['rows_s_rank']*w/1e6:.2f}M all ranks"]
        lines += [f"  {k:36s} host {v['host']:7.2f}  gpu {v['gpu']:7.2f}" for k, v in res['segments'].items()]
        ev = self.prof.key_averages()
        lines += [ev.table(sort_by='self_cpu_time_total', row_limit=a.top, max_name_column_width=55),
                  *([ev.table(sort_by='self_cuda_time_total', row_limit=a.top, max_name_column_width=55)] if CUDA else [])]
        log = Path(a.log); log.mkdir(parents=True, exist_ok=True)
        (log / f'rank{r}_of{w}.txt').write_text('\n'.join(lines))
        (log / f'rank{r}_of{w}.json').write_text(json.dumps(res, indent=1))
        if a.trace: self.prof.export_chrome_trace(str(log / f'trace{r}_of{w}.json'))
        print(lines[0], *lines[1:len(res['segments']) + 1], sep='\n', flush=True)
class Timeline(Callback):
    "The host time of every training batch's start: the first batch's wait after `before_train`, then the gaps, the long ones summed"
    order = 100
    def before_train(self):
        self.t, self.samples = [time.perf_counter()], []
        if a.stacks:
            import threading
            self.sampling = True; threading.Thread(target=self.sample, daemon=True, name='stacks').start()
    def sample(self):
        "Every thread's innermost frames every `a.stacks` ms: (time, {thread name: 'file:line function < ...'})"
        import threading
        while self.sampling:
            names = {t.ident: t.name for t in threading.enumerate()}
            now, st = time.perf_counter(), {}
            for ident, f in sys._current_frames().items():
                if names.get(ident) == 'stacks' or f.f_code.co_name == '_worker': continue  # this one; a pool's idle threads
                fs = []
                while f is not None and len(fs) < 5: fs.append(f"{Path(f.f_code.co_filename).name}:{f.f_lineno} {f.f_code.co_name}"); f = f.f_back
                st[names.get(ident, ident)] = ' < '.join(fs)
            self.samples.append((now, st)); time.sleep(a.stacks / 1e3)
    def stack_report(self, t, d):
        "For the 4 longest gaps after batch 0: each thread's stacks by count, the sampler's longest pause inside"
        from collections import Counter
        self.sampling = False; r, w = rank_world(); lines = []
        for i in sorted(sorted(range(1, len(d)), key=lambda i: -d[i])[:4]):
            lo, hi = t[i + 1], t[i + 2]; ss = [(s, st) for s, st in self.samples if lo <= s <= hi]
            times = [lo] + [s for s, _ in ss] + [hi]
            lines.append(f"gap after batch {i}: {d[i]:.1f} ms, {len(ss)} samples, the sampler's longest pause "
                         f"{max(b - a_ for a_, b in zip(times, times[1:])) * 1e3:.1f} ms")
            for (th, stack), n in Counter((th, stack) for _, st in ss for th, stack in st.items()).most_common(12):
                lines.append(f"  {n:4d} {th}: {stack}")
        log = Path(a.log); log.mkdir(parents=True, exist_ok=True); (log / f'stacks{r}_of{w}.txt').write_text('\n'.join(lines))
    def before_batch(self):
        if not self.training: return
        self.t.append(time.perf_counter())
        if a.first_batch and len(self.t) == 2:
            import cProfile; self.cp = cProfile.Profile(); self.cp.enable()
        if a.first_batch and len(self.t) == 2 + a.first_batch: self.first_report()
    def first_report(self):
        "The first batches' steps by cumulative time: where a fit's first calls go (Triton, cuBLAS, NCCL, imports)"
        import io, pstats
        self.cp.disable(); s = io.StringIO(); r, w = rank_world()
        pstats.Stats(self.cp, stream=s).sort_stats(a.first_sort).print_stats(70 if a.first_sort == 'tottime' else 45)
        head = f"rank {r} of {w}: first {a.first_batch} batches' steps {(self.t[-1] - self.t[1]) * 1e3:.1f} ms\n"
        log = Path(a.log); log.mkdir(parents=True, exist_ok=True); (log / f'first{r}_of{w}.txt').write_text(head + s.getvalue())
        print(head, flush=True)
    def after_train(self):
        if CUDA: torch.cuda.synchronize()
        import numpy as np
        t = np.array(self.t + [time.perf_counter()]); d = np.diff(t[1:]) * 1e3; med = float(np.median(d)); long = d > max(4 * med, 20)
        r, w = rank_world()
        res = dict(rank=r, world=w, batches=len(d), first_s=t[1] - t[0], total_s=t[-1] - t[0], median_ms=med, stalls=int(long.sum()),
                   stalls_s=float(d[long].sum() / 1e3), steady_s=float(d[~long].sum() / 1e3),
                   biggest_ms={int(i): round(float(d[i]), 1) for i in sorted(np.argsort(d)[-8:])},  # batch: its wait
                   capture_s=next((c.capture_s for c in self.learn.cbs if hasattr(c, 'capture_s')), None))  # `CudaGraph`'s captures
        if a.stacks: self.stack_report(t, d)
        if a.reads: reads_report()
        if (reads := getattr(self.dls.train, 'reads', None)) is not None:  # the streaming loader's windows: (window, read s, waited s)
            res.update(windows=len(reads), read_s=sum(r[1] for r in reads), waited_s=sum(r[2] for r in reads),
                       read_ms={k: round(r * 1e3) for k, r, _ in reads}, waited_ms={k: round(w * 1e3, 1) for k, _, w in reads if w > 0.005})
        log = Path(a.log); log.mkdir(parents=True, exist_ok=True)
        (log / f'timeline{r}_of{w}.json').write_text(json.dumps(res))
        print(f"rank {r} of {w}: " + ', '.join(f'{k} {v:.2f}' if isinstance(v, float) else f'{k} {v}' for k, v in res.items()), flush=True)

def default(cls, key, value):
    "`cls(...)` called with `key=value`: fgt-train's optimizer and loaders built with the setting under test"
    init = cls.__init__
    def patched(self, *args, **kw): kw[key] = value; init(self, *args, **kw)
    cls.__init__ = patched

if a.exchange:
    import fastai_gpu_tabular.optimizer as O
    default(O.SparseEmbedOpt, 'exchange', a.exchange)
import fastai_gpu_tabular.stream as S
if a.decode != 'auto': S.CUDF_FROM_HOST = a.decode == 'host'
if a.reader:
    default(S.ParquetDataLoader, 'reader', a.reader)
if a.prefetch: default(S.ParquetDataLoader, 'prefetch', a.prefetch)
if a.switch_interval: sys.setswitchinterval(a.switch_interval)
READS = defaultdict(list)  # part of a window's read -> [(thread, host start, host end, bytes)]
def timed(owner, name, part, nbytes=lambda res: 0):
    "`owner.name` wrapped: each call's host interval (and bytes) under `part` in `READS`"
    import threading
    f = getattr(owner, name)
    def wrapped(*args, **kw):
        t0 = time.perf_counter(); res = f(*args, **kw)
        READS[part].append((threading.current_thread().name, t0, time.perf_counter(), nbytes(res))); return res
    setattr(owner, name, wrapped)
if a.reads:
    timed(S.ProcessedSplit, 'read', 'window')
    timed(S.ProcessedSplit, '_file_bytes', 'file_bytes', lambda rs: sum(b - a_ for a_, b in rs))
    timed(S, '_chunk', 'chunk')
def reads_report():
    "Each part's calls, seconds summed and a call's median ms, GB/s of the bytes read: where a window's read goes"
    import numpy as np
    r, w = rank_world(); res = dict(rank=r, world=w)
    for part, xs in READS.items():
        d = np.array([t1 - t0 for _, t0, t1, _ in xs]); b = sum(x[3] for x in xs)
        res[part] = dict(calls=len(xs), s=round(float(d.sum()), 3), median_ms=round(float(np.median(d)) * 1e3, 1),
                         threads=len({x[0] for x in xs}), **(dict(gb=round(b / 1e9, 3), gb_s=round(b / 1e9 / d.sum(), 2)) if b else {}))
    if 'window' in res: res['decode_rest_s'] = round(res['window']['s'] - sum(res.get(k, {}).get('s', 0) for k in ('file_bytes', 'chunk')), 3)
    log = Path(a.log); log.mkdir(parents=True, exist_ok=True); (log / f'reads{r}_of{w}.json').write_text(json.dumps(res))
    print(f"rank {r} of {w}, the windows' reads: {json.dumps({k: v for k, v in res.items() if k not in ('rank', 'world')})}", flush=True)

for e in EVENTS: setattr(Marks, e, (lambda e: lambda self: self._mark(e))(e))

FIT_EVENTS = {'before_fit', 'before_epoch', 'before_train', 'after_train', 'before_validate', 'after_validate', 'after_epoch', 'after_fit'}
FIT_LOG = []  # (event, callback, host start, host end) of each callback's call at the fit's events outside its batches
def _timed_event(call):
    "`call(cb, event_name, *rest)` with its host interval in `FIT_LOG` at the fit's events (and cProfiled where `--cprofile` names it)"
    def timed(self, event_name, *rest):
        if event_name not in FIT_EVENTS: return call(self, event_name, *rest)
        t0, name = time.perf_counter(), f'{type(self).__name__}.{event_name}'
        if name in a.cprofile:
            import cProfile; cp = cProfile.Profile(); cp.enable()
        try: return call(self, event_name, *rest)
        finally:
            FIT_LOG.append((event_name, type(self).__name__, t0, time.perf_counter()))
            if name in a.cprofile: cp.disable(); cprofile_report(cp, name)
    return timed

def cprofile_report(cp, name):
    "`name`'s call by cumulative time: `<name>_<r>_of<w>.txt` in `--log`"
    import io, pstats
    s, (r, w) = io.StringIO(), rank_world(); pstats.Stats(cp, stream=s).sort_stats('cumulative').print_stats(40)
    log = Path(a.log); log.mkdir(parents=True, exist_ok=True); (log / f'{name}_{r}_of{w}.txt').write_text(s.getvalue())
import fastai_gpu_tabular.learner as L
# the learner calls a plain callback's handler directly (`learner._call_cb`), others through `Callback.__call__`: both timed
Callback.__call__, L._call_cb = _timed_event(Callback.__call__), _timed_event(L._call_cb)

def fit_report(t_in, t_out, wall0):
    """What `fgt-train`'s `fit` phase holds outside its batches, on this rank (`events<r>_of<w>.json`, a printed line): the setup
    before the first `before_fit` call (`distrib_ctx`, `fit_one_cycle`'s own), each event's callbacks summed over epochs and the
    5 slowest (callback, event), the end after `after_fit`; `at_fit_s`: this rank's wall clock at `before_fit` after the earliest rank's"""
    r, w = rank_world(); ev, cb = defaultdict(float), defaultdict(float)
    for e, c, t0, t1 in FIT_LOG: ev[e] += (t1 - t0) * 1e3; cb[f'{c}.{e}'] += (t1 - t0) * 1e3
    first, last = min(t0 for e, _, t0, _ in FIT_LOG if e == 'before_fit'), max(t1 for e, _, _, t1 in FIT_LOG if e == 'after_fit')
    res = dict(rank=r, world=w, setup_ms=(first - t_in) * 1e3, **{f'{e}_ms': v for e, v in ev.items()}, end_ms=(t_out - last) * 1e3,
               slowest_ms={k: round(v, 1) for k, v in sorted(cb.items(), key=lambda o: -o[1])[:5]})
    if w > 1 and torch.distributed.is_initialized():
        walls = [None] * w; torch.distributed.all_gather_object(walls, wall0 + first - t_in); res['at_fit_s'] = walls[r] - min(walls)
    res = {k: round(v, 1) if k.endswith('_ms') and isinstance(v, float) else v for k, v in res.items()}
    log = Path(a.log); log.mkdir(parents=True, exist_ok=True); (log / f'events{r}_of{w}.json').write_text(json.dumps(res))
    print(f"rank {r} of {w}, the fit's events: " + ', '.join(f'{k} {v:.3f}' if k == 'at_fit_s' else f'{k} {v}'
                                                            for k, v in res.items() if k not in ('rank', 'world')), flush=True)

_fit_step = T.fit_step
def fit_step(learn, epochs, lr, cbs, *args, **kwargs):
    t_in, wall0 = time.perf_counter(), time.time(); FIT_LOG.clear()
    out = _fit_step(learn, epochs, lr, cbs + [Timeline() if a.timeline else Marks()], *args, **kwargs)
    fit_report(t_in, time.perf_counter(), wall0)
    return out
T.fit_step = fit_step

def links():
    "NCCL's (gloo's) all-reduce and all-gather of 16, 64, 256 MB between the ranks: ms and bus bandwidth (nccl-tests' rule)"
    import torch.distributed as dist
    from accelerate import PartialState
    state = PartialState(cpu=not CUDA); r, w = rank_world()
    if w < 2: return
    dev = state.device
    for mb in (16, 64, 256):
        x = torch.ones(mb * 2**18, device=dev); out = torch.empty(w * len(x), device=dev)
        for name, f, bus in (('all_reduce', lambda: dist.all_reduce(x), 2 * (w - 1) / w),
                             ('all_gather', lambda: dist.all_gather_into_tensor(out, x), (w - 1))):
            for _ in range(3): f()
            if CUDA: torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(10): f()
            if CUDA: torch.cuda.synchronize()
            ms = (time.perf_counter() - t) / 10 * 1e3
            if r == 0: print(f"links: {name} {mb} MB on {w} ranks {ms:.3f} ms, bus {mb * 2**20 * bus / ms / 1e6:.1f} GB/s", flush=True)

if __name__ == '__main__':
    if a.links: links()
    sys.argv = [sys.argv[0]] + rest
    T.main()
