"""Ranking metrics per group: ours (sorts and segment sums on the device) against torchmetrics' retrieval metrics.

    python bench/bench_ranking.py --rows 10000000 --groups 100000

On `--rows` scores in `--groups` groups (random group sizes, binary relevance, no ties), for MRR and NDCG@10, on the CPU
and (where there is one) the GPU: seconds to the metric's value (a host sync included), the median of `--repeats` runs
after a warm-up, for ours and for torchmetrics' `RetrievalMRR` / `RetrievalNormalizedDCG(top_k=10)` (`update` then
`compute`), their ratio, and the largest difference between the two values. Target: >= 20x torchmetrics on the GPU."""
import argparse, statistics, sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).parent))
from common import sync, report
import torch
from fastai_gpu_tabular.ranking import mrr, ndcg_at_k

p = argparse.ArgumentParser()
p.add_argument('--rows', type=int, default=10_000_000)
p.add_argument('--groups', type=int, default=100_000)
p.add_argument('--repeats', type=int, default=3)
p.add_argument('--devices', nargs='+', default=['cpu', 'cuda'])
p.add_argument('--name', default='ranking')
a = p.parse_args()
from torchmetrics.retrieval import RetrievalMRR, RetrievalNormalizedDCG

def timed(f):
    f(); ts = []
    for _ in range(a.repeats):
        sync(); t = time.perf_counter(); v = float(f()); sync(); ts.append(time.perf_counter() - t)
    return statistics.median(ts), v

def theirs(cls, preds, targs, groups, **kw):
    def f():
        m = cls(**kw).to(preds.device)
        m.update(preds, targs.bool(), indexes=groups)
        return m.compute()
    return f

g = torch.Generator().manual_seed(0)
groups = torch.randint(0, a.groups, (a.rows,), generator=g)
preds, targs = torch.rand(a.rows, generator=g), (torch.rand(a.rows, generator=g) < 0.1).long()
rows = []
for dev in a.devices:
    if dev == 'cuda' and not torch.cuda.is_available(): continue
    P, T, G = preds.to(dev), targs.to(dev), groups.to(dev)
    for name, ours, cls, kw in (('MRR', lambda: mrr(P, T, G), RetrievalMRR, {}),
                                ('NDCG@10', lambda: ndcg_at_k(P, T, G, 10), RetrievalNormalizedDCG, dict(top_k=10))):
        to, vo = timed(ours)
        tt, vt = timed(theirs(cls, P, T, G, **kw))
        rows.append(dict(device=dev, metric=name, ours_s=round(to, 4), torchmetrics_s=round(tt, 3), speedup=round(tt/to, 1),
                         value=round(vo, 6), diff=f'{abs(vo-vt):.1e}'))
print(f"{a.rows:,} rows in {a.groups:,} groups; seconds to the value")
report(a.name, rows, ['device', 'metric', 'ours_s', 'torchmetrics_s', 'speedup', 'value', 'diff'], dict(bench='ranking', n_rows=a.rows, n_groups=a.groups))
