"""The billion-row click-log run (issue 31): Criteo-shaped rows generated on every GPU, `fgt-prep --dask` on a worker a GPU,
one epoch of `fgt-train` in a process a GPU (`accelerate launch`) at its defaults (`--train-flags` adds flags), and the
training's scaling: the same rows on 1, 2, ... GPUs (`--stop-after`), the commands as a user types them.

    python bench/bench_billion.py --rows 1000000000 --raw /dev/shm/raw --dir /tmp/billion          # 2 x H200
    python bench/bench_billion.py --rows 1000000000 --steps scale --dir /tmp/billion               # the ratio alone
    python bench/bench_billion.py --rows 200000 --cpu --dir /tmp/b                                 # a CPU rehearsal (2 processes)

Steps (`--steps`, in this order): gen (`synth_criteo(rank=, world_size=)`, one process a GPU, into `--raw`), prep (`fgt-prep
--dask`; `--raw` deleted after it unless `--keep-raw`: the processed folder and the raw files together may not fit the
disk), train (one epoch), scale (`--scale-batches` batches a process on all GPUs, as many rows in all on each count of
`--scale-gpus`: the first GPUs, by `CUDA_VISIBLE_DEVICES`).
Each phase: wall seconds as the user waits (imports and cluster start included), rows/s, bytes read and written (the
folders' sizes and the disks' counters), peak memory of every GPU (nvidia-smi, sampled every 0.5 s) and of the host (the
phase's processes' resident memory, summed), and the run's own phases from its output. Written to results/`--name`.json.
An epoch reads its processed folder as fast as `--dir`'s storage gives it: on the device machines' disk the billion-row
epochs re-read all 59.7 GB from the block device (the page cache kept none), 0.64 GB/s on 4 GPUs; `--dir /dev/shm/billion`
(with `--raw` there too, 120 GB of memory at 1B) takes the disk out of the epoch."""
import argparse, json, os, re, shutil, subprocess, sys, threading, time
from pathlib import Path
import psutil
sys.path.insert(0, str(Path(__file__).parent))
from common import report

ROOT = Path(__file__).parent.parent
CATS, CONTS = ','.join(f'C{i}' for i in range(1, 27)), ','.join(f'I{i}' for i in range(1, 14))

def gpu_count(cpu):
    if cpu: return 0
    r = subprocess.run(['nvidia-smi', '--query-gpu=index', '--format=csv,noheader'], capture_output=True, text=True)
    return len(r.stdout.split())

class Monitor:
    "Peaks of each GPU's used memory and of the processes' summed RSS, sampled every `every` seconds while a phase runs"
    def __init__(self, procs, gpus, every=0.5):
        self.procs, self.gpus, self.every, self.gpu_peak, self.rss_peak = procs, gpus, every, [0]*gpus, 0
        self.done = threading.Event(); self.t = threading.Thread(target=self.run, daemon=True); self.t.start()
    def run(self):
        while not self.done.is_set():
            rss = 0
            for p in list(self.procs):
                try: rss += sum(q.memory_info().rss for q in [p, *p.children(recursive=True)])
                except psutil.Error: pass
            self.rss_peak = max(self.rss_peak, rss)
            if self.gpus:
                r = subprocess.run(['nvidia-smi', '--query-gpu=memory.used', '--format=csv,noheader,nounits'], capture_output=True, text=True)
                self.gpu_peak = [max(a, int(b)) for a, b in zip(self.gpu_peak, r.stdout.split())]
            self.done.wait(self.every)
    def stop(self): self.done.set(); self.t.join()

def folder_bytes(p): return sum(f.stat().st_size for f in Path(p).rglob('*') if f.is_file()) if Path(p).exists() else 0

