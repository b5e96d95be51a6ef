"""Where the processed format's write goes (issue 29: the write pass is ~24 s of 40 at 100M Criteo rows): one processed
Criteo partition (`--rows`, default 1M: a dask partition of the bench) written by cuDF's parquet writer in several ways, each
against the package's own `write_part` (the baseline, first row) in the same process, plus the raw disk rate.

    python bench/profiles/bench_write.py                      # one GPU; ~1 minute
    python bench/profiles/bench_write.py --rows 8000000       # larger partitions (`--blocksize`), part files written by threads

Rows: `processed_frame` (the types and nulls before the writer), `write_part` as the package calls it (to the --dir disk
and to /dev/shm: libcudf's file sink, which writes each column chunk by itself), the file encoded into a host buffer
(`BytesIO`) and written at once (to the disk, synced or not, to /dev/shm, with fewer row groups), compression off / LZ4 /
ZSTD, one row group a file, larger row groups, no dictionary encoding, larger pages, header version 2, the host copy alone (`to_arrow`), the frame as 2 or 4 part files written by 1, 2 or 4 threads
(libcudf's writer releases the GIL), and the same write in a child process with `KVIKIO_NTHREADS=8` (libcudf's file writes
through KvikIO's thread pool) and with KvikIO off; each with the megabytes it wrote."""
import argparse, json, os, shutil, subprocess, sys, tempfile, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).parent.parent))  # bench/: common, roofline
from common import report, timed

def frame(rows):
    "A processed Criteo partition of `rows` rows as `TabularGPU.to_parquet` writes it, with its names and row group rows"
    from fastai.data.block import CategoryBlock
    from fastai_gpu_tabular.data import synth_criteo, CRITEO_SCHEMA
    from fastai_gpu_tabular.procs import Categorify, FillMissing, Normalize
    from fastai_gpu_tabular.tabular import TabularGPU, processed_frame, code_types, row_group_rows_for, _NAME_KEYS
    to = TabularGPU(synth_criteo(rows, cap=500_000, seed=0), **{k: list(v) if isinstance(v, tuple) else v for k,v in CRITEO_SCHEMA.items()},
                    procs=[Categorify, FillMissing, Normalize], y_block=CategoryBlock())
    names = {k: list(getattr(to, k)) for k in _NAME_KEYS}
    types = code_types(to.procs, names)
    pf = lambda: processed_frame(to.items, names, (), types)
    df = pf()
    return df, pf, row_group_rows_for(dict(df.dtypes), to.mh_names)

def child(a):
    "Time `write_part` in this process (the env set by the parent) and print seconds as JSON"
    from fastai_gpu_tabular.tabular import write_part
    df, _, rg = frame(a.rows)
    d = Path(tempfile.mkdtemp(dir=a.dir))
    s = timed(lambda: write_part(df, d, 0, rg), repeats=a.repeats)[0]
    shutil.rmtree(d); print(json.dumps(s))

