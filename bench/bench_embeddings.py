"""Embedding tables at click-log scale (issue 28): one training step through `Learner.fit` on Criteo-shaped rows held on the
GPU, bf16, LAMB for the dense layers, the tables stepped densely (today's: `ForeachLamb` + `ExcludeEmbeddings`) or row-sparsely
(`FastTabularModel(sparse=True)` + `SparseEmbedOpt`), at one width for every table and at fastai's rule; with `--graphs 0 1` each
also with `CudaGraph` (its speed-up over the same configuration without, same run); with `--epoch` one epoch of each from
scratch for its validation AUC; with `--profile` the torch profiler's busiest kernels and host ops.
Each configuration runs in its own process (a learner's memory is not all returned within one); ratios against the dense
step at width 16 of the same run.

    python bench/bench_embeddings.py --rows 30000000 --bs 65536 --widths 16 128 0 --opts dense lazy-adam rowwise-adagrad --epoch
"""
import argparse, gc, json, os, subprocess, sys, tempfile, time
from functools import partial
from pathlib import Path
sys.path.insert(0, str(Path(__file__).parent))
from common import sync, report, learner_rate

p = argparse.ArgumentParser()
p.add_argument('--rows', type=int, default=30_000_000)
p.add_argument('--cap', type=int, default=500_000, help='most distinct ids of a column')
p.add_argument('--bs', type=int, default=65536)
p.add_argument('--widths', type=int, nargs='+', default=[16, 128, 0], help="one width for every table; 0: fastai's rule")
p.add_argument('--opts', nargs='+', default=['dense', 'lazy-adam', 'rowwise-adagrad'], help="the tables' step")
p.add_argument('--lr', type=float, default=1e-2)
p.add_argument('--freq-threshold', type=int, nargs='+', default=[0], help="`Categorify`'s: ids seen fewer times share one code; a row each")
p.add_argument('--graphs', type=int, nargs='+', default=[0], help="1: with `CudaGraph` (the forward and backward replayed), 0: without")
p.add_argument('--repeats', type=int, default=3)
p.add_argument('--steps', type=int, default=60, help='timed steps a repeat')
p.add_argument('--epoch', action='store_true', help='also one epoch of each for its validation AUC')
p.add_argument('--profile', action='store_true', help="print the torch profiler's table of 20 steps of each")
p.add_argument('--name', default='embeddings')
p.add_argument('--one-out', default=None, help=argparse.SUPPRESS)  # internal: run one configuration, write its row here
a = p.parse_args()

