"""Streaming from parquet against resident data: `ParquetDataLoader` beside `BatchDataLoader`, in the same run.

    python bench/bench_stream.py --rows 25000000 --bs 65536 262144
    python bench/bench_stream.py --shape criteo --rows 30000000 --bs 65536 --emb-dim 16 128 --name stream_criteo
    accelerate launch --num_processes 2 bench/bench_stream.py --rows 25000000 --bs 65536 --name stream2   # 2 GPUs

On MovieLens-shaped rows (the benchmark schema) or Criteo-shaped ones (`synth_criteo`, ids capped at `--cap`, one
embedding width `--emb-dim` for every table, a row a width); layers [512,256]; `FastTabularModel`, bf16, `ForeachLamb`:
  (a) rows/s through `Learner.fit` over an epoch, resident (`to.dataloaders`, every row on the GPU) and streamed
      (`TabularDataLoaders.from_processed` with `mem_bytes` at `--mem-frac` of the processed training bytes), and their ratio
      (target: >= 0.8);
  (b) on one process, the loader alone over an epoch from page-cached files, and from files dropped from the page cache
      (`os.posix_fadvise(..., POSIX_FADV_DONTNEED)`), beside a parquet-reading baseline: pyarrow `iter_batches` of the batch
      size and `torch.as_tensor(...).to(device)` for each column, in file order with no shuffle.
Each rate is the median of `--repeats` runs. Under `accelerate launch`, (a) runs inside `distrib_ctx` on every GPU, and
rank 0 reports the rows of all ranks per second."""
import argparse, os, statistics, sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).parent))
from common import sync, report, learner_rate
import numpy as np, torch
from fastai.tabular.all import TabularDataLoaders, rank_distrib, num_distrib
from fastai_gpu_tabular.backend import gpu_available
from fastai.tabular.all import CategoryBlock
from fastai_gpu_tabular.data import synth_movielens, synth_tabular, synth_criteo, CRITEO_SCHEMA
from fastai_gpu_tabular.procs import Categorify, FillMissing, Normalize
from fastai_gpu_tabular.tabular import TabularGPU, RandomRowSplit
from fastai_gpu_tabular.learner import tabular_learner
from fastai_gpu_tabular.optimizer import ForeachLamb, SparseEmbedOpt
from functools import partial
from fastai_gpu_tabular.stream import ParquetDataLoader, ProcessedSplit
from fastai_gpu_tabular.distributed import use_rank_gpu
from fastai_gpu_tabular.comm import broadcast_object

p = argparse.ArgumentParser()
p.add_argument('--rows', type=int, default=25_000_000)
p.add_argument('--bs', type=int, nargs='+', default=[65536, 262144])
p.add_argument('--repeats', type=int, default=3)
p.add_argument('--mem-frac', type=float, default=0.1, help='mem_bytes as a share of the processed training bytes')
p.add_argument('--dir', default='/tmp/fgt_bench_stream', help='where the processed folder is written')
p.add_argument('--reader', default='pyarrow', choices=['pyarrow', 'cudf'], help="the streaming loader's `reader`")
p.add_argument('--name', default='stream', help='results file: bench/results/NAME.json')
p.add_argument('--row-group-rows', type=int, default=131_072, help="rows of the processed folder's row groups (default 131,072: "
               "`--mem-frac` 0.1 holds several; `to_parquet`'s own ~64 MiB ones are over half of it, and the loader refuses)")
p.add_argument('--shape', default='movielens', choices=['movielens', 'criteo'], help='the rows: `synth_movielens` or `synth_criteo`')
p.add_argument('--cap', type=int, default=500_000, help='criteo: most distinct ids of a column')
p.add_argument('--prefetch', type=int, nargs='+', default=[2], help="the streaming loader's windows read ahead at once, a row each")
p.add_argument('--emb-dim', type=int, nargs='+', default=None, help="one embedding width for every table, a row each (default: fastai's rule)")
p.add_argument('--emb-opt', default='dense', help="the tables' step: 'dense' (LAMB's) or a `SparseEmbedOpt` rule (packed tables, row-sparse)")
p.add_argument('--skip-loader', action='store_true', help='leave out the loader-alone rows (epochs of the loader by itself)')
a = p.parse_args()
assert gpu_available(), "this benchmark needs cuDF and a CUDA GPU"
world = int(os.environ.get('WORLD_SIZE', 1))
if world > 1:
    from accelerate import PartialState
    state = PartialState()
device = use_rank_gpu()
LAYERS, rank0 = [512, 256], int(os.environ.get('RANK', 0)) == 0

