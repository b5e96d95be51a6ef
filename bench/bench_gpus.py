"""`fgt-train` on 1, 2, 4 ... GPUs of one machine, as a user launches it: one epoch from a processed folder each, the training
rows/s of all GPUs together against one GPU's in the same round, the wall time of each launch, its phases and AUC. In round 1
each launch compiles Triton's kernels as a first run on a machine does (an empty `TRITON_CACHE_DIR` of its own; the folder's
pages stay in the OS cache after the first); `--rounds 2` adds a warm round, and with more the warm rounds are summed up per count:
the median of its launches' rates against the first count's median (one GPU's epoch moves by up to 30% between launches).

    python bench/bench_gpus.py --data <processed folder> --gpus 1 2 4 -- --bs 65536

Each count is a fresh `accelerate launch` (`python -m accelerate.commands.launch --num_processes N -m fastai_gpu_tabular.train
--data D --epochs 1 --overwrite --out ...`, with the arguments after `--`), or with `--launcher fgt` `fgt-train --num-processes N`. Targets (issue 54): 2 GPUs >= 1.8x one, 4 >= 3.4x;
a launch's wall time <= 1.3x its training phase; AUC within 0.002 of one GPU's."""
import argparse, json, os, subprocess, sys, tempfile, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).parent))
from common import report

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument('--data', required=True, help='a processed folder (fgt-prep --out)')
p.add_argument('--gpus', type=int, nargs='+', default=[1, 2])
p.add_argument('--rounds', type=int, default=1, help='rounds over the counts: the first is a first run, the others warm')
p.add_argument('--name', default='gpus')
p.add_argument('--launcher', default='accelerate', choices=['accelerate', 'fgt'],
               help="'accelerate': `accelerate launch --num_processes N -m fastai_gpu_tabular.train`; 'fgt': `fgt-train --num-processes N` "
                    "(its own launch, torch not imported before the ranks start)")
a, rest = p.parse_known_args()
rest = [o for o in rest if o != '--']
env = dict(os.environ, NCCL_NVLS_ENABLE='0', TORCH_SYMM_MEM_DISABLE_MULTICAST='1', NVSHMEM_DISABLE_NVLS='1')
rows, tmp = [], Path(tempfile.mkdtemp())
for rnd in range(1, a.rounds+1):
    for n in a.gpus:
        out = tmp/f'run{n}'
        run = ['--data', a.data, '--epochs', '1', '--overwrite', '--out', str(out), *rest]
        cmd = ([sys.executable, '-m', 'accelerate.commands.launch', '--num_processes', str(n), '--num_machines', '1', '--mixed_precision',
                'no', '--dynamo_backend', 'no'] + (['--multi_gpu'] if n > 1 else []) + ['-m', 'fastai_gpu_tabular.train', *run]
               if a.launcher == 'accelerate' else  # `fgt-train`'s console script, installed or not
               [sys.executable, '-c', 'from fastai_gpu_tabular.cli import train; train()', '--num-processes', str(n), *run])
        print(' '.join(cmd[3:]) if a.launcher == 'accelerate' else 'fgt-train ' + ' '.join(cmd[3:]), flush=True)
        cache = tmp/f'triton{n}'  # each count's own: round 1 compiles for every count alike, later rounds reuse it
        t0 = time.perf_counter(); subprocess.run(cmd, check=True, env=dict(env, TRITON_CACHE_DIR=str(cache))); wall = time.perf_counter() - t0
        m = json.loads((out/'metrics.json').read_text())
        rows.append(dict(round=rnd, gpus=n, train_rows_s=m['train_rows_s'], wall_s=wall, train_s=m['phases_s']['train'],
                         auc=m.get('roc_auc_score'), cuda_graph=m['cuda_graph'], phases_s=m['phases_s'],
                         capture_s=m.get('cuda_graph_capture_s')))
for r in rows:
    one = next(o['train_rows_s'] for o in rows if o['round'] == r['round'])  # the round's first count
    r.update(vs_first=r['train_rows_s']/one, wall_over_train=r['wall_s']/r['train_s'])
for r in rows: r.update({k: round(v, 3) for k, v in r.items() if isinstance(v, float)})

def warm_summary(rows):
    "Each count's warm rounds (2 on): the median of its launches' rates, their range, the median over the first count's median"
    import statistics
    warm = [r for r in rows if r['round'] > 1]
    med = {n: statistics.median(r['train_rows_s'] for r in warm if r['gpus'] == n) for n in dict.fromkeys(r['gpus'] for r in warm)}
    return [dict(gpus=n, launches=sum(r['gpus'] == n for r in warm), median_rows_s=round(m), vs_first=round(m/next(iter(med.values())), 3),
                 lo_rows_s=min(r['train_rows_s'] for r in warm if r['gpus'] == n), hi_rows_s=max(r['train_rows_s'] for r in warm if r['gpus'] == n))
            for n,m in med.items()]

summary = warm_summary(rows)
report(a.name, rows, ['round', 'gpus', 'train_rows_s', 'vs_first', 'train_s', 'wall_s', 'wall_over_train', 'auc', 'cuda_graph', 'capture_s'],
       dict(bench='gpus', data=a.data, args=rest, launcher=a.launcher, warm_summary=summary))
if summary:  # one GPU's epoch moves by up to 30% between launches (bench/NOTES.md, session 46): a ratio wants several of each
    print('\nwarm rounds, each count\'s launches:')
    cols = ['gpus', 'launches', 'median_rows_s', 'vs_first', 'lo_rows_s', 'hi_rows_s']
    print('  '.join(cols))
    for r in summary: print('  '.join(str(r[c]).ljust(len(c)) for c in cols))
