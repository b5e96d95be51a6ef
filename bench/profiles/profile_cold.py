"""What a fresh process compiles or loads on first use: bench_e2e's `ours` path, phase by phase, in a process whose kernel
caches are empty (cold), then in a second process on the caches the first one filled (warm caches), then a second run in
that process (warm). After each phase: seconds, and the files each cache gained (cupy, Triton, numba, libcudf's jitify,
the driver's PTX cache) with the cupy kernels compiled (names from the saved sources) and the seconds in cupy's compiler.

    python bench/profiles/profile_cold.py --rows 20000000"""
import argparse, collections, cProfile, io, json, os, pstats, re, subprocess, sys, tempfile, time, traceback
from pathlib import Path
sys.path.insert(0, str(Path(__file__).parent.parent))  # bench/: common, roofline
from common import cache_env
p = argparse.ArgumentParser()
p.add_argument('--rows', type=int, default=20_000_000)
p.add_argument('--file', default='/tmp/fgt_cold/ratings.parquet')
p.add_argument('--bs', type=int, default=65_536)
p.add_argument('--cache', default=None, help='(internal) the cache root of this child')
p.add_argument('--runs', type=int, default=1, help='(internal) runs in this child')
p.add_argument('--name', default='cold_start')
p.add_argument('--env', nargs='*', default=[], help='NAME=VALUE settings for the two processes, e.g. KVIKIO_COMPAT_MODE=ON')
p.add_argument('--top', type=int, default=0, help="the warm run's procs phase under cProfile: its `top` entries by cumulative time")
a = p.parse_args()

def files(root):
    "{relative path: size} of every file under `root`"
    return {str(f.relative_to(root)): f.stat().st_size for f in Path(root).rglob('*') if f.is_file()}

if a.cache is None:  # the driver: data, then the two children
    if not Path(a.file).exists():
        from fastai_gpu_tabular.data import synth_movielens
        Path(a.file).parent.mkdir(parents=True, exist_ok=True)
        synth_movielens(a.rows, gpu=False).to_parquet(a.file, index=False)
    root, rows = tempfile.mkdtemp(prefix='fgt_cache_'), []
    for proc, runs in (('cold caches', 1), ('warm caches', 2)):
        r = subprocess.run([sys.executable, __file__, '--cache', root, '--runs', str(runs), '--file', a.file, '--bs', str(a.bs),
                            '--top', str(a.top)], capture_output=True, text=True, env=cache_env(root, CUPY_CACHE_SAVE_CUDA_SOURCE='1', **dict(e.split('=', 1) for e in a.env)))
        if r.returncode: print(r.stdout[-3000:], r.stderr[-6000:]); raise SystemExit(f'the {proc} process failed')
        print('\n'.join(l for l in r.stdout.splitlines() if not l.startswith('{')))
        rows += [dict(process=proc, **json.loads(l)) for l in r.stdout.splitlines() if l.startswith('{')]
    from common import report
    cols = ['process', 'run', 'phase', 's', 'cupy_kernels', 'cupy_compile_s', 'new_cache_files']
    for r in rows: r['new_cache_files'] = ' '.join(f'{k}:{v}' for k, v in r.pop('new_files').items())
    for r in rows:  # each cupy kernel compiled, with the library and cuDF lines that asked for it
        if r['process'] == 'cold caches': print(*(f"{r['phase']}: {k}" for k in r['kernels']), sep='\n')
    report(a.name, rows, cols, dict(bench='cold_start', file=a.file, bs=a.bs, env=a.env))
    sys.exit()

# a child: bench_e2e's `ours` path, phase by phase
t0 = time.perf_counter()
compiled = []  # (kernel names and the lines that asked for them, seconds) of each cupy compilation
def caller():
    "The innermost frames of this library and of cuDF on the stack"
    fs = traceback.extract_stack()
    pick = lambda part: next((f'{Path(f.filename).name}:{f.lineno} {f.name}' for f in reversed(fs) if part in f.filename), '')
    return pick('fastai_gpu_tabular/'), pick('/cudf/')
