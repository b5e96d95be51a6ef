"""The README's click-log flow in Python without knobs (`tabular_learner(dls)`, `fit_one_cycle(1)`) against `fgt-train`'s defaults on
the same processed folder and card, each in a fresh process, alternated (issue 82's target: training rows/s >= 0.9x, AUC within
0.002). Both train fgt-train's model (`--layers 512,256`) at its batch size (`auto_bs`); round 0 is the machine's first run of each.

    python bench/bench_python_flow.py --data /tmp/crp --rounds 3 --name python_flow_criteo_h100"""
import argparse, json, statistics, subprocess, sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).parent))
from common import report, run

def python_flow(data:str)->dict:
    "One fresh process: `from_processed`, `tabular_learner(dls, layers=[512,256], metrics=...)`, `fit_one_cycle(1)`; what it measured"
    code = f"""
import json, time
t0 = time.time()
from fastai_gpu_tabular.all import *
from fastai_gpu_tabular.train import TrainTimer, auto_bs
from fastai_gpu_tabular.stream import read_dataset_info
bs = auto_bs(read_dataset_info({data!r})[2]['train']['rows'])
dls = TabularDataLoaders.from_processed({data!r}, bs=bs)
learn = tabular_learner(dls, layers=[512, 256], metrics=[accuracy, RocAucBinary()])
timer = TrainTimer()
with learn.no_bar(): learn.fit_one_cycle(1, cbs=[timer])
v = learn.recorder.values[-1]
print('FGT_PY ' + json.dumps(dict(train_rows_s=timer.batches*bs/timer.seconds, train_s=timer.seconds, auc=float(v[3]), bs=bs,
                                  lr=float(learn.lr), sparse=bool(getattr(learn.model, 'sparse', False)), wall_in=time.time()-t0)))
"""
    t = time.time()
    r = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, cwd=Path(__file__).parents[1])
    if r.returncode: sys.exit(f'the Python flow failed:\n{r.stderr[-4000:]}')
    res = json.loads(next(l for l in r.stdout.splitlines() if l.startswith('FGT_PY '))[7:])
    res['said'] = next((l for l in r.stdout.splitlines() if l.startswith('tabular_learner:')), '')
    return dict(res, wall=time.time() - t)

if __name__ == '__main__':
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--data', required=True, help='a processed folder (fgt-prep)')
    p.add_argument('--rounds', type=int, default=3)
    p.add_argument('--name', default='python_flow')
    a = p.parse_args()
    here, rows = Path(__file__).resolve().parents[1], []
    for i in range(a.rounds):
        for flow in (('fgt-train', 'python') if i % 2 == 0 else ('python', 'fgt-train')):
            if flow == 'fgt-train':
                r = run(here, a.data, ['--epochs', '1'])
                row = dict(flow=flow, round=i, train_rows_s=round(r['train_rows_s']), train_s=round(r['phases']['train'], 2),
                           auc=round(r['auc'], 4), wall=round(r['wall'], 1), said=str(r['metrics'].get('defaults')))
            else:
                r = python_flow(a.data)
                row = dict(flow=flow, round=i, train_rows_s=round(r['train_rows_s']), train_s=round(r['train_s'], 2),
                           auc=round(r['auc'], 4), wall=round(r['wall'], 1), said=r['said'])
            rows.append(row); print(json.dumps(row), flush=True)
    for i in range(a.rounds):
        f, py = [next(r for r in rows if r['round'] == i and r['flow'] == k) for k in ('fgt-train', 'python')]
        py['rate_over_fgt_train'], py['auc_minus_fgt_train'] = round(py['train_rows_s']/f['train_rows_s'], 3), round(py['auc'] - f['auc'], 4)
    warm = [r['rate_over_fgt_train'] for r in rows if r['flow'] == 'python' and r['round'] > 0]
    summary = dict(first_round=next(r['rate_over_fgt_train'] for r in rows if r['flow'] == 'python' and r['round'] == 0),
                   warm_median=statistics.median(warm) if warm else None)
    print('python / fgt-train training rows/s:', summary)
    report(a.name, rows, ['flow', 'round', 'train_rows_s', 'train_s', 'auc', 'wall', 'rate_over_fgt_train', 'auc_minus_fgt_train'],
           dict(bench='python_flow', data=a.data, rounds=a.rounds, summary=summary))
