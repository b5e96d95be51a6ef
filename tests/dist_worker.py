"""Run by tests/test_distributed.py under `python -m torch.distributed.run --nproc_per_node N` (gloo on the CPU) or
`accelerate launch` (NCCL on GPUs): trains one epoch inside fastai's `distrib_ctx` and writes, for this rank, the rows it
trained on, its batch counts, the gathered validation predictions and the metrics, to OUT/rank{R}.json (and the weights
from rank 0)."""
import json, os, sys
from pathlib import Path
import torch
from accelerate import PartialState
from dist_end import end
from fastai.tabular.all import CategoryBlock, RocAucBinary, Callback, set_seed, tabular_config, get_model, rank_distrib
from fastai_gpu_tabular.procs import Categorify, FillMissing, Normalize
from fastai_gpu_tabular.tabular import TabularGPU
from fastai_gpu_tabular.learner import tabular_learner
from fastai_gpu_tabular.data import synth_movielens, synth_tabular
from fastai_gpu_tabular.backend import gpu_available
from fastai_gpu_tabular.distributed import use_rank_gpu

out, gpu = Path(sys.argv[1]), len(sys.argv) > 2 and sys.argv[2] == 'gpu'
state = PartialState(cpu=not gpu)
if gpu: use_rank_gpu()
set_seed(0)
n = 10_007  # 8,006 training and 2,001 validation rows: the last validation batch does not split evenly
df = synth_movielens(n, n_users=300, n_items=100, gpu=gpu and gpu_available())
to = synth_tabular(df)
dls = to.dataloaders(bs=500, device=state.device)  # no seed: each rank draws its own, and rank 0's must win

class Seen(Callback):
    "The rows this rank trains on and its batch counts"
    def before_train(self): self.rows = torch.cat(self.dl.batch_idxs(self.dl.order())).tolist(); self.n_train = len(self.dl)
    def before_validate(self): self.n_valid = len(self.dl)

seen = Seen()
learn = tabular_learner(dls, layers=[32, 16], metrics=RocAucBinary(), config=tabular_config(use_bn=False, bn_cont=False))
with learn.distrib_ctx(sync_bn=False):
    learn.fit(1, 1e-2, cbs=seen)
    vals = list(learn.recorder.values[-1])  # train loss, valid loss, AUC (get_preds adds a row of its own)
    preds, targs = learn.get_preds()
res = dict(rank=rank_distrib(), rows=seen.rows, n_train=seen.n_train, n_valid=seen.n_valid, n_preds=len(preds),
           preds=preds[:, 1].tolist(), targs=targs.view(-1).tolist(), valid_loss=float(vals[1]), auc=float(vals[2]))
(out/f'rank{res["rank"]}.json').write_text(json.dumps(res))
if res['rank'] == 0: torch.save(get_model(learn.model).state_dict(), out/'model.pth')
end(state)  # no interpreter teardown: its C++ threads could abort a rank (dist_end.py)
