"""Where FastTabularModel's time goes: the plain loop (bench/roofline.py) over the benchmark model with each change undone
in turn, and the host time of a step (at a small batch, where the GPU waits for the CPU), for the model alone and through
`Learner.fit`. No cuDF needed: random codes and values of the benchmark's shapes.

    python bench/profiles/ablate_model.py --bs 65536 --small-bs 2048"""
import argparse, statistics, sys
from functools import partial
from pathlib import Path
sys.path.insert(0, str(Path(__file__).parent.parent))  # bench/: common, roofline
from common import report
from roofline import plain_loop
import torch
from torch import nn
from fastai.tabular.all import TabularModel, set_seed
from fastai_gpu_tabular.model import FastTabularModel

p = argparse.ArgumentParser()
p.add_argument('--rows', type=int, default=4_000_000)
p.add_argument('--bs', type=int, nargs='+', default=[65536, 262144])
p.add_argument('--small-bs', type=int, default=2048)
p.add_argument('--batches', type=int, default=60)
p.add_argument('--repeats', type=int, default=5)
a = p.parse_args()
EMB = [(162542, 600), (59048, 600), (25, 10), (3, 3)]
cats = torch.stack([torch.randint(0, n, (a.rows,), device='cuda') for n, _ in EMB], 1)
conts, ys = torch.randn(a.rows, 2, device='cuda'), torch.randint(0, 2, (a.rows, 1), device='cuda')

def variant(name):
    set_seed(0)
    if name == 'fastai': return TabularModel(EMB, 2, 2, [512, 256]).cuda()
    m = FastTabularModel(EMB, 2, 2, [512, 256], align=1 if name == 'no padding' else 64).cuda()
    if name == 'cuDNN bn_cont': m.bn_cont.__class__ = nn.BatchNorm1d
    if name == 'no padding': m.layers[0][0].__class__ = nn.Linear
    return m

adam = partial(torch.optim.Adam, fused=True)
rows = []
for name in ['ours', 'cuDNN bn_cont', 'no padding', 'fastai']:
    m, r = variant(name), dict(model=name)
    for bs in a.bs + [a.small_bs]:
        rate = statistics.median(plain_loop(m, cats, conts, ys, bs, a.batches, opt_func=adam, bf16=True) for _ in range(a.repeats))
        r[f'rows_s_{bs}'] = round(rate)
        if bs == a.small_bs: r[f'us_per_batch_{bs}'] = round(1e6 * bs / rate)
    rows.append(r); print(r, flush=True)
print(f"\nplain loop, bf16 autocast, torch's fused Adam, {a.rows:,} random rows of the benchmark shapes")
report('ablate_model', rows, ['model'] + [f'rows_s_{bs}' for bs in a.bs + [a.small_bs]] + [f'us_per_batch_{a.small_bs}'], dict(bench='ablate_model'))
