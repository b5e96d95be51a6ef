"""One process of bench/bench_dist.py, started by `accelerate launch`: `allreduce` times NCCL all-reduces; `ours` and
`fastai` time training batches inside fastai's `distrib_ctx` and write rank 0's figures to OUT/NAME.json."""
import argparse, json, os, statistics, sys, time, warnings
from pathlib import Path
sys.path.insert(0, str(Path(__file__).parent))
import torch
from accelerate import PartialState
from common import learner_rate
import fastai.distributed
from fastai_gpu_tabular.distributed import ddp_kwargs  # `Learner.distrib_ctx`; `BatchDataLoader` shards itself

p = argparse.ArgumentParser()
p.add_argument('what', choices=['allreduce', 'ours', 'fastai'])
p.add_argument('out')
p.add_argument('--rows', type=int, default=25_000_000)
p.add_argument('--bs', type=int, default=65536)
p.add_argument('--rows-timed', type=int, default=6_000_000)
p.add_argument('--repeats', type=int, default=3)
p.add_argument('--precision', default='bf16')
p.add_argument('--bf16-grads', action='store_true')
p.add_argument('--bucket-view', action='store_true')
p.add_argument('--profile', action='store_true', help="print torch.profiler's top kernels over 10 steps (sparse exchange on)")
p.add_argument('--sparse-embeddings', action='store_true', help="the embedding rows a step touched exchanged by `SparseEmbeddingGrads` (`sparse_tables`' rule)")
a = p.parse_args()
state = PartialState()
torch.cuda.set_device(state.local_process_index)
world, rank = state.num_processes, state.process_index
res = dict(what=a.what, world_size=world)

if a.what == 'allreduce':
    for mb in (64, 256, 1024):
        x = torch.ones(mb * 2**20 // 4, device='cuda')
        for _ in range(3): torch.distributed.all_reduce(x)
        torch.cuda.synchronize(); t = time.perf_counter()
        for _ in range(10): torch.distributed.all_reduce(x)
        torch.cuda.synchronize(); dt = (time.perf_counter() - t) / 10
        res[f'{mb}MB_ms'] = round(dt * 1e3, 3)
        res[f'{mb}MB_busbw_GBs'] = round(2 * (world - 1) / world * x.numel() * 4 / dt / 1e9, 1)  # nccl-tests' bus bandwidth
else:
    from fastai.tabular.all import CategoryBlock, Lamb, ProgressCallback, set_seed, TabularPandas
    from fastai_gpu_tabular.data import synth_movielens, BENCH_MH, synth_tabular
    from fastai_gpu_tabular.tabular import random_splits
    set_seed(0)
    df = synth_movielens(a.rows, gpu=a.what == 'ours')
    tr, va = random_splits(a.rows)
    if a.what == 'ours':
        from fastai_gpu_tabular.procs import Categorify, FillMissing, Normalize
        from fastai_gpu_tabular.tabular import TabularGPU
        from fastai_gpu_tabular.learner import tabular_learner
        from fastai_gpu_tabular.optimizer import ForeachLamb, ExcludeEmbeddings
        to = synth_tabular(df.drop(columns=list(BENCH_MH)), splits=random_splits(a.rows, like=df))
        learn = tabular_learner(to.dataloaders(bs=a.bs, seed=0), layers=[512, 256], opt_func=ForeachLamb)
        learn.add_cb(ExcludeEmbeddings())
        res['setup'] = 'TabularGPU + BatchDataLoader + FastTabularModel, ForeachLamb (fused)'
    else:  # stock fastai, the comparison: 2 categorical + 1 continuous column, fastai's Lamb
        from fastai.tabular.all import Categorify, FillMissing, Normalize, tabular_learner
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')
            to = TabularPandas(df[['userId', 'movieId', 'days', 'target']], procs=[Categorify, FillMissing, Normalize], cat_names=['userId', 'movieId'],
                               cont_names=['days'], y_names='target', y_block=CategoryBlock(), splits=[tr.tolist(), va.tolist()])
        learn = tabular_learner(to.dataloaders(bs=a.bs, device=f'cuda:{state.local_process_index}'), layers=[512, 256], opt_func=Lamb)
        res['setup'] = 'TabularPandas + TabDataLoader (DistributedDL) + TabularModel, fastai Lamb'
    del df
    if a.precision == 'bf16': learn.to_bf16()
    learn.remove_cb(ProgressCallback)
    n_batches = len(learn.dls.train) // world
    res.update(bf16_grads=a.bf16_grads, bucket_view=a.bucket_view, sparse_embeddings=a.sparse_embeddings)
    with learn.distrib_ctx(sync_bn=False, **ddp_kwargs(a.bf16_grads, a.bucket_view, sparse_embeddings=None if a.sparse_embeddings else False)):
        rate, ts = learner_rate(learn, a.bs, min(a.rows_timed, (n_batches - 4) * a.bs), a.repeats, warm=3)
        sp = getattr(learn, 'sparse_embedding_grads', None)
        if sp is not None and sp.names:  # the exchange alone, timed over 20 steps after the timed runs (a sync around each)
            ms, step = [], sp.before_step
            def timed_step():
                torch.cuda.synchronize(); t = time.perf_counter(); step(); torch.cuda.synchronize(); ms.append((time.perf_counter() - t) * 1e3)
            sp.before_step = timed_step
            learner_rate(learn, a.bs, 20 * a.bs, 1, warm=1)
            del sp.before_step
            if a.profile:
                from torch.profiler import profile, ProfilerActivity
                with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof: learner_rate(learn, a.bs, 10 * a.bs, 1, warm=1)
                if rank == 0: print(prof.key_averages().table(sort_by='device_time_total', row_limit=25), flush=True)
            res.update(sparse_tables=sp.names, sparse_rows=sp.rows, table_params=[p.numel() for p in sp.params], exchange_MB=round(sp.bytes / 2**20, 1), exchange_ms=round(statistics.median(ms), 3))
    res.update(rows=a.rows, bs_per_gpu=a.bs, precision=a.precision, rows_s=round(rate * world), times=[round(t, 4) for t in ts],
               step_ms=round(a.bs / rate * 1e3, 3), n_params=sum(p.numel() for p in learn.model.parameters()))
if rank == 0:
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out)/f"{a.what}_{world}{'_bf16g' if a.bf16_grads else ''}{'_sparse' if a.sparse_embeddings else ''}.json").write_text(json.dumps(res, indent=1))
    print(res, flush=True)
