"""Run by test_gpu2_distributed.py: the docs' notebook example as a script. accelerate's `notebook_launcher` forks one
process per GPU (CUDA untouched in this parent), and each preprocesses on its own GPU and trains in fastai's
`distrib_ctx(in_notebook=True)`; each writes what it saw to OUT/rank{R}.json."""
import json, sys
from pathlib import Path
from accelerate import notebook_launcher

def train(out):
    import torch
    import fastai.distributed
    from fastai.tabular.all import CategoryBlock, RocAucBinary, Callback, set_seed, rank_distrib
    from fastai_gpu_tabular.procs import Categorify, FillMissing, Normalize
    from fastai_gpu_tabular.tabular import TabularGPU
    from fastai_gpu_tabular.learner import tabular_learner
    from fastai_gpu_tabular.data import synth_movielens, synth_tabular
    from fastai_gpu_tabular.distributed import use_rank_gpu
    device = use_rank_gpu()
    set_seed(0)
    n = 10_007
    to = synth_tabular(synth_movielens(n, n_users=300, n_items=100, gpu=True))
    class Seen(Callback):
        def before_train(self): self.rows, self.dev = torch.cat(self.dl.batch_idxs(self.dl.order())).tolist(), str(self.dl.device)
    seen = Seen()
    learn = tabular_learner(to.dataloaders(bs=500, seed=0), layers=[32, 16], metrics=RocAucBinary())
    with learn.distrib_ctx(in_notebook=True, sync_bn=False):
        learn.fit(1, 1e-2, cbs=seen)
        auc = float(learn.recorder.values[-1][2])
        preds, _ = learn.get_preds()
    (Path(out)/f'rank{rank_distrib()}.json').write_text(json.dumps(dict(rows=seen.rows, loader_device=seen.dev, device=str(device),
                                                                          n_preds=len(preds), auc=auc)))

if __name__ == '__main__':
    notebook_launcher(train, (sys.argv[1],), num_processes=2)
