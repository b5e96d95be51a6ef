"""Embedding tables at click-log scale (issue 28): one training step through `Learner.fit` on Criteo-shaped rows held on the
GPU, bf16, LAMB for the dense layers, the tables stepped densely (today's: `ForeachLamb` + `ExcludeEmbeddings`) or row-sparsely
(`FastTabularModel(sparse=True)` + `SparseEmbedOpt`), at one width for every table and at fastai's rule; then one epoch of
each for its validation AUC. Ratios against the dense step at width 16 of the same run.

    python bench/bench_embeddings.py --rows 30000000 --bs 65536 --widths 16 128 0 --opts dense lazy-adam rowwise-adagrad
"""
import argparse, gc, sys, time
from functools import partial
from pathlib import Path
sys.path.insert(0, str(Path(__file__).parent))
from common import sync, report, learner_rate
import torch
from fastai.tabular.all import CategoryBlock, RocAucBinary, ProgressCallback
from fastai_gpu_tabular.data import synth_criteo, CRITEO_SCHEMA
from fastai_gpu_tabular.procs import Categorify, FillMissing, Normalize
from fastai_gpu_tabular.tabular import TabularGPU, RandomRowSplit
from fastai_gpu_tabular.learner import tabular_learner
from fastai_gpu_tabular.optimizer import ForeachLamb, ExcludeEmbeddings, SparseEmbedOpt

p = argparse.ArgumentParser()
p.add_argument('--rows', type=int, default=30_000_000)
p.add_argument('--cap', type=int, default=500_000, help='most distinct ids of a column')
p.add_argument('--bs', type=int, default=65536)
p.add_argument('--widths', type=int, nargs='+', default=[16, 128, 0], help="one width for every table; 0: fastai's rule")
p.add_argument('--opts', nargs='+', default=['dense', 'lazy-adam', 'rowwise-adagrad'], help="the tables' step")
p.add_argument('--lr', type=float, default=1e-2)
p.add_argument('--repeats', type=int, default=3)
p.add_argument('--steps', type=int, default=60, help='timed steps a repeat')
p.add_argument('--epoch', action='store_true', help='also one epoch of each for its validation AUC')
p.add_argument('--name', default='embeddings')
a = p.parse_args()

t = time.perf_counter()
to = TabularGPU(synth_criteo(a.rows, cap=a.cap, gpu=True), procs=[Categorify, FillMissing, Normalize], splits=RandomRowSplit(0.2, 42),
                y_block=CategoryBlock(), **CRITEO_SCHEMA)
dls = to.dataloaders(bs=a.bs, seed=0)
print(f'data: {time.perf_counter()-t:.1f} s, {len(to.train):,} training rows', flush=True)

def learner(width, opt):
    emb = None if width == 0 else {n: width for n in to.cat_names}
    if opt == 'dense':
        learn = tabular_learner(dls, layers=[512, 256], emb_szs=emb, opt_func=ForeachLamb, metrics=RocAucBinary(), cbs=ExcludeEmbeddings())
    else:
        learn = tabular_learner(dls, layers=[512, 256], emb_szs=emb, config=dict(sparse=True), metrics=RocAucBinary(),
                                opt_func=partial(SparseEmbedOpt, opt_func=ForeachLamb, rule=opt), cbs=ExcludeEmbeddings())
    learn.remove_cb(ProgressCallback)
    return learn.to_bf16()

rows, base = [], {}
for width in a.widths:
    for opt in a.opts:
        torch.cuda.empty_cache(); torch.cuda.reset_peak_memory_stats()
        learn = learner(width, opt)
        params = sum(p.numel() for p in learn.model.parameters())
        rate = learner_rate(learn, a.bs, a.steps*a.bs, a.repeats, lr=a.lr)[0]
        r = dict(width=width or 'fastai', opt=opt, params=f'{params/1e6:.1f}M', step_ms=round(a.bs/rate*1e3, 2), rows_s=f'{rate/1e6:.2f}M',
                 peak_gb=round(torch.cuda.max_memory_allocated()/1e9, 2))
        if (width, opt) == (16, 'dense'): base['dense16'] = r['step_ms']
        if a.epoch:
            learn = learner(width, opt)  # a new model: one epoch from the start
            sync(); t = time.perf_counter()
            learn.fit_one_cycle(1, a.lr)
            sync(); r.update(epoch_s=round(time.perf_counter()-t, 1), auc=round(float(learn.recorder.values[-1][-1]), 4))
        r['vs_dense16'] = round(r['step_ms']/base['dense16'], 2) if base.get('dense16') else ''
        same = next((o for o in rows if o['width'] == r['width'] and o['opt'] == 'dense'), None)
        r['speedup_vs_dense'] = round(same['step_ms']/r['step_ms'], 2) if same and opt != 'dense' else ''
        rows.append(r); print(r, flush=True)
        learn.pred = learn.loss = learn.loss_grad = learn.xb = learn.yb = learn.opt = learn.model = None  # the last graph, the state
        del learn; gc.collect(); torch.cuda.empty_cache()

report(a.name, rows, ['width', 'opt', 'params', 'step_ms', 'rows_s', 'vs_dense16', 'speedup_vs_dense', 'peak_gb', 'epoch_s', 'auc'],
       dict(bench='embeddings', n_rows=a.rows, cap=a.cap, bs=a.bs, lr=a.lr, layers=[512, 256], precision='bf16'))
