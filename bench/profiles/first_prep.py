"""What a first `fgt-prep --dask` spends its time on: the imports, the cluster's start, each pass, and inside the worker's tasks
(dask's task stream and its statistical profiler, sampling the worker's task threads every 10 ms), for `--repeat` runs in one
process (the first is the user's first run; a later one is the same run with a warm worker).

    python bench/profiles/first_prep.py --repeat 2 -- --data <folder> --cat-names ... --cont-names ... --y-names label
    python bench/profiles/first_prep.py --scheduler default -- ...   # as fgt-prep chooses: on one GPU dask's threads in this process
    python bench/profiles/first_prep.py --scheduler default --plain-mr -- ...   # the same on cuDF's `cudaMalloc` resource (baseline)

Prints, a run at a time: the passes (`TabularDask.timings`; on a GPU each with the device's mean utilization and peak memory by
`nvidia-smi` every 200 ms), the task threads' busy seconds, each task kind's count, first, median and total seconds and when its
first began, and the functions holding the most of the worker's samples (inclusive) in the run's first `--head` seconds
and in the rest."""
import argparse, os, statistics, sys, time
from contextlib import contextmanager
from pathlib import Path
T0 = time.perf_counter()
sys.path.insert(0, str(Path(__file__).parent.parent))  # bench/: bench_prep's GpuSampler

def top_functions(tree:dict, n:int)->tuple:
    """The `n` functions found in most samples of a `distributed` profile tree (inclusive: each sample once a function; those in
    9 of 10 samples or more, the task's wrappers, left out) and the `n` in most samples' innermost Python frame (own), as (samples,
    function) lists"""
    tot,own = {},{}
    def walk(d, path):
        desc = d['description']
        k = desc if isinstance(desc, str) else f"{desc['name']} ({os.path.basename(desc['filename'])})"  # a function, any line
        own[k] = own.get(k, 0) + d['count'] - sum(c['count'] for c in d['children'].values())
        if k not in path: tot[k] = tot.get(k, 0) + d['count']
        for c in d['children'].values(): walk(c, path | {k})
    walk(tree, frozenset())
    top = lambda d: sorted(((v, k) for k,v in d.items() if k != 'root' and v < 0.9*tree['count']), reverse=True)[:n]
    return top(tot),top(own)

def task_table(data:list, t0:float, t1:float)->list:
    "Per task kind of the task stream `data` within (t0, t1): count, first task's s, median s, total s"
    from dask.utils import key_split
    kinds = {}
    for d in data:
        for s in d['startstops']:
            if s['action'] == 'compute' and t0 <= s['start'] <= t1: kinds.setdefault(key_split(d['key']), []).append(s)
    first = {k: min(v, key=lambda s: s['start']) for k,v in kinds.items()}
    return [(k, len(v), first[k]['stop'] - first[k]['start'], statistics.median(s['stop']-s['start'] for s in v),
             sum(s['stop']-s['start'] for s in v), first[k]['start'] - t0) for k,v in sorted(kinds.items(), key=lambda kv: first[kv[0]]['start'])]

class Local:
    """dask's local-scheduler callbacks: each task's (key, start, stop) as the task stream gives them (from its submission to its
    result, both seen by the scheduler's thread: at most `num_workers` tasks are out at once), and every 10 ms the stacks of the
    threads running a task (in dask's `execute_task`), as `distributed`'s profiler samples a worker's"""
    def __init__(self):
        import threading
        from dask.callbacks import Callback
        self.tasks,self.trees,self.running,self.sampling = [],{},{},True
        self.cb = Callback(pretask=self._pre, posttask=self._post)
        threading.Thread(target=self._sample, daemon=True).start()
    def register(self): self.cb.register()
    def unregister(self): self.cb.unregister()
    def _pre(self, key, dsk, state): self.running[key] = time.time()
    def _post(self, key, result, dsk, state, worker_id):
        self.tasks.append(dict(key=key, startstops=[dict(action='compute', start=self.running.pop(key, time.time()), stop=time.time())]))
    def _sample(self):
        "Every 10 ms each task thread's stack into that second's tree (frames are not kept: they would hold the partitions alive)"
        import threading
        from distributed import profile
        me = threading.get_ident()
        while self.sampling:
            for ident,f in sys._current_frames().items():
                g = f
                while g is not None and not (g.f_code.co_name in ('execute_task', 'batch_execute_tasks')
                                             and g.f_code.co_filename.endswith('local.py')): g = g.f_back
                if ident != me and g is not None: profile.process(f, None, self.trees.setdefault(int(time.time()), profile.create()))
            del f, g
            time.sleep(0.01)
    def tree(self, t0, t1):
        from distributed import profile
        return profile.merge(*[t for s,t in list(self.trees.items()) if t0 <= s < t1]) if self.trees else profile.create()