import cupy.cuda.compiler as cc
for fn in ('_compile_module_with_cache', 'compile_with_cache'):
    if hasattr(cc, fn):
        def timed(*args, _f=getattr(cc, fn), **kw):
            t = time.perf_counter(); out = _f(*args, **kw)
            ns = re.findall(r'__global__\s+void\s+(\w+)', args[0] if args and isinstance(args[0], str) else '')
            compiled.append(([f'{n} <- {" <- ".join(caller())}' for n in ns], time.perf_counter() - t))
            return out
        setattr(cc, fn, timed); break
import torch, warnings, pandas as pd
from fastai.tabular.all import CategoryBlock
from fastai.callback.progress import ProgressCallback
import fastai_gpu_tabular.backend as backend
from fastai_gpu_tabular.data import BENCH_SCHEMA
from fastai_gpu_tabular.tabular import TabularGPU, random_splits
from fastai_gpu_tabular.procs import Categorify, FillMissing, Normalize
from fastai_gpu_tabular.learner import tabular_learner
from fastai_gpu_tabular.optimizer import ForeachLamb, ExcludeEmbeddings, large_batch_lr
from fastai_gpu_tabular.ranking import RocAucBinary
SCHEMA = {k: list(v) if isinstance(v, tuple) else v for k, v in BENCH_SCHEMA.items()}
seen, mark = files(a.cache), [t0, 0]

def phase(run, name):
    "Print the phase's seconds, the cache files it added and the cupy kernels it compiled"
    torch.cuda.synchronize(); now = time.perf_counter()
    global seen
    new = files(a.cache); added = {k: v for k, v in new.items() if k not in seen}; seen = new
    by = collections.Counter(k.split('/')[0] for k in added)
    ks = [k for ns, _ in compiled[mark[1]:] for k in ns]
    print(json.dumps(dict(run=run, phase=name, s=round(now - mark[0], 3), cupy_kernels=len(compiled) - mark[1],
                          cupy_compile_s=round(sum(s for _, s in compiled[mark[1]:]), 3), new_files=dict(by),
                          kernels=sorted(set(ks)))), flush=True)
    mark[:] = [time.perf_counter(), len(compiled)]

import contextlib
@contextlib.contextmanager
def profiled(run):
    "Under cProfile in the second run if `--top`, printing the top entries by cumulative time"
    if not a.top or run != 2: yield; return
    pr = cProfile.Profile(); pr.enable()
    yield
    pr.disable(); s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats('cumulative').print_stats(a.top); print(s.getvalue()[:7000])

phase(0, 'imports')
for run in range(1, a.runs + 1):
    if run == 1: splits = random_splits(len(pd.read_parquet(a.file, columns=['target'])), 0.2, 42)  # outside the phases, as in bench_e2e
    mark[0] = time.perf_counter()
    if run == 1: torch.zeros(1, device='cuda'); phase(run, 'cuda_context')
    df = backend.read_frame(a.file, gpu=True); phase(run, 'read')
    with profiled(run):
        to = TabularGPU(df, procs=[Categorify, FillMissing, Normalize], splits=splits, y_block=CategoryBlock(), **SCHEMA)
    phase(run, 'procs')
    with profiled(run):
        dls = to.dataloaders(bs=a.bs, seed=42)
        learn = tabular_learner(dls, layers=[512, 256], opt_func=ForeachLamb, cbs=ExcludeEmbeddings()).to_bf16()
    learn.remove_cb(ProgressCallback); phase(run, 'loaders_model')
    learn.fit_one_cycle(1, large_batch_lr(a.bs, 5e-3, 1024)); phase(run, 'train')
    learn.metrics = RocAucBinary(); learn.validate(); phase(run, 'valid_auc')
