"""Run by tests/test_distributed.py: the docs' CPU notebook_launcher example (2 gloo processes, `distrib_ctx(in_notebook=True)`)."""
from accelerate import notebook_launcher
def train_cpu():
    from fastai.tabular.all import RocAucBinary, rank_distrib, num_distrib
    from fastai_gpu_tabular.all import movielens_tabular, movielens_sample, tabular_learner
    import fastai_gpu_tabular.distributed
    to = movielens_tabular(movielens_sample())
    learn = tabular_learner(to.dataloaders(bs=1024, seed=42, device='cpu'), layers=[64,32], metrics=RocAucBinary())
    with learn.distrib_ctx(in_notebook=True, sync_bn=False): learn.fit_one_cycle(1, 5e-3)
    print(f"rank {rank_distrib()} of {num_distrib()}: AUC {float(learn.recorder.values[-1][2]):.4f}", flush=True)
if __name__ == '__main__': notebook_launcher(train_cpu, num_processes=2)
