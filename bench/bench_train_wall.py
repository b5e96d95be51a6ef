"""`fgt-train`'s wall time against its training phase (issue 27's target: <= 1.5x). Each version of the package runs the same
command in a fresh process, timed from before its start to after its exit: interpreter start, imports, `main` (its phases from
metrics.json, and what no phase holds), and the exit (`atexit` handlers, then the interpreter's and CUDA's teardown; the threads
alive when `main` returned). Versions alternate, each run on a fresh `--out`.

    python bench/bench_train_wall.py --data /tmp/processed --ref /tmp/old --repeats 2 -- --epochs 1 --precision bf16 --bs 65536

`--ref` is a folder holding another `fastai_gpu_tabular` package (an earlier commit's, say): the baseline of the same run.
`--lr-find` adds each version's run without the flags' `--lr`: `lr_find`'s cost is its wall time less the run's with `--lr`."""
import argparse, json, os, shutil, subprocess, sys, tempfile, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).parent))
from common import report

DRIVER = """import atexit, json, sys, threading, time; t0 = time.time()
atexit.register(lambda: print('FGT_ATEXIT_END', time.time(), flush=True))  # registered first: the last exit handler
if '--freeze' in sys.argv: import gc; sys.argv.remove('--freeze'); atexit.register(gc.freeze)  # the collector's last passes skipped
from fastcore.script import anno_parser
import fastai_gpu_tabular.train as t
t1 = time.time()
a = anno_parser(t.main).parse_args().__dict__
t.main(**{k: v for k, v in a.items() if k not in ('pdb', 'xtra')})
atexit.register(lambda: print('FGT_ATEXIT_START', time.time(), flush=True))
print('FGT_WALL', json.dumps(dict(start=t0, imported=t1, returned=time.time(), file=t.__file__,
                                   threads=sorted(o.name for o in threading.enumerate()))), flush=True)"""

def run(root, data, flags, freeze=False):
    "One fgt-train process with package folder `root` first on the path: its timeline (seconds) and metrics.json"
    out = tempfile.mkdtemp(prefix='fgt_wall_')
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ.get('PYTHONPATH', '')]))
    t = time.time()
    data = str(Path(data).resolve()) if Path(data).exists() else data  # a folder or file, or a built-in: 'movielens'
    r = subprocess.run([sys.executable, '-c', DRIVER, '--data', data, '--out', out, *flags, *(['--freeze'] if freeze else [])], env=env, cwd=root,
                       capture_output=True, text=True)  # `-c` puts the working folder first on the path: `root`
    end = time.time()
    if r.returncode: sys.exit(f'fgt-train failed ({root}):\n{r.stderr[-4000:]}')
    line = lambda k: next(l for l in r.stdout.splitlines() if l.startswith(k))[len(k):]
    w = json.loads(line('FGT_WALL')); at0,at1 = float(line('FGT_ATEXIT_START')),float(line('FGT_ATEXIT_END'))
    if not Path(w['file']).resolve().is_relative_to(Path(root).resolve()): sys.exit(f"ran {w['file']}, not the package in {root}")
    m = json.loads((Path(out)/'metrics.json').read_text()); shutil.rmtree(out, ignore_errors=True)
    ph = m['phases_s']
    return dict(wall=end-t, start=w['start']-t, imports=w['imported']-w['start'], main=w['returned']-w['imported'],
                exit=end-w['returned'], atexit=at1-at0, teardown=end-at1, threads=len(w['threads']), phases=ph, package=w['file'], auc=m.get('roc_auc_score'), train_rows_s=m.get('train_rows_s'),
                metrics=m)

if __name__ == '__main__':
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--data', required=True, help='a processed folder (fgt-prep)')
    p.add_argument('--ref', default=None, help='a folder holding the baseline `fastai_gpu_tabular` package')
    p.add_argument('--repeats', type=int, default=1)
    p.add_argument('--freeze', action='store_true', help="also this tree with `gc.freeze()` at exit (version 'this+freeze')")
    p.add_argument('--lr-find', action='store_true', help="each version also without the flags' `--lr` ('<version>+lr_find')")
    p.add_argument('--name', default='train_wall')
    p.add_argument('flags', nargs='*', help="fgt-train's flags, after `--`")
    a = p.parse_args()
    here = Path(__file__).resolve().parents[1]
    versions = ([('ref', Path(a.ref).resolve())] if a.ref else []) + [('this', here)] + ([('this+freeze', here)] if a.freeze else [])
    if a.lr_find: versions = [(label+v, root) for label, root in versions for v in ('', '+lr_find')]
    rows = []
    for i in range(a.repeats):
        for label, root in versions:
            fl = [f for j, f in enumerate(a.flags) if not label.endswith('+lr_find') or '--lr' not in a.flags[max(j-1, 0):j+1]]
            r = run(root, a.data, fl, 'freeze' in label); ph = r.pop('phases'); r.pop('metrics')
            row = dict(version=label, run=i, threads=r['threads'],
                       **{k: round(v, 2) for k, v in r.items() if isinstance(v, float) and k not in ('auc',)},
                       **{f'{k}_s': round(v, 2) for k, v in ph.items()}, auc=r['auc'], package=r['package'])
            row.update(outside=round(row['main'] - sum(ph.values()), 2), wall_over_train=round(r['wall']/ph['train'], 3),
                       phases_over_train=round(sum(ph.values())/ph['train'], 3))
            if label.endswith('+lr_find'):  # against the same version's run with `--lr` just before
                base = rows[-1]; row.update(lr_find_cost=round(row['wall']-base['wall'], 2), cost_over_train=round((row['wall']-base['wall'])/base['train_s'], 3))
            rows.append(row); print(json.dumps(row), flush=True)
    ph = {k: 0 for r in rows for k in r if k.endswith('_s')}
    cols = ['version', 'run', 'wall', 'start', 'imports', 'main', 'outside', 'exit', 'atexit', 'teardown', 'threads', *ph, 'wall_over_train',
            'phases_over_train'] + (['lr_find_cost', 'cost_over_train'] if a.lr_find else [])
    report(a.name, rows, cols, dict(bench='train_wall', data=a.data, flags=a.flags, repeats=a.repeats))