if a.shape == 'criteo':
    to = TabularGPU(synth_criteo(a.rows, cap=a.cap, gpu=True), procs=[Categorify, FillMissing, Normalize], splits=RandomRowSplit(0.2, 42),
                    y_block=CategoryBlock(), **CRITEO_SCHEMA)
else: to = synth_tabular(synth_movielens(a.rows, gpu=True))
path = Path(a.dir)/'processed'
if rank0: to.to_parquet(path, overwrite=True, row_group_rows=a.row_group_rows)
if world > 1: torch.distributed.barrier()
src = ProcessedSplit(path)
mem = int(src.nbytes.sum()*a.mem_frac)

def fit_rate(dls, bs, emb=None):
    kw = (dict(opt_func=ForeachLamb) if a.emb_opt == 'dense' else
          dict(config=dict(sparse=True), opt_func=partial(SparseEmbedOpt, opt_func=ForeachLamb, rule=a.emb_opt)))
    learn = tabular_learner(dls, layers=LAYERS, emb_szs=None if emb is None else {n: emb for n in dls.train_ds.cat_names}, **kw).to_bf16()
    if world == 1: return learner_rate(learn, bs, 10**12, a.repeats)[0]  # an epoch less the warm-up batches
    with learn.distrib_ctx(sync_bn=False): return learner_rate(learn, bs, 10**12, a.repeats)[0] * world

def epoch_rate(it_fn, rows, before=lambda: None):
    ts = []
    for _ in range(a.repeats):
        before(); sync(); t = time.perf_counter()
        for b in it_fn(): pass
        sync(); ts.append(time.perf_counter() - t)
    return rows / statistics.median(ts)

def drop_cache():
    for f in src.files:
        fd = os.open(f, os.O_RDONLY)
        try: os.fsync(fd); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally: os.close(fd)

def pyarrow_epoch(bs):
    import pyarrow.parquet as pq
    def it():
        for f in src.files:
            for b in pq.ParquetFile(f).iter_batches(batch_size=bs, columns=src.columns):
                yield [torch.as_tensor(b.column(i).to_numpy()).to(device) for i in range(b.num_columns)]
    return it

rows, meta = [], dict(bench='stream', shape=a.shape, emb_opt=a.emb_opt, cap=a.cap if a.shape == 'criteo' else None, reader=a.reader, n_rows=a.rows, train_rows=src.n, layers=LAYERS, repeats=a.repeats, world_size=world,
                      data_bytes=int(src.nbytes.sum()), mem_bytes=mem, row_groups=len(src.groups), row_group_rows=int(src.rows.max()))
for bs,emb,pf in [(bs, emb, pf) for bs in a.bs for emb in (a.emb_dim or [None]) for pf in a.prefetch]:
    if pf == a.prefetch[0]:  # the resident baseline: once a batch size and width
        res_dls = to.dataloaders(bs=bs, seed=0)
        resident = fit_rate(res_dls, bs, emb)
        del res_dls
    dls = TabularDataLoaders.from_processed(path, bs=bs, mem_bytes=mem, seed=0, reader=a.reader, prefetch=pf)
    streamed = fit_rate(dls, bs, emb)
    r = dict(bs=bs, emb=emb or 'rule', prefetch=pf, resident_fit=f'{resident/1e6:.2f}M', stream_fit=f'{streamed/1e6:.2f}M', ratio=f'{streamed/resident:.3f}',
             windows=len(dls.train.windows()))
    if world == 1 and emb == (a.emb_dim or [None])[0] and not a.skip_loader:  # the loader alone: once a batch size (and read-ahead)
        dl = ParquetDataLoader(path, bs=bs, shuffle=True, drop_last=True, mem_bytes=mem, seed=0, device=device, reader=a.reader, prefetch=pf)
        n = len(dl)*bs
        cached = epoch_rate(lambda: dl, n)
        cold = epoch_rate(lambda: dl, n, drop_cache)
        base = epoch_rate(pyarrow_epoch(bs), src.n)
        r.update(loader_cached=f'{cached/1e6:.1f}M', loader_cold=f'{cold/1e6:.1f}M', pyarrow_baseline=f'{base/1e6:.1f}M',
                 vs_baseline=f'{cached/base:.2f}')
    rows.append(r)
    del dls
if rank0:
    cols = ['bs', 'emb', 'prefetch', 'resident_fit', 'stream_fit', 'ratio', 'windows'] + (['loader_cached', 'loader_cold', 'pyarrow_baseline', 'vs_baseline'] if world == 1 else [])
    print(f"{a.shape}: {a.rows:,} rows ({src.n:,} training, {len(src.columns)} columns), {meta['data_bytes']/2**20:.0f} MiB of training rows, mem_bytes {mem/2**20:.0f} MiB, "
          f"{world} GPU(s); rows/s")
    report(a.name, rows, cols, meta)
