"""Run by tests/test_distributed.py (gloo, CPU) and tests/test_gpu2_distributed.py (NCCL, `accelerate launch`): a model with packed
row-sparse tables and BatchNorm trained by `fit` under `distrib_ctx`, then validated, once a `SparseEmbedOpt` exchange (EX: 'rows',
'whole'). OUT/plain_{EX}_rank{R}.json: whether the fit's model was DDP's, whether `CudaGraph` replayed it, the validation loss;
OUT/plain_{EX}_rank{R}.pt the state dict the fit left. On GPUs, OUT/nosync_rank{R}.json: the batches a fit with the whole
exchange trained under `CheckNoSync` (which raises at a host sync)."""
import json, os, sys
from pathlib import Path
import torch
from torch.nn.parallel import DistributedDataParallel
from accelerate import PartialState
from dist_end import end
from functools import partial
from fastai.tabular.all import Adam, Callback, rank_distrib, set_seed, tabular_config
from fastai_gpu_tabular.data import synth_movielens, synth_tabular
from fastai_gpu_tabular.backend import gpu_available
from fastai_gpu_tabular.learner import tabular_learner
from fastai_gpu_tabular.distributed import use_rank_gpu, ddp_kwargs, StopAfter
from fastai_gpu_tabular.graph import CudaGraph
from fastai_gpu_tabular.optimizer import SparseEmbedOpt

out, gpu = Path(sys.argv[1]), len(sys.argv) > 2 and sys.argv[2] == 'gpu'
state = PartialState(cpu=not gpu)
device = use_rank_gpu() if gpu else torch.device('cpu')
to = synth_tabular(synth_movielens(4_000, n_users=20_000, n_items=5_000, gpu=gpu and gpu_available()))

class Seen(Callback):
    "Whether the model of the training batches was DDP's"
    order = 50
    def before_batch(self): self.ddp = isinstance(self.model, DistributedDataParallel)

for ex in ('rows', 'whole'):  # `SparseEmbedOpt`'s two exchanges of the tables' rows
    set_seed(0)
    learn = tabular_learner(to.dataloaders(bs=64, seed=0, device=device), layers=[32, 16], config=dict(tabular_config(), sparse=True),
                            opt_func=partial(SparseEmbedOpt, opt_func=Adam, rule='rowwise-adagrad', exchange=ex))
    graph, seen = CudaGraph(), Seen()
    with learn.distrib_ctx(sync_bn=False, **ddp_kwargs()):
        learn.fit(1, 1e-2, cbs=[graph, seen])
        sd = {k: v.detach().cpu().clone() for k,v in learn.model.state_dict().items()}  # as the fit left them (`validate` broadcasts)
        loss = learn.validate()[0]
    torch.save(sd, out/f'plain_{ex}_rank{rank_distrib()}.pt')
    (out/f'plain_{ex}_rank{rank_distrib()}.json').write_text(json.dumps(dict(ddp=seen.ddp, replays=graph.replays, valid_loss=float(loss),
                                                                              bn=[k for k in sd if 'running' in k])))
if gpu:  # the whole exchange waits for nothing: `CheckNoSync` raises at a host sync, from the batch after the graphs' capture on
    from fastai_gpu_tabular.recorder import CheckNoSync
    class CheckNoSyncAfterCapture(CheckNoSync):
        def before_batch(self):
            if self.iter > 3: super().before_batch()
    learn = tabular_learner(to.dataloaders(bs=64, seed=0, device=device), layers=[32, 16], config=dict(tabular_config(), sparse=True),
                            opt_func=partial(SparseEmbedOpt, opt_func=Adam, rule='rowwise-adagrad', exchange='whole'))
    with learn.distrib_ctx(sync_bn=False, **ddp_kwargs()): learn.fit(1, 1e-2, cbs=[CudaGraph(), CheckNoSyncAfterCapture(), StopAfter(12)])
    (out/f'nosync_rank{rank_distrib()}.json').write_text(json.dumps(learn.train_iter))
end(state)