def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--repeat', type=int, default=1)
    p.add_argument('--scheduler', default='cluster', choices=['cluster', 'default'], help="a cluster even on one GPU, or fgt-prep's choice")
    p.add_argument('--head', type=float, default=8.0, help="the first seconds of a run, whose samples are listed apart")
    p.add_argument('--top', type=int, default=25)
    p.add_argument('--cprofile', action='store_true', help="cProfile the first run's main thread (its planning, the client's work between "
                   "passes: with dask's threads the tasks run elsewhere), the --top functions by cumulative time")
    p.add_argument('--plain-mr', action='store_true', help="keep cuDF's default memory resource (`cudaMalloc`/`cudaFree`, a free waits "
                   "for the whole device) where fgt-prep's in-process dask (or `dask_client`'s GPU workers) make it RMM's stream-ordered "
                   "one: that change's baseline")
    p.add_argument('rest', nargs=argparse.REMAINDER, help="fgt-prep's flags, after --")
    a = p.parse_args()
    flags = [f for f in a.rest if f != '--']
    imp = {}
    for m in ('numpy', 'cudf', 'torch', 'fastai.tabular.core', 'distributed', 'dask_cuda', 'fastai_gpu_tabular.data'):
        t = time.perf_counter()
        try: __import__(m)
        except ImportError: pass
        imp[m] = round(time.perf_counter() - t, 2)
    print(f'imports (s, each after the ones before): {imp}; {time.perf_counter()-T0:.2f} s since start', flush=True)
    import dask
    import fastai_gpu_tabular.data as data, fastai_gpu_tabular.tabular_dask as tdm
    from fastcore.script import parse_cli
    client = None
    if a.scheduler == 'cluster':
        t = time.perf_counter(); client = tdm.dask_client(**({'rmm_async': False} if a.plain_mr else {}))
        print(f'cluster started in {time.perf_counter()-t:.2f} s', flush=True)
    sys.argv = [sys.argv[0], '--dask', *flags]
    pargs,kwargs,_ = parse_cli(data.main)
    spans, timed = [], tdm._timed
    @contextmanager
    def spanned(td, name):  # each pass's start and end too, not only its seconds
        t = time.perf_counter()
        with timed(td, name): yield
        spans.append((name, t, time.perf_counter()))
    tdm._timed = spanned  # the passes look it up in their module at each call
    if a.plain_mr:
        import fastai_gpu_tabular.stream as fst
        fst._async_mr = lambda index: None  # `dask_scheduler` imports it at each call
    from fastai_gpu_tabular.backend import gpu_available
    from bench_prep import GpuSampler
    for r in range(a.repeat):
        ts = rec = None
        spans.clear(); smi = GpuSampler() if gpu_available() else None
        if client is not None:
            from distributed import get_task_stream
            ts_cm = get_task_stream(client); ts = ts_cm.__enter__()
        else: rec = Local(); rec.register()
        t0w = time.time(); t = time.perf_counter()
        if a.cprofile and r == 0:
            import cProfile, io, pstats
            pr = cProfile.Profile(); to = pr.runcall(data.main, *pargs, **kwargs)
        else: to = data.main(*pargs, **kwargs)
        wall = time.perf_counter() - t; t1w = time.time()
        if a.cprofile and r == 0:
            out = io.StringIO(); pstats.Stats(pr, stream=out).sort_stats('cumulative').print_stats(a.top)
            print("  the main thread's cProfile (run 1, cumulative):\n" + out.getvalue()[-6000:], flush=True)
        mr = type(sys.modules['rmm'].mr.get_current_device_resource()).__name__ if 'rmm' in sys.modules else None
        print(f'run {r+1}: {wall:.2f} s; passes {to.timings}; memory resource {mr}', flush=True)
        if smi:
            smi.stop(0, 0)
            for name,t0,t1 in spans:
                us,ms = [u for t,m,u in smi.samples if t0 <= t <= t1],[m for t,m,u in smi.samples if t0 <= t <= t1]
                if us: print(f'  {name:12s} {t1-t0:6.2f} s: GPU busy {sum(us)/len(us):5.1f}% on average, peak memory {max(ms)/1024:6.1f} GB '
                             f'({len(us)} samples)', flush=True)
        if client is not None: ts_cm.__exit__(None, None, None); tasks = ts.data
        else: rec.unregister(); rec.sampling = False; tasks = rec.tasks
        busy = sum(s['stop']-s['start'] for d in tasks for s in d['startstops'] if s['action'] == 'compute')
        print(f'  task threads busy {busy:.2f} s of {wall:.2f} s x 2 threads; tasks by kind (count, first s, median s, total s, '
              f'first starts at s):', flush=True)
        for k,n,f,m,tot,st in task_table(tasks, t0w, t1w): print(f'  {k:28s} {n:4d} {f:7.2f} {m:7.3f} {tot:7.2f} {st:7.2f}')
        for name,(s0,s1) in (('first', (t0w, t0w + a.head)), ('rest', (t0w + a.head, t1w))):
            tree = client.profile(start=s0, stop=s1) if client is not None else rec.tree(s0, s1)
            inc,own = top_functions(tree, a.top)
            print(f"  the task threads' samples in the run's {name} {s1-s0:.1f} s: {tree['count']} (10 ms each); most (inclusive | own):")
            for (c,k),(c2,k2) in zip(inc, own): print(f'    {c:6d}  {k[:70]:70s} | {c2:6d}  {k2[:70]}')
    print(f'all done {time.perf_counter()-T0:.2f} s since start', flush=True)
    if client is not None:
        import multiprocessing
        for q in multiprocessing.active_children(): q.kill()  # as fgt-prep ends: the workers killed, then the cluster closed
        client.close(); client.cluster.close()

if __name__ == '__main__': main()
