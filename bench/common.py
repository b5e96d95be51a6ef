"Shared by the bench scripts: timing, the results table, and writing results as JSON with the git commit."
import json, os, statistics, subprocess, sys, time, platform
from pathlib import Path

def sync():
    "Wait for queued GPU work, where there is a GPU"
    try:
        import cupy; cupy.cuda.runtime.deviceSynchronize()
    except Exception: pass

def timed(f, repeats=5, warmup=1):
    "(median seconds over `repeats` synchronised calls after `warmup`, first call's seconds, all times)"
    ts = []
    for i in range(warmup + repeats):
        sync(); t = time.perf_counter(); f(); sync(); ts.append(time.perf_counter() - t)
    return statistics.median(ts[warmup:]), ts[0], ts

def device_name():
    try:
        import cupy; return cupy.cuda.runtime.getDeviceProperties(0)['name'].decode()
    except Exception: return platform.processor() or 'cpu'

def commit():
    if os.environ.get('BENCH_COMMIT'): return os.environ['BENCH_COMMIT']  # the device machine's copy has no git history
    try: return subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], capture_output=True, text=True, cwd=Path(__file__).parent).stdout.strip()
    except Exception: return 'unknown'

def package_hash():
    """sha1 (12 hex digits) of the imported fastai_gpu_tabular's .py files: which code ran where the git history is stale (the
    device machine's copy) or a `BASE` package was imported. A commit's: `git archive C fastai_gpu_tabular | tar -x -C D`, then
    outside the repository `PYTHONPATH=D:<repo>/bench python -c 'from common import package_hash; print(package_hash())'`"""
    import fastai_gpu_tabular
    return folder_hash(Path(fastai_gpu_tabular.__file__).parent)

def folder_hash(pkg:Path)->str:
    "`package_hash` of the package folder `pkg`"
    import hashlib
    h = hashlib.sha1()
    for f in sorted(Path(pkg).glob('*.py')): h.update(f.read_bytes())
    return h.hexdigest()[:12]

def report(name, rows, cols, meta):
    "Print `rows` (dicts) as a table of `cols` and write them with `meta` to bench/results/`name`.json"
    w = {c: max(len(c), *(len(f"{r.get(c, '')}") for r in rows)) for c in cols}
    print('  '.join(c.ljust(w[c]) for c in cols))
    for r in rows: print('  '.join(f"{r.get(c, '')}".ljust(w[c]) for c in cols))
    out = Path(__file__).parent/'results'/f'{name}.json'
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(dict(meta, commit=commit(), package=package_hash(), device=device_name(), rows=rows), indent=1))
    return out

def learner_rate(learn, bs, rows, repeats=5, warm=3, lr=1e-3):
    "(rows/s through `learn.fit`: median of `repeats` timed runs of `rows` rows after `warm` batches, all times)"
    from fastai.callback.core import Callback, CancelFitException
    from fastai.callback.progress import ProgressCallback
    class Timed(Callback):
        "Time `n` training batches after `warm` ones, then stop the fit"
        order = 99
        def __init__(self, n): self.n, self.t = n, None
        def after_batch(self):
            if not self.training: return
            if self.iter == warm - 1: sync(); self.t0 = time.perf_counter()
            if self.iter == warm + self.n - 1:
                sync(); self.t = time.perf_counter() - self.t0; raise CancelFitException()
    n = max(1, min(rows // bs, len(learn.dls.train) - warm))
    learn.remove_cb(ProgressCallback)
    ts = []
    for _ in range(repeats):
        cb = Timed(n); learn.fit(1, lr, cbs=cb); ts.append(cb.t)
    return n * bs / statistics.median(ts), ts

CACHES = dict(cupy='CUPY_CACHE_DIR', triton='TRITON_CACHE_DIR', numba='NUMBA_CACHE_DIR', jitify='LIBCUDF_KERNEL_CACHE_PATH',
              driver='CUDA_CACHE_PATH', inductor='TORCHINDUCTOR_CACHE_DIR')

def cache_env(root, **kw):
    "This environment with every kernel cache (cupy, Triton, numba, libcudf's jitify, the driver's PTX cache; HOME too) under `root`"
    env = dict(os.environ, HOME=str(root), XDG_CACHE_HOME=f'{root}/xdg', **kw)
    env.update({v: f'{root}/{k}' for k, v in CACHES.items()})
    return env

DRIVER = """import atexit, json, sys, threading, time; t0 = time.time()
atexit.register(lambda: print('FGT_ATEXIT_END', time.time(), flush=True))  # registered first: the last exit handler
from fastcore.script import anno_parser
import fastai_gpu_tabular.train as t
t1 = time.time()
a = anno_parser(t.main).parse_args().__dict__
t.main(**{k: v for k, v in a.items() if k not in ('pdb', 'xtra')})
atexit.register(lambda: print('FGT_ATEXIT_START', time.time(), flush=True))
print('FGT_WALL', json.dumps(dict(start=t0, imported=t1, returned=time.time(), file=t.__file__)), flush=True)"""

def run(root, data, flags):
    """One `fgt-train` process with the package folder `root` first on the path, timed from before its start to after its exit:
    (wall, start, imports, main, exit, phases, auc, train_rows_s, metrics), seconds and metrics.json"""
    import shutil, tempfile
    out = tempfile.mkdtemp(prefix='fgt_wall_')
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ.get('PYTHONPATH', '')]))
    data = str(Path(data).resolve()) if Path(data).exists() else data  # a folder or file, or a built-in: 'movielens'
    t = time.time()
    r = subprocess.run([sys.executable, '-c', DRIVER, '--data', data, '--out', out, *flags], env=env, cwd=root,
                       capture_output=True, text=True)  # `-c` puts the working folder first on the path: `root`
    end = time.time()
    if r.returncode: sys.exit(f'fgt-train failed ({root}):\n{r.stderr[-4000:]}')
    line = lambda k: next(l for l in r.stdout.splitlines() if l.startswith(k))[len(k):]
    w = json.loads(line('FGT_WALL'))
    if not Path(w['file']).resolve().is_relative_to(Path(root).resolve()): sys.exit(f"ran {w['file']}, not the package in {root}")
    m = json.loads((Path(out)/'metrics.json').read_text()); shutil.rmtree(out, ignore_errors=True)
    return dict(package=folder_hash(Path(w['file']).parent),  # the code this process ran (a results file's `package`: the importer's)
                wall=end-t, start=w['start']-t, imports=w['imported']-w['start'], main=w['returned']-w['imported'],
                exit=end-w['returned'], phases=m['phases_s'], auc=m.get('roc_auc_score'), train_rows_s=m.get('train_rows_s'), metrics=m)
