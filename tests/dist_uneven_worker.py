"""Run by tests/test_distributed.py (gloo, CPU): two ranks whose batches differ in size (60 rows and 10, touching distinct rows of
a 100-row table) take three `SparseEmbedOpt` steps with each exchange, 'whole' and 'rows': OUT/uneven_{EX}_rank{R}.pt, the tables'
weights and state. With `alone` (one plain process): the same steps on both batches' mean loss, what the ranks' exchange should
give (OUT/uneven_{EX}_alone.pt)."""
import sys
from pathlib import Path
from functools import partial
import torch
from accelerate import PartialState
from dist_end import end
from fastai.tabular.all import Adam, set_seed
from fastai_gpu_tabular.model import FastTabularModel
from fastai_gpu_tabular.optimizer import SparseEmbedOpt

out, alone = Path(sys.argv[1]), sys.argv[2:] == ['alone']
szs = [(100, 4), (7, 4)]
def batch(r):
    "Rank `r`'s batch: rank 0 rows 0..59 of the large table, rank 1 rows 60..69"
    n, first = (60, 0) if r == 0 else (10, 60)
    g = torch.Generator().manual_seed(r)
    return torch.stack([torch.arange(first, first + n), torch.randint(0, 7, (n,), generator=g)], 1), torch.randn(n, 2, generator=g)

def run(ex, ranks):
    "Three steps on the batches of `ranks` (this rank's, or every rank's mean loss alone); the tables' weights and state"
    set_seed(0); m = FastTabularModel(szs, 2, 1, [8], sparse=True)
    opt = SparseEmbedOpt(list(m.parameters()), lr=0.05, opt_func=partial(Adam, wd=0.1), rule='lazy-adam', exchange=ex)
    for _ in range(3):
        sum(m(*batch(r)).pow(2).mean() for r in ranks).div(len(ranks)).backward()
        if not alone:  # the dense layers' mean over the ranks (`SparseEmbeddingGrads`' part in a fit)
            for q in (q for q in m.parameters() if q.grad is not None and not q.grad.is_sparse):
                torch.distributed.all_reduce(q.grad); q.grad.div_(2)
        opt.step(); opt.zero_grad()
    return {f'{k}{i}': v for i,e in enumerate(m.embeds) for k,v in [('w', e.weight.detach()), *opt.state[e.weight].items()]
            if torch.is_tensor(v)}

if alone:
    for ex in ('whole', 'rows'): torch.save(run(ex, [0, 1]), out/f'uneven_{ex}_alone.pt')
else:
    state = PartialState(cpu=True)
    for ex in ('whole', 'rows'): torch.save(run(ex, [state.process_index]), out/f'uneven_{ex}_rank{state.process_index}.pt')
    end(state)
