"""Run a Python script with cupy's kernel compiles traced: each `_compile_with_cache_cuda` call timed (a kernel new to this
process; over 50 ms, compiled by NVRTC rather than read from `CUPY_CACHE_DIR`), with the library's frames that asked for it.
A summary goes to stderr at exit. With an empty `CUPY_CACHE_DIR` this is what a machine's first run compiles.

    CUPY_CACHE_DIR=$(mktemp -d) python bench/profiles/cupy_compiles.py bench/profiles/first_prep.py --repeat 2 --scheduler default -- \\
        --data <folder> --cat-names ... --mh-names genres --y-names target --out /tmp/fp --overwrite

`bench/profiles/synth_inputs.py` writes MovieLens- or Criteo-shaped inputs in another process (so that its kernels are not counted)."""
import atexit, os, runpy, sys, time, threading, traceback
import cupy.cuda.compiler as C
calls, lock, orig = [], threading.Lock(), C._compile_with_cache_cuda

def traced(*a, **k):
    t = time.perf_counter(); r = orig(*a, **k); s = time.perf_counter() - t
    at = [f"{os.path.basename(f.filename)}:{f.lineno}:{f.name}" for f in traceback.extract_stack()[:-1]
          if any(p in f.filename for p in ('fastai_gpu_tabular', '/cudf/', 'dask_cudf', 'bench'))][-4:]
    with lock: calls.append((s, ' < '.join(reversed(at))))
    return r
C._compile_with_cache_cuda = traced

@atexit.register
def summary():
    slow = [c for c in calls if c[0] > 0.05]
    print(f"\nCUPY: {len(calls)} kernel lookups, {len(slow)} compiled (>50 ms), {sum(c[0] for c in slow):.2f} s compiling", file=sys.stderr)
    for s,w in sorted(slow, reverse=True)[:40]: print(f"CUPY {s:6.2f} s  {w}", file=sys.stderr)

if __name__ == '__main__':
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name='__main__')
