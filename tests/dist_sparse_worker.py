"""Run by tests/test_distributed.py (gloo, CPU) and tests/test_gpu2_distributed.py (NCCL, `accelerate launch`): the same model
and batches trained for a few steps in two ways on every rank, and the parameters written to OUT/{case}_{how}_rank{R}.pt:
  ours:  fastai's `Learner.fit` inside `distrib_ctx(**ddp_kwargs(sparse_embeddings=...))`, with `SparseEmbeddingGrads`;
  plain: torch's `DistributedDataParallel` wrapped by hand around the same model, `loss.backward()` and the same fastai
         optimizer stepped in a loop over the same rank shards: no code of this library in its gradient path.
Cases: LAMB and Adam with the rule (users and movies sparse, hour and the genres bag dense), LAMB with every table
sparse (the bag and the small table through the sparse path), LAMB with 2 batches accumulated a step, sparse off, and on
GPUs the gradients sent in bf16 (plain DDP with torch's `bf16_compress_hook`, which needs NCCL).
OUT/tables_rank{R}.json records the tables each case sent sparsely."""
import json, os, sys
from pathlib import Path
import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import bf16_compress_hook
from accelerate import PartialState
from dist_end import end
from fastai.tabular.all import (Learner, Adam, CrossEntropyLossFlat, GradientAccumulation, set_seed, tabular_config, rank_distrib,
                                num_distrib)
from fastai_gpu_tabular.data import synth_movielens, synth_tabular
from fastai_gpu_tabular.backend import gpu_available
from fastai_gpu_tabular.learner import tabular_learner
from fastai_gpu_tabular.optimizer import ForeachLamb
from fastai_gpu_tabular.distributed import use_rank_gpu, ddp_kwargs, StopAfter

out, gpu = Path(sys.argv[1]), len(sys.argv) > 2 and sys.argv[2] == 'gpu'
state = PartialState(cpu=not gpu)
device = use_rank_gpu() if gpu else torch.device('cpu')
if gpu: os.environ.setdefault('CUBLAS_WORKSPACE_CONFIG', ':4096:8'); torch.use_deterministic_algorithms(True)  # two runs, the same sums
rank, world, BS = rank_distrib(), num_distrib(), 64
# 4,000 rows (3,200 training: 25 batches of 2 x 64); users (1,413 rows) and movies (1,062) large, hour, year_na and genres small
to = synth_tabular(synth_movielens(4_000, n_users=20_000, n_items=5_000, gpu=gpu and gpu_available()), mh=True)
cfg = tabular_config(use_bn=False, bn_cont=False)

def model():
    "The same initial weights for every case and both ways: `FastTabularModel` with the genres bag"
    set_seed(0)
    return tabular_learner(to.dataloaders(bs=BS, seed=0, device=device), layers=[32, 16], config=cfg).model.to(device)

def ours(opt, sparse, n_acc, steps, bf16=False):
    dls = to.dataloaders(bs=BS, seed=0, device=device)
    learn = Learner(dls, model(), loss_func=CrossEntropyLossFlat(), opt_func=opt, lr=1e-2)
    cbs = [GradientAccumulation(n_acc*BS)] if n_acc > 1 else []
    with learn.distrib_ctx(sync_bn=False, **ddp_kwargs(bf16, sparse_embeddings=sparse)):
        learn.fit(1, 1e-2, cbs=cbs + [StopAfter(steps*n_acc)])
        names = learn.sparse_embedding_grads.names
    return learn.model.state_dict(), names

def plain(opt, n_acc, steps, bf16=False):
    dls = to.dataloaders(bs=BS, seed=0, device=device)
    learn = Learner(dls, model(), loss_func=CrossEntropyLossFlat(), opt_func=opt, lr=1e-2)
    learn.create_opt()  # fastai's parameter groups and hyper-parameters, stepped by hand below
    ddp = DDP(learn.model, device_ids=[device.index] if gpu else None)
    if bf16: ddp.register_comm_hook(None, bf16_compress_hook)
    dl, n_inp = dls.train.sharded(rank, world, device), dls.n_inp
    for i,b in enumerate(dl):
        if i == steps*n_acc: break
        loss = learn.loss_func(ddp(*b[:n_inp]), *b[n_inp:]) / n_acc
        loss.backward()
        if (i+1) % n_acc == 0: learn.opt.step(); learn.opt.zero_grad()
    return learn.model.state_dict()

tables = {}
CASES = [('lamb', ForeachLamb, None, 1, False), ('adam', Adam, None, 1, False), ('lamb_all', ForeachLamb, True, 1, False),
         ('lamb_acc', ForeachLamb, None, 2, False), ('lamb_off', ForeachLamb, False, 1, False)]
CASES += [('lamb_bf16', ForeachLamb, None, 1, True)]*gpu
for case,opt,sparse,n_acc,bf16 in CASES:
    sd, tables[case] = ours(opt, sparse, n_acc, 5, bf16)
    torch.save({k: v.cpu() for k,v in sd.items()}, out/f'{case}_ours_rank{rank}.pt')
    torch.save({k: v.cpu() for k,v in plain(opt, n_acc, 5, bf16).items()}, out/f'{case}_plain_rank{rank}.pt')
if gpu:  # the step's one host sync is the allowed one: `CheckNoSync` passes with the sparse exchange on
    # (multi-hot batches padded to a fixed width: the (values, offsets) layout reads its batch's length on the host)
    from fastai_gpu_tabular.recorder import CheckNoSync
    class CheckNoSyncAfterRebuild(CheckNoSync):
        "DDP rebuilds its buckets at the second forward, a sync of its own, once: checked from the third batch"
        def before_batch(self):
            if self.iter > 1: super().before_batch()
    learn = tabular_learner(to.dataloaders(bs=BS, seed=0, device=device, mh_width='max'), layers=[32, 16], config=cfg, opt_func=ForeachLamb)
    with learn.distrib_ctx(sync_bn=False, **ddp_kwargs(sparse_embeddings=None)):
        learn.fit(1, 1e-2, cbs=[CheckNoSyncAfterRebuild(), StopAfter(5)])
        tables['nosync'] = learn.sparse_embedding_grads.names
(out/f'tables_rank{rank}.json').write_text(json.dumps(tables))
end(state)  # no interpreter teardown: its C++ threads could abort a rank (dist_end.py)
