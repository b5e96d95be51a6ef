"""LAMB at GPU speed: optimizer step time, host synchronisations, and fp32 against bf16 end to end.

    python bench/bench_lamb.py --rows 25000000 --bs 65536

On the MovieLens-25M-shaped model (the benchmark schema on `--rows` synthetic rows: fastai's embedding sizes, 2
continuous columns, layers [512,256]):
  (1) one optimizer step over every parameter with dense random gradients, ms (median of `--repeats` runs of `--steps`
      steps after warm-up, device synchronised around each run): fastai's Lamb, ours fused (two Triton kernels a group),
      ours foreach, torch's fused AdamW (the target: ours <= 1.5x), torch's foreach Adam and fastai's Adam; the bytes a
      step must move at least and the rate that makes; and whether a step runs under
      `torch.cuda.set_sync_debug_mode('error')` (no host synchronisation) or raises.
  (2) rows/s through `Learner.fit` (TabularGPU + BatchDataLoader + DeviceRecorder) with our LAMB in fp32 and in bf16
      (`learn.to_bf16()`), and with fastai's Lamb in fp32, at batch `--bs` (median of `--repeats` timed runs)."""
import argparse, copy, statistics, sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).parent))
from common import sync, report, learner_rate
import torch
from fastai.tabular.all import CategoryBlock, TabularModel, get_emb_sz, Lamb, Adam
from fastai_gpu_tabular.backend import gpu_available
from fastai_gpu_tabular.procs import Categorify, FillMissing, Normalize
from fastai_gpu_tabular.tabular import TabularGPU
from fastai_gpu_tabular.learner import tabular_learner
from fastai_gpu_tabular.optimizer import ForeachLamb, _Table
from fastai_gpu_tabular.data import synth_movielens, synth_tabular
from fastai_gpu_tabular.tabular import random_splits

p = argparse.ArgumentParser()
p.add_argument('--rows', type=int, default=25_000_000)
p.add_argument('--bs', type=int, default=65536)
p.add_argument('--steps', type=int, default=50)
p.add_argument('--repeats', type=int, default=5)
p.add_argument('--rows-timed', type=int, default=3_000_000)
p.add_argument('--configs', nargs='*', default=[], help='more fused-kernel shapes to time, as BLOCKxTILESxWARPS (e.g. 1024x16x4)')
a = p.parse_args()
assert gpu_available(), "this benchmark needs cuDF and a CUDA GPU"
LAYERS = [512, 256]

df = synth_movielens(a.rows, gpu=True)
to = synth_tabular(df, splits=random_splits(a.rows, like=df))
del df
emb_szs = get_emb_sz(to.train)
base = TabularModel(emb_szs, len(to.cont_names), 2, LAYERS).cuda()
n_params = sum(p.numel() for p in base.parameters())
print(f'model: embeddings {emb_szs}, {n_params:,} parameters', flush=True)

def no_sync(opt):
    "Does a step run with the sync checker raising on any host synchronisation?"
    sync(); torch.cuda.set_sync_debug_mode('error')
    try: opt.step(); return 'none'
    except RuntimeError as e: return 'syncs'
    finally: torch.cuda.set_sync_debug_mode('default')

def step_ms(make):
    m = copy.deepcopy(base)
    ps = list(m.parameters())
    g = torch.Generator(device='cuda'); g.manual_seed(0)
    for p in ps: p.grad = torch.randn(p.shape, device='cuda', generator=g) * 1e-3
    opt = make(ps)
    for _ in range(3): opt.step()
    ts = []
    for _ in range(a.repeats):
        sync(); t = time.perf_counter()
        for _ in range(a.steps): opt.step()
        sync(); ts.append((time.perf_counter() - t) / a.steps * 1e3)
    res = statistics.median(ts), no_sync(opt)
    del opt, m, ps; torch.cuda.empty_cache()
    return res

opts = {"fastai Lamb": lambda ps: Lamb(ps, lr=1e-3, wd=0.01),
        f"ours, fused (Triton), {'x'.join(map(str, (_Table.BLOCK, _Table.TILES, _Table.WARPS)))}": lambda ps: ForeachLamb(ps, lr=1e-3, wd=0.01, fused=True),
        "ours, foreach": lambda ps: ForeachLamb(ps, lr=1e-3, wd=0.01, fused=False),
        "torch AdamW, fused": lambda ps: torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.01, fused=True),
        "torch Adam, foreach": lambda ps: torch.optim.Adam(ps, lr=1e-3, foreach=True),
        "fastai Adam": lambda ps: Adam(ps, lr=1e-3, wd=0.01)}
def shaped(block, tiles, warps):
    "our fused LAMB with programs of `tiles` tiles of `block` elements and `warps` warps"
    def make(ps):
        _Table.BLOCK, _Table.TILES, _Table.WARPS = block, tiles, warps
        opt = ForeachLamb(ps, lr=1e-3, wd=0.01, fused=True); opt.step()  # the tables take the shape now
        _Table.BLOCK, _Table.TILES, _Table.WARPS = default_shape
        return opt
    return make
default_shape = _Table.BLOCK, _Table.TILES, _Table.WARPS
for c in a.configs: opts[f"ours, fused, {c}"] = shaped(*map(int, c.split('x')))
floats_moved = {k: 10 for k in opts if k.startswith('ours, fused')} | {"torch AdamW, fused": 7}  # reads + writes per parameter, at the least
steps = {k: step_ms(f) for k, f in opts.items()}
ref = steps["torch AdamW, fused"][0]
rows = [dict(part='step', run=k, ms=round(t, 3), over_fused_adamw=round(t / ref, 2), host_syncs=s,
             gb_s=round(floats_moved[k] * 4 * n_params / t / 1e6) if k in floats_moved else '') for k, (t, s) in steps.items()]
for r in rows: print(r, flush=True)

def e2e(opt_func, precision):
    learn = tabular_learner(to.dataloaders(bs=a.bs, seed=0), layers=LAYERS, opt_func=opt_func)
    if precision == 'bf16': learn.to_bf16()
    rate, ts = learner_rate(learn, a.bs, a.rows_timed, a.repeats)
    del learn; torch.cuda.empty_cache()
    return rate
fp32 = e2e(ForeachLamb, 'fp32')
bf16 = e2e(ForeachLamb, 'bf16')
fai = e2e(Lamb, 'fp32')
rows += [dict(part='Learner.fit', run='ours LAMB, fp32', rows_s=round(fp32), over_fp32=1.0),
         dict(part='Learner.fit', run='ours LAMB, bf16', rows_s=round(bf16), over_fp32=round(bf16 / fp32, 2)),
         dict(part='Learner.fit', run='fastai Lamb, fp32', rows_s=round(fai), over_fp32=round(fai / fp32, 2))]
print(f"\n(1) optimizer step, {n_params:,} parameters; (2) Learner.fit at batch {a.bs:,}, layers {LAYERS}, {a.rows:,} rows")
report('lamb', rows, ['part', 'run', 'ms', 'over_fused_adamw', 'gb_s', 'host_syncs', 'rows_s', 'over_fp32'],
       dict(bench='lamb', n_rows=a.rows, bs=a.bs, layers=LAYERS, n_params=n_params, steps=a.steps, repeats=a.repeats))