def main():
    p = argparse.ArgumentParser()
    p.add_argument('--rows', type=int, default=1_000_000)
    p.add_argument('--dir', default='/tmp', help='the disk written (the bench_dask output folder is under /tmp)')
    p.add_argument('--repeats', type=int, default=5)
    p.add_argument('--only', default=None, help="comma-separated words: run only the rows whose name holds one (the first row always)")
    p.add_argument('--child', action='store_true', help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child: return child(a)
    from fastai_gpu_tabular.tabular import write_part
    df, pf, rg = frame(a.rows)
    nbytes = int(df.memory_usage(index=False).sum())
    dirs = {k: Path(tempfile.mkdtemp(dir=v)) for k,v in (('disk', a.dir), ('shm', '/dev/shm'))}
    def w(where='disk', **kw):
        if not kw: return lambda: write_part(df, dirs[where], 0, rg)
        return lambda: df.to_parquet(dirs[where]/'part.00000.parquet', index=False, **{'row_group_size_rows': rg, **kw})
    def buffered(where='disk', sync=False, **kw):  # encoded into host memory, then written at once (and synced)
        def f():
            import io
            buf = io.BytesIO()
            df.to_parquet(buf, index=False, **{'row_group_size_rows': rg, **kw})
            with open(dirs[where]/'part.00000.parquet', 'wb') as fh:
                fh.write(buf.getbuffer())
                if sync: fh.flush(); os.fsync(fh.fileno())
        return f
    cases = [('write_part (the package)', w()), ('write_part to /dev/shm', w('shm')), ('processed_frame (before the writer)', pf),
             ('host buffer, one write', buffered()), ('host buffer, one write, to /dev/shm', buffered('shm')),
             ('host buffer, one write, fsync', buffered(sync=True)), ('host buffer, row groups of 4x', buffered(row_group_size_rows=4*rg)),
             ('host buffer, one row group', buffered(row_group_size_rows=a.rows)),
             ('compression=None', w(compression=None)), ("compression='LZ4'", w(compression='LZ4')),
             ("compression='ZSTD'", w(compression='ZSTD')), ('one row group', w(row_group_size_rows=a.rows)),
             ("statistics='NONE'", w(statistics='NONE')), ('to_arrow (host copy only)', lambda: df.to_arrow()),
             *[(f'row groups of {r:,} rows', w(row_group_size_rows=r)) for r in (2*rg, 4*rg)],
             ('use_dictionary=False', w(use_dictionary=False)), ('max_page_size_rows=100,000', w(max_page_size_rows=100_000)),
             ("header_version='2.0'", w(header_version='2.0')),
             ('use_dictionary=False, row groups of 4x', w(use_dictionary=False, row_group_size_rows=4*rg))]
    from concurrent.futures import ThreadPoolExecutor
    def parts(k, t):  # the frame as `k` part files (write_part each), written by `t` threads
        n = -(-len(df) // k)
        f = lambda j: write_part(df.iloc[j*n:(j+1)*n], dirs['disk'], j, rg)
        if t == 1: return lambda: [f(j) for j in range(k)]
        return lambda: list(ThreadPoolExecutor(t).map(f, range(k)))
    cases += [(f'{k} part files of {-(-a.rows // k):,} rows, {t} thread(s)', parts(k, t)) for k,t in ((2, 1), (2, 2), (4, 1), (4, 2), (4, 4))]
    if a.only: cases = cases[:1] + [c for c in cases[1:] if any(k.strip() in c[0] for k in a.only.split(','))]
    rows = []
    for name, f in cases:
        for d in dirs.values(): shutil.rmtree(d); d.mkdir()
        s = timed(f, repeats=a.repeats)[0]
        written = sum(p.stat().st_size for d in dirs.values() for p in d.iterdir())
        rows.append(dict(path=name, ms=round(s*1e3, 1), gb_s=round(nbytes/s/1e9, 2), mb_written=round(written/1e6, 1)))
        print(rows[-1], flush=True)
    for name, env in [] if a.only else [('KVIKIO_NTHREADS=8 (child)', dict(KVIKIO_NTHREADS='8')), ('KVIKIO_COMPAT_MODE=ON (child)', dict(KVIKIO_COMPAT_MODE='ON')),
                      ('default env (child)', {})]:
        r = subprocess.run([sys.executable, __file__, '--child', '--rows', str(a.rows), '--dir', a.dir, '--repeats', str(a.repeats)],
                           env={**os.environ, **env}, capture_output=True, text=True)
        if r.returncode: print(name, 'failed:', r.stderr[-2000:]); continue
        s = json.loads(r.stdout.strip().splitlines()[-1])
        rows.append(dict(path=name, ms=round(s*1e3, 1), gb_s=round(nbytes/s/1e9, 2))); print(rows[-1], flush=True)
    # the disk alone: 2 GB of bytes written and synced
    buf = os.urandom(2**27)
    for k,d in dirs.items():
        t = time.perf_counter()
        with open(d/'raw', 'wb') as fh:
            for _ in range(16): fh.write(buf)
            fh.flush(); os.fsync(fh.fileno())
        s = time.perf_counter() - t
        rows.append(dict(path=f'2 GB raw bytes to {k} (fsync)', ms=round(s*1e3, 1), gb_s=round(16*2**27/s/1e9, 2)))
    base = rows[0]['ms']
    for r in rows: r['vs_package'] = round(base / r['ms'], 2)
    for d in dirs.values(): shutil.rmtree(d, ignore_errors=True)
    report('write_criteo' + ('' if a.rows == 1_000_000 else f'_{a.rows}'), rows, ['path', 'ms', 'gb_s', 'mb_written', 'vs_package'],
           dict(bench='write', rows_written=a.rows, bytes_in_memory=nbytes, row_group_rows=rg, dir=a.dir))

if __name__ == '__main__': main()
