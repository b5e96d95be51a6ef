"""Where the time of one warm `TabularGPU` build goes (cProfile), for tuning the procs.

    python bench/profiles/profile_procs.py --rows 25000000"""
import argparse, cProfile, pstats, sys, io
from pathlib import Path
sys.path.insert(0, str(Path(__file__).parent.parent))  # bench/: common, roofline
from common import timed
from fastai.data.block import CategoryBlock
from fastai_gpu_tabular.procs import Categorify, FillMissing, Normalize
from fastai_gpu_tabular.tabular import TabularGPU
from fastai_gpu_tabular.data import synth_movielens, BENCH_MH, synth_tabular
from fastai_gpu_tabular.tabular import random_splits

p = argparse.ArgumentParser()
p.add_argument('--rows', type=int, default=25_000_000)
p.add_argument('--top', type=int, default=35)
a = p.parse_args()
df = synth_movielens(a.rows).drop(columns=list(BENCH_MH))
tr, va = random_splits(a.rows)
build = lambda: synth_tabular(df, splits=(tr, va))
med, first, _ = timed(build, 3)
print(f"build: median {med:.3f}s, first {first:.3f}s")
pr = cProfile.Profile(); pr.enable(); build(); pr.disable()
for key in ('cumulative', 'tottime'):
    s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats(key).print_stats(a.top); print(s.getvalue()[-9000:])
