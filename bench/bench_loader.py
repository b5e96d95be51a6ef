"""Training throughput: stock fastai against TabularGPU + BatchDataLoader through `Learner.fit`, beside the plain loop.

    python bench/bench_loader.py --rows 25000000 --bs 65536 4096

For each batch size, on the benchmark schema (layers [512,256], fastai's embedding sizes, fastai's `Adam` with its
defaults, torch's default precision; progress bars off for both):
  (a) stock fastai: TabularPandas + TabDataLoader + Learner.fit, rows/s
  (b) ours: TabularGPU + BatchDataLoader + Learner.fit with the DeviceRecorder, rows/s (and with fastai's Recorder,
      and with multi-hot genres, which (a) has not)
  (c) the plain PyTorch loop of bench/roofline.py over the same model, data in device tensors, fastai's Adam
  (c') the same loop with torch's Adam (foreach), for reference
  (d) the loader alone over a full epoch (permutation and every gather), rows/s
Each rate is the median of `--repeats` timed runs of a fixed number of batches after warm-up batches, with the device
synchronised around the timed region. Also the peak device memory of (b) against the size of its tensors."""
import argparse, statistics, sys, time, warnings
from pathlib import Path
sys.path.insert(0, str(Path(__file__).parent))
from common import sync, report, learner_rate
from roofline import plain_loop
import torch
from fastai.tabular.all import (TabularPandas, Categorify as FCategorify, FillMissing as FFillMissing, Normalize as FNormalize,
                                CategoryBlock, TabularModel, get_emb_sz, Recorder)
from fastai.tabular.learner import tabular_learner as fai_tabular_learner
from fastai_gpu_tabular.backend import to_pandas, gpu_available
from fastai_gpu_tabular.procs import Categorify, FillMissing, Normalize
from fastai_gpu_tabular.tabular import TabularGPU
from fastai_gpu_tabular.learner import tabular_learner
from fastai_gpu_tabular.data import synth_movielens, BENCH_SCHEMA, BENCH_MH, synth_tabular
from fastai_gpu_tabular.tabular import random_splits

p = argparse.ArgumentParser()
p.add_argument('--rows', type=int, default=25_000_000)
p.add_argument('--bs', type=int, nargs='+', default=[65536, 4096])
p.add_argument('--repeats', type=int, default=5)
p.add_argument('--rows-timed', type=int, default=2_000_000, help='rows per timed run of ours and the plain loop')
p.add_argument('--fastai-rows-timed', type=int, default=300_000, help='rows per timed run of stock fastai')
p.add_argument('--name', default='loader', help='results file: bench/results/NAME.json')
a = p.parse_args()
assert gpu_available(), "this benchmark needs cuDF and a CUDA GPU"
LAYERS, WARM = [512, 256], 3

def fit_rate(learn, bs, rows): return learner_rate(learn, bs, rows, a.repeats, WARM)

df = synth_movielens(a.rows, gpu=True)
tr, va = random_splits(a.rows)
sched = {k: list(v) if isinstance(v, tuple) else v for k, v in BENCH_SCHEMA.items()}
print('building stock fastai TabularPandas ...', flush=True)
pdf = to_pandas(df.drop(columns=list(BENCH_MH)))
with warnings.catch_warnings():
    warnings.simplefilter('ignore')
    fto = TabularPandas(pdf, procs=[FCategorify, FFillMissing, FNormalize], splits=[tr.tolist(), va.tolist()], y_block=CategoryBlock(), **sched)
del pdf
dsp = random_splits(a.rows, like=df)
ours = synth_tabular(df.drop(columns=list(BENCH_MH)), splits=dsp)
ours_mh = synth_tabular(df, splits=dsp, mh=True)
del df

rows, meta = [], dict(bench='loader', n_rows=a.rows, layers=LAYERS, repeats=a.repeats)
for bs in a.bs:
    print(f'batch {bs}', flush=True)
    fdls = fto.dataloaders(bs=bs, device='cuda')
    fa, fts = fit_rate(fai_tabular_learner(fdls, layers=LAYERS), bs, a.fastai_rows_timed)
    del fdls
    dls = ours.dataloaders(bs=bs, seed=0)
    t = dls.train.tensors()
    data_bytes = sum(x.numel() * x.element_size() for x in (t.cats, t.conts, t.ys))
    learn = tabular_learner(dls, layers=LAYERS)
    torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats()
    ob, ots = fit_rate(learn, bs, a.rows_timed)
    peak = torch.cuda.max_memory_allocated()
    learn.remove_cb(learn.recorder); learn.add_cb(Recorder())
    ob_fai_rec, _ = fit_rate(learn, bs, a.rows_timed)  # the same with fastai's Recorder (a host sync per batch)
    model = TabularModel(get_emb_sz(ours.train), len(ours.cont_names), 2, LAYERS).cuda()
    pl = statistics.median(plain_loop(model, t.cats, t.conts, t.ys, bs, max(3, a.rows_timed // bs)) for _ in range(a.repeats))
    pl_torch = statistics.median(plain_loop(model, t.cats, t.conts, t.ys, bs, max(3, a.rows_timed // bs), opt_func=torch.optim.Adam)
                                 for _ in range(a.repeats))
    ld = []
    for _ in range(a.repeats):
        sync(); t0 = time.perf_counter()
        for b in dls.train: pass
        sync(); ld.append(len(dls.train) * bs / (time.perf_counter() - t0))
    mh_rate, _ = fit_rate(tabular_learner(ours_mh.dataloaders(bs=bs, seed=0), layers=LAYERS), bs, a.rows_timed)
    rows.append(dict(bs=bs, fastai_rows_s=round(fa), ours_rows_s=round(ob), plain_loop_rows_s=round(pl), plain_loop_torch_adam_rows_s=round(pl_torch),
                     ours_fastai_recorder_rows_s=round(ob_fai_rec), ours_over_fastai=round(ob / fa, 2), ours_over_plain=round(ob / pl, 3), loader_only_rows_s=round(statistics.median(ld)),
                     ours_multi_hot_rows_s=round(mh_rate), peak_mem_gib=round(peak / 2**30, 2), data_gib=round(data_bytes / 2**30, 2),
                     fastai_times=[round(x, 4) for x in fts], ours_times=[round(x, 4) for x in ots]))
    print(rows[-1], flush=True)
    del dls, learn, model
print(f"\ntraining throughput on {a.rows:,} rows, layers {LAYERS}, fastai's Adam, fp32")
report(a.name, rows, ['bs', 'fastai_rows_s', 'ours_rows_s', 'ours_fastai_recorder_rows_s', 'plain_loop_rows_s', 'plain_loop_torch_adam_rows_s', 'ours_over_fastai', 'ours_over_plain',
                        'loader_only_rows_s', 'ours_multi_hot_rows_s', 'peak_mem_gib', 'data_gib'], meta)
