import time, glob, statistics, cProfile, pstats, io
import pyarrow as pa, pyarrow.parquet as pq, torch
from fastai_gpu_tabular.stream import ParquetDataLoader
f = sorted(glob.glob('/tmp/fgt_profile_stream/criteo/train/part.*.parquet'))[0]
t = pq.read_table(f)
print('rows', t.num_rows, pq.ParquetFile(f).metadata.num_row_groups)
for name, kw in [('snappy+dict', {}), ('snappy plain', dict(use_dictionary=False)), ('none plain', dict(use_dictionary=False, compression='none')),
                 ('lz4 plain', dict(use_dictionary=False, compression='lz4')), ('none dict', dict(compression='none'))]:
    out = f'/tmp/x_{name.replace(" ", "_").replace("+","_")}.parquet'
    pq.write_table(t, out, row_group_size=131072, **kw)
    pf = pq.ParquetFile(out, memory_map=True); n = pf.metadata.num_row_groups
    ts = []
    for r in range(5):
        s = time.perf_counter(); x = pq.ParquetFile(out, memory_map=True).read_row_groups(list(range(min(5, n))), columns=t.column_names); ts.append(time.perf_counter() - s)
    import os
    print(f'{name:14s} {statistics.median(ts)*1e3:6.1f} ms for {x.num_rows:,} rows = {x.num_rows/statistics.median(ts)/1e6:5.1f}M rows/s; file {os.path.getsize(out)/2**20:.0f} MiB')
dl = ParquetDataLoader('/tmp/fgt_profile_stream/criteo', bs=65536, shuffle=True, seed=0, device='cuda')
dl.mem_bytes = int(dl.src.nbytes.sum()*0.1)
wins = dl.windows()
dl.load(wins[0], 0, 0)
pr = cProfile.Profile(); pr.enable()
s = time.perf_counter()
for k in range(1, 6): dl.load(wins[k], k, 0)
el = time.perf_counter() - s
pr.disable()
print(f'load: {el/5*1e3:.1f} ms a window of ~{sum(h-l for _,l,h in wins[1]):,} rows')
st = io.StringIO(); pstats.Stats(pr, stream=st).sort_stats('tottime').print_stats(12); print(st.getvalue()[-3500:])