def one(width, opt, threshold=0, graph=0):
    "Measure one configuration in this process: its row of the table"
    import torch
    from fastai.tabular.all import CategoryBlock, RocAucBinary, ProgressCallback
    from fastai_gpu_tabular.data import synth_criteo, CRITEO_SCHEMA, categorify
    from fastai_gpu_tabular.procs import Categorify, FillMissing, Normalize
    from fastai_gpu_tabular.tabular import TabularGPU, RandomRowSplit
    from fastai_gpu_tabular.learner import tabular_learner
    from fastai_gpu_tabular.optimizer import ForeachLamb, ExcludeEmbeddings, SparseEmbedOpt
    from fastai_gpu_tabular.graph import CudaGraph
    cat = categorify(str(threshold), None, CRITEO_SCHEMA['cat_names']) if threshold else Categorify
    to = TabularGPU(synth_criteo(a.rows, cap=a.cap, gpu=True), procs=[cat, FillMissing, Normalize],
                    splits=RandomRowSplit(0.2, 42), y_block=CategoryBlock(), **CRITEO_SCHEMA)
    dls = to.dataloaders(bs=a.bs, seed=0)
    def learner():
        emb = None if width == 0 else {n: width for n in to.cat_names}
        kw = dict(opt_func=ForeachLamb) if opt == 'dense' else dict(config=dict(sparse=True),
                                                                     opt_func=partial(SparseEmbedOpt, opt_func=ForeachLamb, rule=opt))
        learn = tabular_learner(dls, layers=[512, 256], emb_szs=emb, metrics=RocAucBinary(),
                                cbs=[ExcludeEmbeddings()] + ([CudaGraph()] if graph else []), **kw)
        learn.remove_cb(ProgressCallback)
        return learn.to_bf16()
    torch.cuda.reset_peak_memory_stats()
    learn = learner()
    params = sum(p.numel() for p in learn.model.parameters())
    rate = learner_rate(learn, a.bs, a.steps*a.bs, a.repeats, lr=a.lr)[0]
    r = dict(width=width or 'fastai', opt=opt, threshold=threshold, graph=graph, params=f'{params/1e6:.1f}M', step_ms=round(a.bs/rate*1e3, 2),
             rows_s=f'{rate/1e6:.2f}M',
             peak_gb=round(torch.cuda.max_memory_allocated()/1e9, 2))
    if a.profile:
        from torch.profiler import profile, ProfilerActivity
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof: learner_rate(learn, a.bs, 20*a.bs, 1, lr=a.lr)
        ev = prof.key_averages()
        print(f'--- {r["width"]} {opt}: busiest kernels, then host ops')
        print(ev.table(sort_by='self_cuda_time_total', row_limit=14, max_name_column_width=70))
        print(ev.table(sort_by='self_cpu_time_total', row_limit=14, max_name_column_width=70))
    if a.epoch:
        learn = None; gc.collect(); torch.cuda.empty_cache()  # the timed model's memory back before the next is built
        learn = learner()  # a new model: one epoch from the start
        sync(); t = time.perf_counter()
        learn.fit_one_cycle(1, a.lr)
        sync(); r.update(epoch_s=round(time.perf_counter()-t, 1), auc=round(float(learn.recorder.values[-1][-1]), 4))
    return r

if a.one_out:
    Path(a.one_out).write_text(json.dumps(one(a.widths[0], a.opts[0], a.freq_threshold[0], a.graphs[0])))
    sys.exit()

rows = []
for width, opt, ft, gr in [(w, o, t, g) for w in a.widths for o in a.opts for t in a.freq_threshold for g in a.graphs]:
    with tempfile.TemporaryDirectory() as d:
        cmd = [sys.executable, __file__, *sys.argv[1:], '--widths', str(width), '--opts', opt, '--freq-threshold', str(ft),
               '--graphs', str(gr), '--one-out', f'{d}/row.json']
        res = subprocess.run(cmd, capture_output=not a.profile, text=True)
        if res.returncode: print(f'{width} {opt} {ft} {gr} failed:\n' + (res.stderr or '')[-3000:], flush=True); continue
        r = json.loads(Path(f'{d}/row.json').read_text())
    dense16 = next((o['step_ms'] for o in rows + [r] if (o['width'], o['opt'], o['threshold'], o['graph']) == (16, 'dense', 0, 0)), None)
    same = next((o['step_ms'] for o in rows if (o['width'], o['threshold'], o['opt'], o['graph']) == (r['width'], ft, 'dense', gr)), None)
    eager = next((o['step_ms'] for o in rows if (o['width'], o['threshold'], o['opt'], o['graph']) == (r['width'], ft, opt, 0)), None)
    r.update(vs_dense16=round(r['step_ms']/dense16, 2) if dense16 else '',
             speedup_vs_dense=round(same/r['step_ms'], 2) if same and opt != 'dense' else '',
             graph_speedup=round(eager/r['step_ms'], 2) if eager and gr else '')
    rows.append(r); print(r, flush=True)

report(a.name, rows, ['width', 'opt', 'threshold', 'graph', 'params', 'step_ms', 'rows_s', 'vs_dense16', 'speedup_vs_dense',
                      'graph_speedup', 'peak_gb',
                      'epoch_s', 'auc'],
       dict(bench='embeddings', n_rows=a.rows, cap=a.cap, bs=a.bs, lr=a.lr, layers=[512, 256], precision='bf16'))
