"""Run by tests/test_stream.py under `python -m torch.distributed.run --nproc_per_node 2` (gloo; `accelerate launch` and NCCL
with `gpu`): one epoch from a processed
folder inside fastai's `distrib_ctx`; writes this rank's training rows (the targets are row numbers), its batch count and the
validation loss to OUT/rank{R}.json, and rank 0's weights."""
import json, sys
from pathlib import Path
import torch
from accelerate import PartialState
from dist_end import end
from fastai.tabular.all import Callback, set_seed, tabular_config, get_model, rank_distrib
from fastai.tabular.data import TabularDataLoaders
from fastai_gpu_tabular.learner import tabular_learner
from fastai_gpu_tabular.distributed import use_rank_gpu
import fastai_gpu_tabular.stream, fastai_gpu_tabular.distributed

path, out, gpu = sys.argv[1], Path(sys.argv[2]), len(sys.argv) > 3 and sys.argv[3] == 'gpu'
state = PartialState(cpu=not gpu)
if gpu: use_rank_gpu()
set_seed(0)
dls = TabularDataLoaders.from_processed(path, bs=20_000, mem_bytes=1 << 21, device=state.device)  # no seed: rank 0's is broadcast

class Seen(Callback):
    def before_train(self): self.rows, self.n = [], 0
    def after_batch(self):
        if self.training: self.rows += self.yb[0].view(-1).long().tolist(); self.n += 1

seen = Seen()
learn = tabular_learner(dls, layers=[8], config=tabular_config(use_bn=False, bn_cont=False))
with learn.distrib_ctx(sync_bn=False): learn.fit(1, 1e-3, cbs=seen)
res = dict(rank=rank_distrib(), rows=seen.rows, n_train=seen.n, valid=[float(learn.recorder.values[-1][1])])
(out/f'rank{res["rank"]}.json').write_text(json.dumps(res))
if res['rank'] == 0: torch.save(get_model(learn.model).state_dict(), out/'model.pth')
end(state)  # no interpreter teardown: its C++ threads could abort a rank (dist_end.py)
