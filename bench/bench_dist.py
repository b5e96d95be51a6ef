"""Two GPUs against one: the all-reduce bandwidth between them first, then training rows/s through `Learner.fit` inside
fastai's `distrib_ctx`, launched with `accelerate launch`, at the same batch per GPU and precision.

    python bench/bench_dist.py --rows 25000000 --bs 65536

  (a) NCCL all-reduce of 64 MB / 256 MB / 1 GB fp32 between the two GPUs: time and bus bandwidth (as nccl-tests count it)
  (b) ours: TabularGPU + BatchDataLoader + FastTabularModel + ForeachLamb, bf16, on `--rows` rows of the benchmark schema,
      1 GPU and 2 GPUs (`--bs` rows a batch on each GPU); rows/s of all GPUs together; and 2 GPUs
      with the gradients all-reduced in bf16 (`ddp_kwargs(bf16_grads=True)`)
  (c) stock fastai for comparison: TabularPandas + TabDataLoader (fastai's DistributedDL) + TabularModel + fastai's Lamb,
      fp32, `--fastai-rows` rows, 2 categorical + 1 continuous column, 1 and 2 GPUs
Target (issue 5): (b) on 2 GPUs >= 1.8 x 1 GPU. The table adds the arithmetic: the gradient bytes of a step, their
all-reduce time at the measured bandwidth, and the scaling that would follow if none of it overlapped the backward pass."""
import argparse, json, subprocess, sys, tempfile
from pathlib import Path
sys.path.insert(0, str(Path(__file__).parent))
from common import report

p = argparse.ArgumentParser()
p.add_argument('--rows', type=int, default=25_000_000)
p.add_argument('--fastai-rows', type=int, default=12_000_000)
p.add_argument('--bs', type=int, default=65536)
p.add_argument('--skip-fastai', action='store_true')
p.add_argument('--bucket-view', action='store_true', help="ours with DDP's gradient_as_bucket_view (slower when measured)")
a = p.parse_args()
here = Path(__file__).parent

def paper_model(bs, bw, worlds=(2, 4, 8), width=600, mlp_params=1_000_000):
    """Bytes each rank receives a step, and their time at `bw` GB/s, for the MovieLens-25M tables (162,542 users, 59,048 movies,
    `width` columns, fp32) on `worlds` GPUs at `bs` rows each: dense ring all-reduce 2(w-1)/w·N rows; all-gather of each rank's
    touched rows (w-1)·max u; all-reduce over the union of touched rows 2(w-1)/w·|U| plus the indices' all-gather. Touched
    rows are counted on iid batches of `synth_movielens` (the rows of a shuffled epoch), on the CPU."""
    import numpy as np
    from fastai_gpu_tabular.data import synth_movielens
    from fastai_gpu_tabular.distributed import expected_rows
    df = synth_movielens(max(worlds) * bs, gpu=False, seed=1)
    tabs = {'userId': 162_542, 'movieId': 59_048}
    res = []
    for w in worlds:
        mlp = 2 * (w - 1) / w * mlp_params * 4
        dense = mlp + sum(2 * (w - 1) / w * n * width * 4 for n in tabs.values())
        gather, union, rule = mlp, mlp, mlp
        for c, n in tabs.items():
            ids = df[c].to_numpy()[:w * bs].reshape(w, bs)
            u, U = max(len(np.unique(r)) for r in ids), len(np.unique(ids))
            gather += (w - 1) * u * (width * 4 + 8)
            union += (w - 1) * u * 8 + 2 * (w - 1) / w * U * width * 4
            sparse = w * expected_rows(n, bs) < 2 * n  # `sparse_tables`' rule
            rule += (w - 1) * u * (width * 4 + 8) if sparse else 2 * (w - 1) / w * n * width * 4
        res.append(dict(gpus=w, **{f'{k}_MB': round(v / 2**20) for k, v in [('dense', dense), ('rule', rule), ('gather_all', gather), ('union_all', union)]},
                        **{f'{k}_ms': round(v / (bw * 1e9) * 1e3, 2) for k, v in [('dense', dense), ('rule', rule), ('gather_all', gather), ('union_all', union)]}))
    return res