def phase(name, cmds, gpus, log, envs=None, timeout=None):
    "Run `cmds` (lists) at once, wait for all (at most `timeout` seconds: then stopped, with their children); wall time, peaks, disks, output"
    print(f'== {name}:', *[' '.join(map(str, c)) for c in cmds], sep='\n  ', flush=True)
    io0, t0 = psutil.disk_io_counters(), time.perf_counter()
    procs = [subprocess.Popen(list(map(str, c)), cwd=ROOT, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              start_new_session=True) for c, e in zip(cmds, envs or [None]*len(cmds))]
    mon = Monitor([psutil.Process(p.pid) for p in procs], gpus)
    def wait(p):
        try: return p.communicate(timeout=max(1, timeout - (time.perf_counter() - t0)) if timeout else None)[0]
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, 9); out = p.communicate()[0]
            return out + f'\n{name}: stopped after {timeout} s (--phase-timeout)\n'
    outs = [wait(p) for p in procs]
    secs = time.perf_counter() - t0; mon.stop(); io1 = psutil.disk_io_counters()
    for o in outs: log.write(o); print(o[-3000:], flush=True)
    if any(p.returncode for p in procs): raise SystemExit(f'{name} failed: return codes {[p.returncode for p in procs]}')
    return dict(phase=name, seconds=round(secs, 2), gpu_peak_GiB=[round(g/1024, 1) for g in mon.gpu_peak],
                host_rss_peak_GiB=round(mon.rss_peak/2**30, 1), disk_read_GB=round((io1.read_bytes-io0.read_bytes)/1e9, 1),
                disk_written_GB=round((io1.write_bytes-io0.write_bytes)/1e9, 1),
                commands=[' '.join(map(str, c)).replace(sys.executable, 'python3') for c in cmds]), outs

