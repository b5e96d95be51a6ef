"""Run by tests/test_gpu2_distributed.py (NCCL, `accelerate launch`, GPUs only): a model with packed row-sparse tables trained by `fit`
with `ForeachLamb` under `distrib_ctx`, its tables' rows exchanged whole (one all-reduce) or each rank stepping its share
(`ShardTables`), replayed by `CudaGraph(ranks=True)` (the whole step, its collectives captured) and by `CudaGraph()` (the forward and
backward). OUT/ranks_{EX}_rank{R}.json: whether each fit replayed the whole step (and why not), its replays, the largest difference
between the two fits' weights; then the batches a whole-step fit trained under `CheckNoSync` after its capture."""
import json, sys
from functools import partial
from pathlib import Path
import torch
from accelerate import PartialState
from dist_end import end
from fastai.tabular.all import rank_distrib, set_seed, tabular_config
from fastai_gpu_tabular.data import synth_movielens, synth_tabular
from fastai_gpu_tabular.learner import tabular_learner
from fastai_gpu_tabular.distributed import use_rank_gpu, ddp_kwargs, StopAfter, ShardTables
from fastai_gpu_tabular.graph import CudaGraph
from fastai_gpu_tabular.optimizer import SparseEmbedOpt, ForeachLamb
from fastai_gpu_tabular.recorder import CheckNoSync

out = Path(sys.argv[1])
state = PartialState()
device = use_rank_gpu()
to = synth_tabular(synth_movielens(8_000, n_users=20_000, n_items=5_000, gpu=True))

class CheckNoSyncAfterCapture(CheckNoSync):
    def before_batch(self):
        if self.iter > 3: super().before_batch()

def fit(ex, ranks, *cbs):
    set_seed(0)
    learn = tabular_learner(to.dataloaders(bs=128, seed=0, device=device), layers=[32, 16], config=dict(tabular_config(), sparse=True),
                            opt_func=partial(SparseEmbedOpt, opt_func=ForeachLamb, rule='rowwise-adagrad', exchange=ex))
    graph = CudaGraph(ranks=ranks)
    with learn.distrib_ctx(sync_bn=False, **ddp_kwargs()):
        learn.fit(1, 1e-2, cbs=[graph, *([ShardTables()] if ex == 'local' else []), *cbs])
        res = dict(whole=graph.steps, why=graph.why, replays=graph.replays, iters=learn.train_iter)  # before `validate` starts them again
        learn.validate()  # `ShardTables` sends each rank's tables to every rank first
    return res, {k: v.detach().float().cpu() for k,v in learn.model.state_dict().items()}

for ex in ('whole', 'local'):
    (f1, w1), (f0, w0) = fit(ex, True), fit(ex, False)
    diff = max((w1[k] - w0[k]).abs().max().item() for k in w0 if w0[k].numel())
    (out/f'ranks_{ex}_rank{rank_distrib()}.json').write_text(json.dumps(dict(
        whole=[f1['whole'], f0['whole']], why=[f1['why'], f0['why']], replays=[f1['replays'], f0['replays']], max_diff=diff)))
f, _ = fit('whole', True, CheckNoSyncAfterCapture(), StopAfter(12))
(out/f'ranks_nosync_rank{rank_distrib()}.json').write_text(json.dumps(dict(iters=f['iters'], whole=f['whole'])))
end(state)
