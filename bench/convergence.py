"""Convergence at large batches: validation AUC over seeds (mean ± std), and LAMB's loss against steps per batch size.

    python bench/convergence.py synth --rows 22500000 --seeds 5     # a GPU: batch 4,096 Adam against 204,800 LAMB, and curves
    python bench/convergence.py movielens --seeds 5                  # CPU or GPU: batch 256 Adam against 8,192 LAMB

Every run builds a fresh `tabular_learner` (layers [512,256] on synth, [200,100] on MovieLens) with `set_seed(seed)`
and a loader seeded by `seed` (the data and split stay fixed), trains with `fit_one_cycle` (Adam at `lr`) or
`fit_large_batch` (our LAMB at `large_batch_lr(bs, base_lr, base_bs)`, sqrt rule, with or without `ExcludeEmbeddings`)
for the stated epochs, and reports
the validation AUC. Each setting's rate is picked from its candidates by seed 0's validation AUC (a sweep, reported),
then seeds 1.. run at that rate (seed 0's sweep run counts as seed 0); both optimizers run in this process, each choosing
among six rates. The comparison passes when LAMB's mean AUC is within 0.5% of Adam's and the difference of the
means is within two standard errors. Results go to bench/results/convergence_{synth,movielens}.json with the commit;
`synth` also writes the smoothed training loss of one LAMB run per batch size to bench/results/lamb_curves.json."""
import argparse, json, statistics, sys, time, math
from pathlib import Path
sys.path.insert(0, str(Path(__file__).parent))
from common import report
import torch
from fastai.tabular.all import CategoryBlock, RocAucBinary, Adam, ProgressCallback, set_seed
from fastai_gpu_tabular.backend import gpu_available
from fastai_gpu_tabular.procs import Categorify, FillMissing, Normalize
from fastai_gpu_tabular.tabular import TabularGPU
from fastai_gpu_tabular.learner import tabular_learner
from fastai_gpu_tabular.optimizer import ForeachLamb, ExcludeEmbeddings, large_batch_lr
from fastai_gpu_tabular.data import synth_movielens, movielens_sample, movielens_tabular, synth_tabular
from fastai_gpu_tabular.tabular import random_splits

LAMB_CANDIDATES = [(lr, excl) for excl in (False, True) for lr in (2e-3, 5e-3, 1e-2)]  # (base lr, ExcludeEmbeddings)
ADAM_CANDIDATES = [5e-4, 1e-3, 2e-3, 3e-3, 5e-3, 1e-2]  # as many rates as LAMB's candidates: neither side better tuned
SETTINGS = dict(  # (bs, optimizer, epochs, candidate lrs for Adam or (base lr, exclude embeddings) for LAMB); weight decay 0.01 for both
    synth=dict(layers=[512, 256], base_bs=4096, runs=[(4096, 'Adam', 1, ADAM_CANDIDATES), (204_800, 'LAMB', 1, LAMB_CANDIDATES)],
               curves=[4096, 16_384, 65_536, 204_800, 262_144]),
    movielens=dict(layers=[200, 100], base_bs=256, runs=[(256, 'Adam', 4, ADAM_CANDIDATES), (8192, 'LAMB', 4, LAMB_CANDIDATES)], curves=[]))

p = argparse.ArgumentParser()
p.add_argument('data', choices=list(SETTINGS))
p.add_argument('--rows', type=int, default=22_500_000, help='synthetic rows (90% train)')
p.add_argument('--seeds', type=int, default=5)
p.add_argument('--lamb-epochs', type=int, default=None, help="epochs of the LAMB runs (default: the setting's)")
a = p.parse_args()
S = SETTINGS[a.data]
gpu = gpu_available()
t0 = time.perf_counter()
if a.data == 'synth':
    df = synth_movielens(a.rows, gpu=gpu)
    to = synth_tabular(df, splits=random_splits(a.rows, valid_pct=0.1, like=df))
    del df
else: to = movielens_tabular(movielens_sample(gpu))
print(f'{a.data}: {len(to.train):,} training rows, {len(to.valid):,} validation rows, built in {time.perf_counter()-t0:.1f}s', flush=True)