def launch(n, cpu):
    "A process a GPU: `accelerate launch` (torch's launcher on the CPU, as the tests); one process: plain python"
    if n == 1: return [sys.executable]
    if cpu: return [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node', n]
    return [sys.executable, '-m', 'accelerate.commands.launch', '--num_processes', n, '--num_machines', 1, '--mixed_precision', 'no',
            '--dynamo_backend', 'no', '--multi_gpu']

def train_cmd(a, n, out, *extra):
    return [*launch(n, a.cpu), '-m', 'fastai_gpu_tabular.train', '--data', Path(a.dir)/'processed', '--epochs', 1, *a.train_flags.split(),
            '--out', out, '--overwrite', *(['--cpu'] if a.cpu else []), *extra]

def main():
    p = argparse.ArgumentParser()
    p.add_argument('--rows', type=int, default=1_000_000_000)
    p.add_argument('--raw', default=None, help='folder of the generated files (default: DIR/raw)')
    p.add_argument('--dir', default='/tmp/billion', help='the processed folder and the runs go here')
    p.add_argument('--steps', default='gen,prep,train,scale')
    p.add_argument('--cap', type=int, default=None, help="most ids of a column (default: Criteo Kaggle's counts, up to 10.1M)")
    p.add_argument('--freq-threshold', type=int, default=15, help="fgt-prep's: ids seen fewer times in training are `#rare#`")
    p.add_argument('--file-rows', type=int, default=5_000_000)
    p.add_argument('--train-flags', default='', help="fgt-train's flags besides --data, --epochs 1 and --out (default: none, its "
                   "defaults), e.g. '--bs 65536 --lr 0.01 --emb-rule fixed --emb-dim 16 --emb-opt rowwise-adagrad --precision bf16'")
    p.add_argument('--scale-batches', type=int, default=1000, help='scale: batches a process on all GPUs (as many rows on fewer)')
    p.add_argument('--scale-gpus', default='', help='scale: counts of GPUs, e.g. 1,2,4 (default: 1 and all)')
    p.add_argument('--keep-raw', action='store_true')
    p.add_argument('--cpu', action='store_true', help='pandas, the CPU and 2 processes (a rehearsal of the commands)')
    p.add_argument('--name', default='billion')
    p.add_argument('--append', action='store_true', help="keep the rows of results/NAME.json (steps run in several calls)")
    p.add_argument('--phase-timeout', type=float, default=900, help='seconds a phase may take before it is stopped (0: no limit)')
    a = p.parse_args()
    for k, v in dict(NCCL_NVLS_ENABLE='0', TORCH_SYMM_MEM_DISABLE_MULTICAST='1', NVSHMEM_DISABLE_NVLS='1').items(): os.environ.setdefault(k, v)
    os.environ['PYTHONPATH'] = os.pathsep.join([str(ROOT), os.environ.get('PYTHONPATH', '')])
    gpus, steps, d = gpu_count(a.cpu), a.steps.split(','), Path(a.dir)
    world = max(gpus, 1) if not a.cpu else 2
    raw, proc = Path(a.raw or d/'raw'), d/'processed'
    d.mkdir(parents=True, exist_ok=True)
    rows, log = [], open(d/'log.txt', 'a')
    res_file = ROOT/'bench'/'results'/f'{a.name}.json'
    if a.append and res_file.exists(): rows = json.loads(res_file.read_text())['rows']
    meta = dict(bench='billion', n_rows=a.rows, gpus=gpus, cap=a.cap, freq_threshold=a.freq_threshold, train_flags=a.train_flags, disk={str(x): shutil.disk_usage(x).total for x in {d, raw.parent} if x.exists()})
    def save(): report(a.name, rows, ['phase', 'seconds', 'rows_s', 'gpu_peak_GiB', 'host_rss_peak_GiB', 'read_GB', 'written_GB', 'vs_1_gpu'], meta)
    if 'gen' in steps:
        code = ("import sys; from fastai_gpu_tabular.data import synth_criteo; r,w = map(int, sys.argv[1:]); "
                f"synth_criteo({a.rows}, cap={a.cap}, path={str(raw)!r}, file_rows={a.file_rows}, rank=r, world_size=w, overwrite=True, gpu={not a.cpu})")
        envs = [dict(os.environ, **({} if a.cpu else {'CUDA_VISIBLE_DEVICES': str(r)})) for r in range(world)]
        r, _ = phase('generate', [[sys.executable, '-c', code, r, world] for r in range(world)], gpus, log, envs, a.phase_timeout)
        rows.append(dict(r, rows_s=round(a.rows/r['seconds']), written_GB=round(folder_bytes(raw)/1e9, 2))); save()
    if 'prep' in steps:
        cmd = [sys.executable, '-m', 'fastai_gpu_tabular.data', '--dask', '--data', raw, '--cat-names', CATS, '--cont-names', CONTS,
               '--y-names', 'label', '--freq-threshold', a.freq_threshold, '--out', proc, '--overwrite', *(['--cpu'] if a.cpu else [])]
        r, (out,) = phase('fgt-prep --dask', [cmd], gpus, log, timeout=a.phase_timeout)
        inner = re.search(r'processed in ([\d.]+)s', out)
        vocab = re.search(r'vocabulary sizes: (\{.*\})', out)
        rows.append(dict(r, rows_s=round(a.rows/r['seconds']), read_GB=round(folder_bytes(raw)/1e9, 2), written_GB=round(folder_bytes(proc)/1e9, 2),
                         processed_s=float(inner[1]) if inner else None, workers=world,
                         ids=sum(v for k, v in json.loads(vocab[1].replace("'", '"')).items() if not k.endswith('_na')) if vocab else None))
        save()
        if not a.keep_raw: shutil.rmtree(raw, ignore_errors=True)
    def train(name, n, out, *extra):
        env = None if a.cpu or n == world else [dict(os.environ, CUDA_VISIBLE_DEVICES=','.join(map(str, range(n))))]
        r, _ = phase(name, [train_cmd(a, n, out, *extra)], gpus, log, env, a.phase_timeout)
        m = json.loads((Path(out)/'metrics.json').read_text())
        r.update(rows_s=round(m['train_rows_s']), run_phases_s={k: round(v, 2) for k, v in m['phases_s'].items()},
                 auc=m.get('roc_auc_score'), processes=n, read_GB=round(folder_bytes(proc)/1e9, 2), written_GB=round(folder_bytes(out)/1e9, 2),
                 params=m.get('model', {}).get('params'), **{k: m[k] for k in ('bs', 'lr', 'opt', 'precision', 'emb_opt', 'cuda_graph', 'cuda_graph_capture_s') if k in m})
        rows.append(r); save(); return r
    if 'train' in steps:
        r = train('fgt-train, 1 epoch', world, d/'run')
    done = [x for x in rows if x['phase'] in ('fgt-prep --dask', 'fgt-train, 1 epoch')]
    if len(done) == 2:
        t = sum(x['seconds'] for x in done); meta['end_to_end'] = dict(seconds=round(t, 1), rows_s=round(a.rows/t)); save()
    if 'scale' in steps and world > 1:
        ns, one = [int(n) for n in a.scale_gpus.split(',')] if a.scale_gpus else [1, world], None
        for n in ns:
            b = world*a.scale_batches//n
            r = train(f'fgt-train, {b} batches a process, {n} process(es)', n, d/f'run{n}', '--stop-after', b)
            one = one or r; r['vs_1_gpu'] = round(r['rows_s']/one['rows_s'], 3); save()
    print(f'results: {res_file}', json.dumps(meta.get('end_to_end')), flush=True)

if __name__ == '__main__': main()
