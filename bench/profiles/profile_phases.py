"""Where `fgt-train`'s wall goes before its first training batch: every thread's Python stack each `--every` ms from the process's
start (the imports too) to the end of its first `--batches` training batches, cut at the run's marks (the imports' end, each
`Phases.lap`, `CudaGraph`'s warm, `before_train`, the batches). For each span: its seconds, each thread's innermost frames by
count, and the sampler's pauses over 3x `--every` (a thread holding the GIL, or the process stopped: their sum and the frames the
main thread was in). `spans.txt` and `spans.json` in `--log`.

    python bench/profiles/profile_phases.py --log /tmp/phases -- --data <processed folder> --epochs 1"""
import argparse, json, sys, threading, time, traceback
from collections import Counter
from pathlib import Path
p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument('--log', default='/tmp/profile_phases')
p.add_argument('--every', type=float, default=5, help="ms between samples")
p.add_argument('--depth', type=int, default=4, help="frames a stack keeps (innermost first)")
p.add_argument('--top', type=int, default=6, help="stacks a thread shows a span")
p.add_argument('--batches', type=int, default=20, help="training batches sampled, then the sampler stops (the run goes on)")
a, rest = p.parse_known_args()
rest = [o for o in rest if o != '--']
T0, samples, marks, me = time.perf_counter(), [], [('start', time.perf_counter())], None

def mark(name): marks.append((name, time.perf_counter()))

def where(f) -> str:
    return ' < '.join(f'{Path(x.filename).name}:{x.lineno} {x.name}' for x in reversed(traceback.extract_stack(f)[-a.depth:]))

def sample():
    while not done.is_set():
        t, names = time.perf_counter(), {th.ident: th.name for th in threading.enumerate()}
        samples.append((t, {names.get(i, str(i)): where(f) for i, f in sys._current_frames().items() if i != me}))
        time.sleep(a.every / 1e3)

done = threading.Event()
th = threading.Thread(target=sample, daemon=True, name='sampler'); th.start(); me = th.ident
import fastai_gpu_tabular.train as T  # torch, fastai, the library: the imports' span
from fastai.callback.core import Callback
from fastai_gpu_tabular.graph import CudaGraph
mark('imports')
lap = T.Phases.lap
def _lap(self, name): lap(self, name); mark(name)
T.Phases.lap = _lap
ahead = CudaGraph._warm_ahead
def _ahead(self): mark('fit setup'); ahead(self); mark('warm')
CudaGraph._warm_ahead = _ahead

class FirstBatches(Callback):
    "Marks `before_train` and each training batch's start, then stops the sampler"
    order = 100
    def before_train(self):
        if not done.is_set(): mark('fit to before_train')
    def before_batch(self):
        if not self.training or done.is_set(): return
        if self.train_iter: mark(f'batch {self.train_iter - 1}')
        if self.train_iter == a.batches: done.set(); report()
_fit = T.fit_step
def _fit_step(learn, *args, **kw): learn.add_cb(FirstBatches()); return _fit(learn, *args, **kw)
T.fit_step = _fit_step

def report():
    spans, lines = [], []
    for (n0, t0), (n1, t1) in zip(marks, marks[1:]):
        ss = [(t, st) for t, st in samples if t0 <= t < t1]
        gaps = [(u - t, st) for (t, _), (u, st) in zip(ss, ss[1:]) if u - t > 3 * a.every / 1e3]
        threads = {}
        for _, st in ss:
            for k, v in st.items(): threads.setdefault(k, Counter())[v] += 1
        spans.append(dict(span=n1, s=t1 - t0, at=t0 - T0, samples=len(ss), paused_s=sum(g for g, _ in gaps),
                          threads={k: c.most_common(a.top) for k, c in threads.items()},
                          paused_in=Counter(st.get('MainThread', '?') for _, st in gaps).most_common(a.top)))
    for s in spans:
        lines.append(f"\n## {s['span']}: {s['s']:.3f} s (from {s['at']:.2f} s; {s['samples']} samples; the sampler paused {s['paused_s']:.3f} s)")
        for k, c in s['threads'].items():
            lines.append(f"  [{k}]"); lines += [f"    {n:4d}  {v}" for v, n in c]
        if s['paused_in']: lines.append('  paused while MainThread in:'); lines += [f"    {n:4d}  {v}" for v, n in s['paused_in']]
    log = Path(a.log); log.mkdir(parents=True, exist_ok=True)
    (log / 'spans.txt').write_text('\n'.join(lines)); (log / 'spans.json').write_text(json.dumps(spans, indent=1))
    print('\n'.join(f"{s['span']:24s} {s['s']:7.3f} s  paused {s['paused_s']:.3f}" for s in spans), flush=True)

if __name__ == '__main__':
    sys.argv = [sys.argv[0]] + rest
    T.main()