out = Path(tempfile.mkdtemp())

def launch(n, *args, tag=''):
    cmd = [sys.executable, '-m', 'accelerate.commands.launch', '--num_processes', str(n), '--num_machines', '1', '--mixed_precision', 'no',
           '--dynamo_backend', 'no'] + (['--multi_gpu'] if n > 1 else []) + [str(here/'dist_bench_worker.py'), *map(str, args), '--bs', str(a.bs)]
    print(' '.join(cmd[3:]), flush=True)
    subprocess.run(cmd, check=True)
    return json.loads((out/f'{args[0]}_{n}{tag}.json').read_text())

ar = launch(2, 'allreduce', out)
bv = ['--bucket-view'] if a.bucket_view else []
runs = {('ours', 1): launch(1, 'ours', out, '--rows', a.rows, '--precision', 'bf16', *bv)}
for w, flags, tag in [('ours, sparse embeddings', ['--sparse-embeddings'], '_sparse'), ('ours, dense embeddings', [], ''),
                      ('ours, sparse, bf16 gradients', ['--sparse-embeddings', '--bf16-grads'], '_bf16g_sparse')]:
    runs[(w, 1)], runs[(w, 2)] = runs[('ours', 1)], launch(2, 'ours', out, '--rows', a.rows, '--precision', 'bf16', *flags, *bv, tag=tag)
if not a.skip_fastai:
    for n in (1, 2): runs[('fastai', n)] = launch(n, 'fastai', out, '--rows', a.fastai_rows, '--precision', 'fp32')
bw = ar['1024MB_busbw_GBs']
rows = [dict(run='NCCL all-reduce, 2 GPUs', **{k: v for k, v in ar.items() if k.endswith(('_ms', '_GBs'))})]
for w in [k for k, n in runs if n == 2]:
    one, two = runs[(w, 1)], runs[(w, 2)]
    grad_mb = one['n_params'] * (2 if 'bf16 gradients' in w else 4) / 2**20
    sent_mb = grad_mb if 'sparse' not in w else two['exchange_MB'] + (one['n_params'] - sum(two['table_params'])) * (2 if 'bf16' in w else 4) / 2**20
    ar_ms = sent_mb * 2**20 / (bw * 1e9) * 1e3  # 2 GPUs: each receives the exchanged bytes once
    rows.append(dict(run=w, setup=one['setup'], precision=one['precision'], rows=one['rows'], bs_per_gpu=one['bs_per_gpu'],
                     rows_s_1gpu=one['rows_s'], rows_s_2gpu=two['rows_s'], scaling=round(two['rows_s'] / one['rows_s'], 3),
                     step_ms_1gpu=one['step_ms'], step_ms_2gpu=two['step_ms'], MB_per_step=round(sent_mb), exchange_ms=two.get('exchange_ms'),
                     sparse_tables=','.join(t.split('.')[1] for t in two.get('sparse_tables', [])) or None,
                     comm_ms_at_measured_bw=round(ar_ms, 3), scaling_if_no_overlap=round(2 * one['step_ms'] / (one['step_ms'] + ar_ms), 3)))
    print(rows[-1], flush=True)
print('\n2 GPUs against 1 through Learner.fit in distrib_ctx (accelerate launch)')
report('dist', rows, ['run', 'precision', 'bs_per_gpu', 'rows_s_1gpu', 'rows_s_2gpu', 'scaling', 'step_ms_1gpu', 'step_ms_2gpu',
                      'MB_per_step', 'exchange_ms', 'sparse_tables', 'comm_ms_at_measured_bw', 'scaling_if_no_overlap', '1024MB_busbw_GBs'],
       dict(bench='dist', bs=a.bs, paper=paper_model(a.bs, bw)))
