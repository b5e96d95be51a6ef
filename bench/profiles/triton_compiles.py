"""Run a Python script with Triton's compiles traced: each `triton.compiler.compile` call timed (a kernel specialization new to this
process: read from `TRITON_CACHE_DIR` in milliseconds, else compiled), with its kernel, constexprs and the library's frame that
launched it. At exit: the compiles in order and their sum, then the same specializations compiled again into two empty caches,
one after the other and on `--threads` threads at once: what a pool could make of a machine's first run.

    TRITON_CACHE_DIR=$(mktemp -d) python bench/profiles/triton_compiles.py --threads 8 bench/profiles/profile_step.py --graph \\
        --width 16 --rows 1000000 --steps 10

(A script that ends by `os._exit`, as `fgt-train` does, prints only the lines of each compile as it happens.)"""
import atexit, os, runpy, sys, tempfile, time, threading, traceback
import triton, triton.compiler as TC, triton.compiler.compiler as CC

calls, lock, orig = [], threading.Lock(), CC.compile

def _name(src): return getattr(getattr(src, 'fn', None), '__name__', type(src).__name__)

def traced(src, *a, **k):
    t = time.perf_counter(); r = orig(src, *a, **k); s = time.perf_counter() - t
    at = [f"{os.path.basename(f.filename)}:{f.lineno}:{f.name}" for f in traceback.extract_stack()[:-1]
          if 'fastai_gpu_tabular' in f.filename][-1:]
    with lock: calls.append((s, src, a, k))
    print(f"TRITON {s:6.3f} s  {_name(src)} {getattr(src, 'constants', '')} < {' '.join(at)}", file=sys.stderr, flush=True)
    return r
TC.compile = CC.compile = traced  # the JIT imports `compile` from `triton.compiler` when a kernel first binds

def _again(cs, threads):
    "The compiles `cs` again into an empty cache, on `threads` threads: wall seconds"
    d = tempfile.mkdtemp(prefix='triton-again-')
    os.environ['TRITON_CACHE_DIR'] = d
    try: triton.knobs.cache.dir = d
    except Exception: pass
    todo,t = list(cs),time.perf_counter()
    def work():  # threads of its own: an executor takes no work at exit
        while True:
            with lock:
                if not todo: return
                c = todo.pop(0)
            orig(c[1], *c[2], **c[3])
    ts = [threading.Thread(target=work) for _ in range(threads)]
    for th in ts: th.start()
    for th in ts: th.join()
    return time.perf_counter() - t

@atexit.register
def summary():
    slow = [c for c in calls if c[0] > 0.02]
    print(f"\nTRITON: {len(calls)} specializations, {len(slow)} compiled (>20 ms), {sum(c[0] for c in slow):.2f} s compiling",
          file=sys.stderr)
    if not slow or THREADS < 1: return
    one,many = _again(slow, 1),_again(slow, THREADS)
    print(f"TRITON again into empty caches: one after the other {one:.2f} s, {THREADS} threads {many:.2f} s ({one/many:.2f}x)",
          file=sys.stderr)

THREADS = 0
if __name__ == '__main__':
    args = sys.argv[1:]
    if args[:1] == ['--threads']: THREADS,args = int(args[1]),args[2:]
    sys.argv = args
    runpy.run_path(sys.argv[0], run_name='__main__')
