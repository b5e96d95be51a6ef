"""What the GPU does while libcudf writes a part file (issue 53: the write pass is 55-65% of a first `fgt-prep`, and three
quarters of it waits on libcudf's parquet writer). One processed Criteo part file (`--rows`, default `part_rows`' 4,194,304; the
frame of `bench_write.py`) is written by `write_part` under torch's profiler (CUPTI sees libcudf's kernels and copies), `--threads`
files at once; printed for each case: the wall, the GPU's kernel and copy time and the share of the wall the GPU was busy (the
union of its intervals), copies by kind (count, ms), the largest kernels, and the longest idle gaps.

    python bench/profiles/profile_write.py --dir /dev/shm --threads 1,2,4 --cases default,nocomp,onegroup,hostbuf
    python bench/profiles/profile_write.py --async-mr ...              # cuDF's frees stream-ordered, as fgt-prep's in-process dask has them
    KVIKIO_NTHREADS=16 python bench/profiles/profile_write.py ...     # KvikIO's and libcudf's settings are read from the environment

Cases: `default` (`write_part`), `nocomp` (no compression), `onegroup` (the file one row group), `nostats` (no statistics),
`hostbuf` (libcudf's writer into a host buffer, then one write of the file)."""
import argparse, io, os, shutil, sys, tempfile, time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
sys.path.insert(0, str(Path(__file__).parent))
from bench_write import frame

def busy(iv:list)->float:
    "Seconds covered by the union of intervals `iv` [(start, end)]"
    tot,end = 0.,-1.
    for s,e in sorted(iv):
        if e <= end: continue
        tot += e - max(s, end); end = e
    return tot

def gaps(iv:list, t0:float, t1:float, k:int=5)->list:
    "The `k` longest spans in (t0, t1) no interval of `iv` covers, in ms"
    out,end = [],t0
    for s,e in sorted(iv):
        if s > end: out.append(s - end)
        end = max(end, e)
    out.append(max(t1 - end, 0))
    return sorted((round(g*1e3, 1) for g in out), reverse=True)[:k]

def main():
    p = argparse.ArgumentParser()
    p.add_argument('--rows', type=int, default=4_194_304)
    p.add_argument('--dir', default='/dev/shm')
    p.add_argument('--threads', default='1,2')
    p.add_argument('--cases', default='default,nocomp,onegroup')
    p.add_argument('--async-mr', action='store_true', help="cuDF's memory resource RMM's stream-ordered one (as fgt-prep's in-process "
                   "dask sets it) instead of its `cudaMalloc` default, whose frees wait for the whole device")
    p.add_argument('--cprofile', action='store_true', help="also cProfile one `write_part` (the Python side of cuDF's writer)")
    a = p.parse_args()
    import torch
    from torch.profiler import profile, ProfilerActivity
    from fastai_gpu_tabular.tabular import write_part
    if a.async_mr:
        from fastai_gpu_tabular.stream import _async_mr
        _async_mr(torch.cuda.current_device())
    df, _, rg = frame(a.rows)
    nbytes = int(df.memory_usage(index=False).sum())
    kws = dict(default={}, nocomp=dict(compression=None), onegroup=dict(row_group_size_rows=a.rows), nostats=dict(statistics='NONE'), hostbuf='hostbuf')
    d = Path(tempfile.mkdtemp(dir=a.dir))
    def write(j, kw):
        if kw == 'hostbuf':  # libcudf encodes into host memory (no file sink, no KvikIO), one write of the file
            buf = io.BytesIO(); df.to_parquet(buf, index=False, row_group_size_rows=rg)
            return (d/f'part.{j:05d}.parquet').write_bytes(buf.getbuffer())
        if not kw: return write_part(df, d, j, rg)
        df.to_parquet(d/f'part.{j:05d}.parquet', index=False, **{'row_group_size_rows': rg, **kw})
    env = {k: v for k,v in os.environ.items() if k.startswith(('KVIKIO', 'LIBCUDF'))}
    import rmm
    mr = type(rmm.mr.get_current_device_resource()).__name__
    print(f"frame: {a.rows:,} rows, {nbytes/1e9:.2f} GB in memory, row groups of {rg:,} rows; torch {torch.__version__}; env {env}; {mr}")
    for case in a.cases.split(','):
        for t in map(int, a.threads.split(',')):
            run = lambda: list(ThreadPoolExecutor(t).map(lambda j: write(j, kws[case]), range(t)))
            run(); shutil.rmtree(d); d.mkdir()  # warm: the writer's first call, the files' pages
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                t0 = time.perf_counter(); run(); torch.cuda.synchronize(); wall = time.perf_counter() - t0
            ev = [e for e in prof.events() if e.device_type.name == 'CUDA']
            if not ev: print(f"\n{case}, {t}: wall {wall*1e3:.0f} ms, no CUDA events seen"); continue
            ms = lambda e: (e.time_range.end - e.time_range.start)/1e3  # a device event's own span, in ms
            kern = [e for e in ev if 'memcpy' not in e.name.lower() and 'memset' not in e.name.lower()]
            iv = [(e.time_range.start/1e6, e.time_range.end/1e6) for e in ev]
            lo,hi = min(s for s,_ in iv), max(e for _,e in iv)
            by,top = {},{}
            for e in ev:
                if 'memcpy' in e.name.lower():  # e.g. 'Memcpy DtoH (Device -> Pinned)': by its direction and host memory
                    k = e.name[e.name.find('(')+1:-1] if '(' in e.name else e.name
                    by[k] = (by.get(k, (0, 0.))[0] + 1, by.get(k, (0, 0.))[1] + ms(e))
            for e in kern: top[e.name[:60]] = top.get(e.name[:60], 0) + ms(e)
            print(f"\n{case}, {t} file(s) at once: wall {wall*1e3:.0f} ms ({t*nbytes/wall/1e9:.2f} GB/s of frame); GPU span "
                  f"{(hi-lo)*1e3:.0f} ms, busy {busy(iv)*1e3:.0f} ms ({busy(iv)/wall:.0%} of the wall); kernels "
                  f"{sum(top.values()):.0f} ms ({len(kern)}), copies {sum(v[1] for v in by.values()):.0f} ms "
                  f"{ {k: (n, round(m, 1)) for k,(n,m) in by.items()} }")
            print("  idle gaps (ms):", gaps(iv, lo, hi), " written MB:", round(sum(f.stat().st_size for f in d.iterdir())/1e6, 1))
            print("  top kernels (ms):", {k: round(v, 1) for k,v in sorted(top.items(), key=lambda x: -x[1])[:6]})
            shutil.rmtree(d); d.mkdir()
    if a.cprofile:
        import cProfile, pstats
        write(0, {}); shutil.rmtree(d); d.mkdir()
        pr = cProfile.Profile(); pr.enable(); t0 = time.perf_counter(); write(0, {}); wall = time.perf_counter() - t0; pr.disable()
        print(f"\ncProfile of one write_part, {wall*1e3:.0f} ms:"); pstats.Stats(pr).sort_stats('tottime').print_stats(15)
    shutil.rmtree(d, ignore_errors=True)

if __name__ == '__main__': main()