def train(bs, opt, epochs, lr, seed):
    "Validation AUC, seconds, and the learner of one run"
    set_seed(seed)
    learn = tabular_learner(to.dataloaders(bs=bs, seed=seed, device=None if gpu else 'cpu'), layers=S['layers'],
                            opt_func=ForeachLamb if opt == 'LAMB' else Adam, metrics=RocAucBinary(), wd=0.01)
    learn.remove_cb(ProgressCallback)
    t = time.perf_counter()
    with learn.no_logging():
        if opt == 'LAMB': learn.fit_large_batch(epochs, base_lr=lr[0], base_bs=S['base_bs'], cbs=ExcludeEmbeddings() if lr[1] else None)
        else: learn.fit_one_cycle(epochs, lr)
    return learn.recorder.values[-1][-1], time.perf_counter() - t, learn

rows, runs = [], {}
best_lr = {}
for bs, opt, epochs, lrs in S['runs']:
    if opt == 'LAMB' and a.lamb_epochs: epochs = a.lamb_epochs
    sweep = {lr: train(bs, opt, epochs, lr, 0)[:2] for lr in lrs}
    for lr, (auc, s) in sweep.items(): print(f'sweep bs {bs} {opt} lr {lr}: AUC {auc:.4f} in {s:.1f}s', flush=True)
    lr = best_lr[opt] = max(sweep, key=lambda k: sweep[k][0])
    aucs, secs = [sweep[lr][0]], [sweep[lr][1]]
    for seed in range(1, a.seeds):
        auc, s, _ = train(bs, opt, epochs, lr, seed)
        aucs.append(auc); secs.append(s)
        print(f'bs {bs} {opt} lr {lr} seed {seed}: AUC {auc:.4f} in {s:.1f}s', flush=True)
    lr_max = large_batch_lr(bs, lr[0], S['base_bs']) if opt == 'LAMB' else lr
    runs[opt] = aucs
    rows.append(dict(bs=bs, optimizer=opt, epochs=epochs, lr=lr[0] if opt == 'LAMB' else lr, exclude_embeddings=lr[1] if opt == 'LAMB' else '', lr_max=round(lr_max, 5), seeds=a.seeds, auc_mean=round(statistics.mean(aucs), 5),
                     auc_std=round(statistics.stdev(aucs), 5), s_per_run=round(statistics.mean(secs), 1), aucs=[round(x, 5) for x in aucs],
                     sweep={str(k): round(v[0], 5) for k, v in sweep.items()}))
ma, mb = statistics.mean(runs['Adam']), statistics.mean(runs['LAMB'])
se = math.sqrt(statistics.variance(runs['Adam'])/a.seeds + statistics.variance(runs['LAMB'])/a.seeds)
verdict = dict(lamb_minus_adam=round(mb - ma, 5), relative=round((mb - ma)/ma, 5), two_std_errors=round(2*se, 5),
               within_half_percent=abs(mb - ma) <= 0.005*ma, within_two_std_errors=abs(mb - ma) <= 2*se)
print(f"\nvalidation AUC on {a.data}, {a.seeds} seeds per setting")
report(f'convergence_{a.data}' + (f'_lamb_{a.lamb_epochs}_epochs' if a.lamb_epochs else ''), rows, ['bs', 'optimizer', 'epochs', 'lr', 'exclude_embeddings', 'lr_max', 'seeds', 'auc_mean', 'auc_std', 's_per_run'],
       dict(bench='convergence', data=a.data, n_train=len(to.train), n_valid=len(to.valid), layers=S['layers'], base_bs=S['base_bs'], **verdict))
print(verdict)

curves = []
for bs in S['curves']:
    auc, s, learn = train(bs, 'LAMB', 1, best_lr['LAMB'], 0)
    ls = torch.stack(learn.recorder.losses).tolist()
    every = max(1, len(ls)//400)
    curves.append(dict(bs=bs, steps=len(ls), lr_max=round(large_batch_lr(bs, best_lr['LAMB'][0], S['base_bs']), 5), exclude_embeddings=best_lr['LAMB'][1], auc=round(auc, 5), seconds=round(s, 1),
                       step=list(range(0, len(ls), every)), loss=[round(x, 5) for x in ls[::every]]))
    print(f'curve bs {bs}: {len(ls)} steps, AUC {auc:.4f}, {s:.1f}s', flush=True)
    del learn
if curves:
    report('lamb_curves', curves, ['bs', 'steps', 'lr_max', 'auc', 'seconds'], dict(bench='lamb_curves', n_train=len(to.train), layers=S['layers'], base_bs=S['base_bs']))
