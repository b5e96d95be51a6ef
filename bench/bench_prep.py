"""`fgt-prep --dask` as a user runs it, once: a fresh process on each input layout of issue 53, its processing seconds and its wall.

    python bench/bench_prep.py --rows 100000000                       # every layout, inputs kept under --dir
    python bench/bench_prep.py --rows 400000 --cpu --many-files 40    # the same on the CPU, small

Layouts, rows of one generator (`synth_criteo`: int32 ids, float32 counts with 10% missing, an int8 label), written once,
by a process of their own (the bench holds no GPU memory beside the runs):
- `few-large`: `--few-files` files (20), 1M-row row groups;
- `many-small`: `--many-files` files (1,000), one row group each;
- `wide-types`: `few-large`'s files with int64 ids and float64 counts.
Each layout runs `--rounds` fresh processes in a row (`python -m fastai_gpu_tabular.cli --dask --data <folder> ...
--freq-threshold 15`, which is `fgt-prep`; `--entry data`: `python -m fastai_gpu_tabular.data`, which starts its cluster after its
imports): round 1 is a first run (the files are in the OS's page cache, the process has nothing), later rounds say what a warm run
would add; a round 1 just after this bench wrote its inputs took ~3 s more than later ones (one H200, session 46; cause not found). Reported: processing seconds (what fgt-prep prints: from after its imports, its wait for the cluster included,
`cluster_s`), its rows/s, the process's wall (the user's figure), wall over processing, and the wall's other parts: `before_s` (the
imports before fgt-prep's clock) and `exit_s` (from its last figure to the process's end); on a GPU `peak_gpu_gb` (the device's memory
in use at most, `nvidia-smi` every 200 ms) and `gpu_busy_pct` (its mean utilization while processing). Say which run of its machine a
figure is: on cuDF's default memory resource a machine's first `fgt-prep` processes were slower than later ones (19.4-21.0 s of
processing against 14.0-15.6 s from the fourth, one H200, session 41); with cuDF's frees stream-ordered (session 43) the first ran
as fast as a later one (14.31 against 14.04 s). A machine new to cupy compiled its kernels in the first run (1 s on Criteo
rows before a8e8ae8, none since): set `CUPY_CACHE_DIR` to an empty folder to measure that machine. Where `PYTHONDONTWRITEBYTECODE` is set (the device machines) Python writes no bytecode and
every process compiles the modules it imports (8.8 s of imports against 6.6 s compiled, one H200); the results record it. Targets
(issue 53, one H100): >= 5.3M rows/s of processing on every layout in a first run, wall <= 1.3x processing."""
import argparse, os, re, shutil, subprocess, sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).parent))
from common import report

