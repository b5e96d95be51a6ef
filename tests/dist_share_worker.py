"""Run by tests/test_distributed.py under `python -m torch.distributed.run --nproc_per_node 2` (gloo on the CPU): loaders made
by each rank with no seed, a training loader whose last shares are small, and a validation whose last batch leaves one
rank no rows, in a plain DDP loop and under fastai's `distrib_ctx`. Writes OUT/rank{R}.json (and the weights from rank 0)."""
import json, sys
from pathlib import Path
import torch
from accelerate import PartialState
from dist_end import end
from fastai.tabular.all import accuracy, RocAucBinary, set_seed, tabular_config, get_model, rank_distrib
from fastai_gpu_tabular.learner import tabular_learner
from fastai_gpu_tabular.data import synth_movielens, synth_tabular
import fastai_gpu_tabular.distributed  # noqa: F401  (exact metrics across ranks)

out = Path(sys.argv[1])
state = PartialState(cpu=True)
df = synth_movielens(1_004, n_users=50, n_items=30, gpu=False)
to = synth_tabular(df, splits=(range(803), range(803, 1_004)))  # 803 training rows (3 left over), 201 validation (1 left over)
dls = to.dataloaders(bs=50)  # no seed, a plain process group: rank 0's seed must reach every rank
orders = [torch.cat(dls.train.batch_idxs(dls.train.order(e))).tolist() for e in (0, 1)]
loose = dls.train.new(drop_last=False)  # 3 rows left: shares of 2 and 1, so that batch is dropped on both ranks
sizes = [len(b[0]) for b in loose]
vsizes = [len(b[0]) for b in dls.valid]

# a plain DDP loop over the sharded training loader
set_seed(0)
learn = tabular_learner(dls, layers=[16], metrics=[accuracy, RocAucBinary()], config=tabular_config(use_bn=False, bn_cont=False))
ddp = torch.nn.parallel.DistributedDataParallel(learn.model)
opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
for xc, xn, y in dls.train:
    loss = torch.nn.functional.cross_entropy(ddp(xc, xn), y.view(-1)); opt.zero_grad(); loss.backward(); opt.step()
with learn.distrib_ctx(sync_bn=False): valid = [float(v) for v in learn.validate()]
res = dict(rank=rank_distrib(), seed=dls.train.seed, orders=orders, sizes=sizes, vsizes=vsizes, n_loose=len(loose), valid=valid)
(out/f'rank{res["rank"]}.json').write_text(json.dumps(res))
if res['rank'] == 0: torch.save(get_model(learn.model).state_dict(), out/'model.pth')
end(state)  # no interpreter teardown: its C++ threads could abort a rank (dist_end.py)
