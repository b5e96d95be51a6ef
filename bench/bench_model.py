"""The model at the GPU's speed: fastai's TabularModel against FastTabularModel through `Learner.fit`, beside the plain loop.

    python bench/bench_model.py --rows 25000000 --bs 65536 262144

On the benchmark schema (MovieLens-25M shaped: embeddings 600, 600, 10, 3 and 2 continuous columns with `bn_cont`;
layers [512,256] with BatchNorm), bf16 (fastai's `to_bf16`), torch's fused Adam (through fastai's `OptimWrapper` in the
Learner), the TabularGPU + BatchDataLoader data, progress bars off, for each batch size:
  (a) fastai's TabularModel through Learner.fit (`tabular_learner(..., fast=False)`), rows/s
  (b) FastTabularModel through Learner.fit (`tabular_learner(...)`), rows/s
  (c) the plain PyTorch loop of bench/roofline.py over FastTabularModel: data in device tensors, bf16 autocast, fused Adam
  (d) the same plain loop over fastai's TabularModel, for reference
Targets (issue 6, one H200): (b) >= 0.9 x (c), and (b) >= 1.6 x (a). Each rate is the median of `--repeats` timed runs.
Then a kernel profile of a few Learner batches of (a) and (b) at each batch size: the largest kernels' share of GPU time."""
import argparse, statistics, sys
from functools import partial
from pathlib import Path
sys.path.insert(0, str(Path(__file__).parent))
from common import report, learner_rate
from roofline import plain_loop
import torch
from fastai.tabular.all import CategoryBlock, OptimWrapper, ProgressCallback, Callback, CancelFitException, set_seed
from fastai_gpu_tabular.backend import gpu_available
from fastai_gpu_tabular.procs import Categorify, FillMissing, Normalize
from fastai_gpu_tabular.tabular import TabularGPU
from fastai_gpu_tabular.learner import tabular_learner
from fastai_gpu_tabular.data import synth_movielens, synth_tabular
from fastai_gpu_tabular.tabular import random_splits

p = argparse.ArgumentParser()
p.add_argument('--rows', type=int, default=25_000_000)
p.add_argument('--bs', type=int, nargs='+', default=[65536, 262144])
p.add_argument('--repeats', type=int, default=5)
p.add_argument('--rows-timed', type=int, default=8_000_000, help='rows per timed run')
p.add_argument('--profile-batches', type=int, default=10)
p.add_argument('--name', default='model', help='results file: bench/results/NAME.json')
a = p.parse_args()
assert gpu_available(), "this benchmark needs cuDF and a CUDA GPU"
LAYERS, WARM = [512, 256], 3
fused_adam = partial(OptimWrapper, opt=partial(torch.optim.Adam, fused=True))

class Profile(Callback):
    "Profile the CUDA kernels of training batches `warm` to `warm+n`, then stop the fit"
    order = 99
    def __init__(self, warm, n): self.warm, self.n, self.prof = warm, n, None
    def before_batch(self):
        if self.training and self.iter == self.warm:
            from torch.profiler import profile, ProfilerActivity
            torch.cuda.synchronize(); self.prof = profile(activities=[ProfilerActivity.CUDA]); self.prof.start()
    def after_batch(self):
        if self.training and self.iter == self.warm + self.n - 1:
            torch.cuda.synchronize(); self.prof.stop(); raise CancelFitException()

def kernel_profile(learn, bs, n, top=8):
    "The `top` CUDA kernels of `n` Learner batches: (name, share of GPU time %, us a batch), and the GPU ms a batch"
    cb = Profile(WARM, n)
    learn.fit(1, 1e-3, cbs=cb)
    ks = [e for e in cb.prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA and e.self_device_time_total > 0]
    tot = sum(e.self_device_time_total for e in ks)
    ks = sorted(ks, key=lambda e: -e.self_device_time_total)[:top]
    return [(e.key[:90], round(100*e.self_device_time_total/tot, 1), round(e.self_device_time_total/n)) for e in ks], tot/n/1e3

df = synth_movielens(a.rows, gpu=True)
to = synth_tabular(df, splits=random_splits(a.rows, like=df))
del df
rows, profiles = [], {}
meta = dict(bench='model', n_rows=a.rows, layers=LAYERS, repeats=a.repeats, precision='bf16', opt='torch Adam(fused=True)')
for bs in a.bs:
    print(f'batch {bs}', flush=True)
    dls = to.dataloaders(bs=bs, seed=0)
    t = dls.train.tensors()
    r, learners = dict(bs=bs), {}
    for name, fast in (('fastai', False), ('ours', True)):
        set_seed(0)
        learn = tabular_learner(dls, layers=LAYERS, opt_func=fused_adam, fast=fast).to_bf16()
        learn.remove_cb(ProgressCallback)
        rate, ts = learner_rate(learn, bs, a.rows_timed, a.repeats, WARM)
        r[f'{name}_learner_rows_s'] = round(rate)
        learners[name] = learn
        n_plain = max(3, a.rows_timed // bs)
        r[f'plain_loop_{name}_model_rows_s'] = round(statistics.median(
            plain_loop(learn.model, t.cats, t.conts, t.ys, bs, n_plain, opt_func=partial(torch.optim.Adam, fused=True), bf16=True)
            for _ in range(a.repeats)))
        print(r, flush=True)
    r['ours_over_plain'] = round(r['ours_learner_rows_s'] / r['plain_loop_ours_model_rows_s'], 3)
    r['ours_over_fastai'] = round(r['ours_learner_rows_s'] / r['fastai_learner_rows_s'], 2)
    r['plain_ours_over_plain_fastai'] = round(r['plain_loop_ours_model_rows_s'] / r['plain_loop_fastai_model_rows_s'], 2)
    for name, learn in learners.items():
        ks, ms = kernel_profile(learn, bs, a.profile_batches)
        profiles[f'{name}_{bs}'] = dict(gpu_ms_per_batch=round(ms, 3), kernels=ks)
        print(f'\nprofile {name} bs {bs}: {ms:.2f} GPU ms a batch; largest kernels (% of GPU time, us a batch):')
        for k, pct, us in ks: print(f'  {pct:5.1f}%  {us:7d}  {k}')
    r['gpu_ms_fastai'], r['gpu_ms_ours'] = profiles[f'fastai_{bs}']['gpu_ms_per_batch'], profiles[f'ours_{bs}']['gpu_ms_per_batch']
    rows.append(r)
    del dls, learners, learn, t
    torch.cuda.empty_cache()
print(f"\nthroughput on {a.rows:,} rows, layers {LAYERS}, bf16, torch's fused Adam")
report(a.name, rows, ['bs', 'fastai_learner_rows_s', 'ours_learner_rows_s', 'plain_loop_ours_model_rows_s', 'plain_loop_fastai_model_rows_s',
                      'ours_over_plain', 'ours_over_fastai', 'plain_ours_over_plain_fastai', 'gpu_ms_fastai', 'gpu_ms_ours'], dict(meta, profiles=profiles))
