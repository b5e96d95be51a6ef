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
out = Path(tempfile.mkdtemp())

def launch(n, *args, tag=''):
    cmd = [sys.executable, '-m', 'accelerate.commands.launch', '--num_processes', str(n), '--num_machines', '1', '--mixed_precision', 'no',
           '--dynamo_backend', 'no'] + (['--multi_gpu'] if n > 1 else []) + [str(here/'dist_bench_worker.py'), *map(str, args), '--bs', str(a.bs)]
    print(' '.join(cmd[3:]), flush=True)
    subprocess.run(cmd, check=True)
    return json.loads((out/f'{args[0]}_{n}{tag}.json').read_text())

ar = launch(2, 'allreduce', out)
runs = {(w, n): launch(n, w, out, '--rows', a.rows if w == 'ours' else a.fastai_rows, '--precision', 'bf16' if w == 'ours' else 'fp32',
                       *(['--bucket-view'] if w == 'ours' and a.bucket_view else []))
        for w in (['ours'] + ([] if a.skip_fastai else ['fastai'])) for n in (1, 2)}
runs[('ours, bf16 gradients', 1)] = runs[('ours', 1)]
runs[('ours, bf16 gradients', 2)] = launch(2, 'ours', out, '--rows', a.rows, '--precision', 'bf16', '--bf16-grads', *(['--bucket-view'] if a.bucket_view else []), tag='_bf16g')
bw = ar['1024MB_busbw_GBs']
rows = [dict(run='NCCL all-reduce, 2 GPUs', **{k: v for k, v in ar.items() if k.endswith(('_ms', '_GBs'))})]
for w in ['ours', 'ours, bf16 gradients'] + ([] if a.skip_fastai else ['fastai']):
    one, two = runs[(w, 1)], runs[(w, 2)]
    grad_mb = one['n_params'] * (2 if 'bf16 gradients' in w else 4) / 2**20
    ar_ms = grad_mb * 2**20 / (bw * 1e9) * 1e3  # 2 GPUs: each sends and receives the gradient once
    rows.append(dict(run=w, setup=one['setup'], precision=one['precision'], rows=one['rows'], bs_per_gpu=one['bs_per_gpu'],
                     rows_s_1gpu=one['rows_s'], rows_s_2gpu=two['rows_s'], scaling=round(two['rows_s'] / one['rows_s'], 3),
                     step_ms_1gpu=one['step_ms'], step_ms_2gpu=two['step_ms'], grad_MB=round(grad_mb), allreduce_ms_at_measured_bw=round(ar_ms, 3),
                     scaling_if_no_overlap=round(2 * one['step_ms'] / (one['step_ms'] + ar_ms), 3)))
    print(rows[-1], flush=True)
print('\n2 GPUs against 1 through Learner.fit in distrib_ctx (accelerate launch)')
report('dist', rows, ['run', 'precision', 'rows', 'bs_per_gpu', 'rows_s_1gpu', 'rows_s_2gpu', 'scaling', 'step_ms_1gpu', 'step_ms_2gpu',
                      'grad_MB', 'allreduce_ms_at_measured_bw', 'scaling_if_no_overlap', '1024MB_busbw_GBs'], dict(bench='dist', bs=a.bs))
