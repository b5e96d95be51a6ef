"""Parquet inputs for a first-run profile, written in their own process: `synth_movielens` ('ml', genres joined by '|') or
`synth_criteo` ('criteo') rows, files of 10M rows in 1M-row row groups, on the GPU.

    python bench/profiles/synth_inputs.py ml 100000000 /dev/shm/ml"""
import sys
from pathlib import Path
from fastai_gpu_tabular.data import synth_movielens, synth_criteo

if __name__ == '__main__':
    shape, rows, out = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
    out.mkdir(parents=True, exist_ok=True)
    for i, s in enumerate(range(0, rows, 10_000_000)):
        n = min(10_000_000, rows - s)
        df = synth_movielens(n, seed=i, gpu=True) if shape == 'ml' else synth_criteo(n, seed=i, gpu=True)
        df.to_parquet(out/f'in.{i:04d}.parquet', row_group_size_rows=1_000_000); del df
    print(shape, rows, 'written to', out, flush=True)