def write(layout, d, a, gpu):
    "The input files of `layout` in `d`, unless a finished folder is there (`d`.done beside it)"
    done = d.with_suffix('.done')
    if done.exists(): return
    shutil.rmtree(d, ignore_errors=True)
    from fastai_gpu_tabular.data import synth_criteo
    if layout == 'wide-types':  # few-large's files, the ids and counts widened
        import pyarrow as pa, pyarrow.parquet as pq
        src = d.parent/'few-large'; write('few-large', src, a, gpu); d.mkdir(parents=True)
        wide = {pa.int32(): pa.int64(), pa.float32(): pa.float64()}
        for f in sorted(src.glob('*.parquet')):
            t = pq.read_table(f)
            t = t.cast(pa.schema([pa.field(x.name, wide.get(x.type, x.type)) for x in t.schema]))
            pq.write_table(t, d/f.name, row_group_size=1_000_000)
    else:
        n = a.few_files if layout == 'few-large' else a.many_files
        fr = -(-a.rows // n)
        synth_criteo(a.rows, cap=a.cap, path=d, file_rows=fr, row_group_rows=min(fr, 1_000_000), overwrite=True, gpu=gpu)
    done.touch()

class GpuSampler:
    "`nvidia-smi`'s memory used (MiB) and utilization (%) of the first visible GPU every 200 ms, each with this process's clock"
    def __init__(self):
        import threading
        dev = os.environ.get('CUDA_VISIBLE_DEVICES', '0').split(',')[0] or '0'
        try: self.p = subprocess.Popen(['nvidia-smi', '-i', dev, '--query-gpu=memory.used,utilization.gpu', '--format=csv,noheader,nounits',
                                        '-lms', '200'], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        except OSError: self.p = None
        self.samples = []
        if self.p: threading.Thread(target=self._read, daemon=True).start()
    def _read(self):
        for l in self.p.stdout:
            try: m,u = (float(x) for x in l.split(','))
            except ValueError: continue
            self.samples.append((time.perf_counter(), m, u))
    def stop(self, t0:float, t1:float)->dict:
        "Peak memory over the run (GB), and mean utilization within (t0, t1): the processing"
        if self.p: self.p.terminate(); self.p.wait()
        inside = [u for t,m,u in self.samples if t0 <= t <= t1]
        return dict(peak_gpu_gb=round(max((m for _,m,_ in self.samples), default=0) / 1024, 1) if self.samples else None,
                    gpu_busy_pct=round(sum(inside) / len(inside)) if inside else None)

def run(cmd, gpu:bool=False)->tuple:
    """(wall s, output, s from the start to the line that says 'processed in', the GPU's peak memory and mean utilization while
    processing) of `cmd`, its lines read as they come"""
    smi = GpuSampler() if gpu else None
    t, lines, at = time.perf_counter(), [], None
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=dict(os.environ, PYTHONUNBUFFERED='1'))
    for l in p.stdout:
        lines.append(l)
        if at is None and 'processed in' in l: at = time.perf_counter() - t
    wall, out = time.perf_counter() - t, ''.join(lines)
    if p.wait() or at is None: sys.exit(f'{cmd} failed:\n{out[-3000:]}')
    proc = float(re.search(r'processed in ([\d.]+)s', out)[1])
    return wall, out, at, smi.stop(t + at - proc, t + at) if smi else {}

def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--rows', type=int, default=100_000_000)
    p.add_argument('--layouts', default='few-large,many-small,wide-types')
    p.add_argument('--few-files', type=int, default=20)
    p.add_argument('--many-files', type=int, default=1000)
    p.add_argument('--cap', type=int, default=None, help="synth_criteo's most distinct ids a column (default: Kaggle's counts)")
    p.add_argument('--freq-threshold', default='15')
    p.add_argument('--rounds', type=int, default=2, help='fresh processes a layout (0: write the inputs only)')
    p.add_argument('--dir', default='/tmp/bench_prep', help='the inputs (kept: a later call reuses them) and the processed folder')
    p.add_argument('--cpu', action='store_true', help='pandas workers on the CPU')
    p.add_argument('--keep', default=None, help="move the first layout's last processed folder here (a folder to train from)")
    p.add_argument('--entry', default='cli', choices=['cli', 'data'], help="fgt-prep's module (`cli`: the console script's)")
    p.add_argument('--name', default=None)
    p.add_argument('--write', default=None, help=argparse.SUPPRESS)  # a child's: write this layout's inputs, then exit
    a = p.parse_args()
    from fastai_gpu_tabular.backend import gpu_available
    if a.write: return write(a.write, Path(a.dir)/a.write, a, gpu_available() and not a.cpu)
    from fastai_gpu_tabular.data import CRITEO_SCHEMA as S  # the columns synth_criteo writes, as fgt-prep's flags
    names = [f for k in ('cat_names', 'cont_names') for f in (f"--{k.replace('_', '-')}", ','.join(S[k]))] + ['--y-names', S['y_names']]
    gpu, d, rows = gpu_available() and not a.cpu, Path(a.dir), []
    for lay in a.layouts.split(','):
        src = d/lay; t = time.perf_counter()
        subprocess.run([sys.executable, __file__, *sys.argv[1:], '--write', lay], check=True)  # the generator's flags as given
        files = sorted(src.glob('*.parquet'))
        print(f'{lay}: {len(files)} files, {sum(f.stat().st_size for f in files)/1e9:.2f} GB ({time.perf_counter()-t:.1f} s to have them)', flush=True)
        for r in range(1, a.rounds + 1):
            cmd = [sys.executable, '-m', f'fastai_gpu_tabular.{a.entry}', '--dask', '--data', str(src), *names, '--freq-threshold',
                   a.freq_threshold, '--out', str(d/'out'), '--overwrite', *(['--cpu'] if a.cpu else [])]
            wall, out, at, smi = run(cmd, gpu)
            proc = float(re.search(r'processed in ([\d.]+)s', out)[1])
            cl = re.search(r"([\d.]+)s of it waiting for the dask cluster", out)
            rows.append(dict(layout=lay, entry=a.entry, files=len(files), round=r, processing_s=round(proc, 2), cluster_s=cl and float(cl[1]),
                             rows_s=round(a.rows / proc), wall_s=round(wall, 2), wall_over_processing=round(wall / proc, 2),
                             before_s=round(at - proc, 2), exit_s=round(wall - at, 2), **smi))
            print(rows[-1], flush=True)
            if a.keep and r == a.rounds and not Path(a.keep).exists(): shutil.move(d/'out', a.keep)
            shutil.rmtree(d/'out', ignore_errors=True)
    if not rows: return  # `--rounds 0`: the inputs only
    report(a.name or ('prep_layouts' + ('' if gpu else '_cpu')), rows,
           ['layout', 'entry', 'files', 'round', 'processing_s', 'cluster_s', 'rows_s', 'wall_s', 'wall_over_processing', 'before_s',
            'exit_s', 'peak_gpu_gb', 'gpu_busy_pct'],
           dict(bench='prep', n_rows=a.rows, gpu=gpu, freq_threshold=a.freq_threshold, cap=a.cap,
                dont_write_bytecode=bool(os.environ.get('PYTHONDONTWRITEBYTECODE'))))

if __name__ == '__main__': main()
