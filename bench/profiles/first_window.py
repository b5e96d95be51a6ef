"""How long a streamed epoch waits for its first batch, with the epoch's first window small (`FIRST_WINDOW_BATCHES`, the library's)
or as large as the others (before): `ParquetDataLoader` alone over a processed folder's training rows, no model, alternating
`--reps` times, each loader new (its own reading threads).

    python bench/profiles/first_window.py --data <processed folder> --device cuda --bs 65536
    python bench/profiles/first_window.py --rows 4000000 --device cpu   # a synth_criteo folder of 4M rows made first (pandas)"""
import argparse, json, sys, tempfile, time
from pathlib import Path
import numpy as np, torch
import fastai_gpu_tabular.stream as S

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument('--data', default=None, help='a processed folder (fgt-prep --out)')
p.add_argument('--rows', type=int, default=4_000_000, help='without --data: synth_criteo rows to process into a folder first')
p.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
p.add_argument('--bs', type=int, default=65536)
p.add_argument('--mem-bytes', type=int, default=None, help="the loader's `mem_bytes` (default: its own)")
p.add_argument('--reps', type=int, default=3)
a = p.parse_args()
if a.data is None:
    from fastai.tabular.all import CategoryBlock
    from fastai_gpu_tabular.data import synth_criteo, CRITEO_SCHEMA
    from fastai_gpu_tabular.procs import Categorify, FillMissing, Normalize
    from fastai_gpu_tabular.tabular import TabularGPU, RandomRowSplit
    t0 = time.perf_counter()
    to = TabularGPU(synth_criteo(a.rows, gpu=a.device != 'cpu'), procs=[Categorify, FillMissing, Normalize], splits=RandomRowSplit(0.2, 0),
                    y_block=CategoryBlock(), **CRITEO_SCHEMA)
    a.data = to.to_parquet(Path(tempfile.mkdtemp())/'criteo'); del to
    print(f'{a.rows:,} synth_criteo rows processed into {a.data} in {time.perf_counter()-t0:.1f} s', flush=True)
small = S.FIRST_WINDOW_BATCHES
res = []
for rep in range(a.reps):
    for name, n in (('first window small', small), ('first window as the others', 10**12)):
        S.FIRST_WINDOW_BATCHES = n
        dl = S.ParquetDataLoader(a.data, bs=a.bs, shuffle=True, seed=rep, drop_last=True, mem_bytes=a.mem_bytes, device=a.device)
        wins = dl.windows()
        t0 = time.perf_counter(); it = iter(dl); next(it); first = time.perf_counter() - t0
        for _ in it: pass
        if a.device != 'cpu': torch.cuda.synchronize()
        epoch = time.perf_counter() - t0
        res.append(dict(rep=rep, setting=name, first_s=first, epoch_s=epoch, windows=len(wins), first_window_rows=int(sum(h-l for _, l, h in wins[0]))))
        print(' '.join(f'{k} {v:.3f}' if isinstance(v, float) else f'{k} {v}' for k, v in res[-1].items()), flush=True)
for name in dict.fromkeys(r['setting'] for r in res):
    rs = [r for r in res if r['setting'] == name]
    print(f"{name}: first batch {np.median([r['first_s'] for r in rs]):.3f} s, epoch {np.median([r['epoch_s'] for r in rs]):.3f} s "
          f"(medians of {len(rs)}; {rs[0]['windows']} windows, the first of {rs[0]['first_window_rows']:,} rows)")
print(json.dumps(dict(device=torch.cuda.get_device_name() if a.device != 'cpu' else 'cpu', data=str(a.data), bs=a.bs, rows=res)))
