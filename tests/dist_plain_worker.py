"""Run by tests/test_distributed.py (gloo, CPU) and tests/test_gpu2_distributed.py (NCCL, `accelerate launch`): a model with packed
row-sparse tables (`emb_opt`) and BatchNorm trained by `fit` under `distrib_ctx`, then validated. OUT/plain_rank{R}.json: whether the
fit's model was DDP's, whether `CudaGraph` replayed it, the validation loss; OUT/plain_rank{R}.pt the state dict the fit left."""
import json, os, sys
from pathlib import Path
import torch
from torch.nn.parallel import DistributedDataParallel
from accelerate import PartialState
from dist_end import end
from fastai.tabular.all import Callback, rank_distrib, set_seed
from fastai_gpu_tabular.data import synth_movielens, synth_tabular
from fastai_gpu_tabular.backend import gpu_available
from fastai_gpu_tabular.learner import tabular_learner
from fastai_gpu_tabular.distributed import use_rank_gpu, ddp_kwargs
from fastai_gpu_tabular.graph import CudaGraph

out, gpu = Path(sys.argv[1]), len(sys.argv) > 2 and sys.argv[2] == 'gpu'
state = PartialState(cpu=not gpu)
device = use_rank_gpu() if gpu else torch.device('cpu')
to = synth_tabular(synth_movielens(4_000, n_users=20_000, n_items=5_000, gpu=gpu and gpu_available()))

class Seen(Callback):
    "Whether the model of the training batches was DDP's"
    order = 50
    def before_batch(self): self.ddp = isinstance(self.model, DistributedDataParallel)

set_seed(0)
learn = tabular_learner(to.dataloaders(bs=64, seed=0, device=device), layers=[32, 16], emb_opt='rowwise-adagrad')
graph, seen = CudaGraph(), Seen()
with learn.distrib_ctx(sync_bn=False, **ddp_kwargs()):
    learn.fit(1, 1e-2, cbs=[graph, seen])
    sd = {k: v.detach().cpu().clone() for k,v in learn.model.state_dict().items()}  # as the fit left them (`validate` broadcasts)
    loss = learn.validate()[0]
torch.save(sd, out/f'plain_rank{rank_distrib()}.pt')
(out/f'plain_rank{rank_distrib()}.json').write_text(json.dumps(dict(ddp=seen.ddp, replays=graph.replays, valid_loss=float(loss),
                                                                     bn=[k for k in sd if 'running' in k])))
end(state)
