"""The GPU memory torch reserves over 3 epochs of the streaming loader (test_gpu_stream's `window_memory`: 1.2M Criteo rows,
windows of ~13.6 MB), with a copy stream a reading thread, then with a new stream a window as before 9d7ecab.

    python bench/profiles/stream_memory.py

One H200: 121.6 MB (8.9 windows' bytes) against 1,853.9 MB (136): the test's bound of 12 windows fails without the fix.
Training rates with either (30M processed rows, `fgt-train --emb-dim 16 --emb-opt rowwise-adagrad`, an epoch each, alternated):
3.65M and 2.87M rows/s against 3.43M and 3.11M; reserved peak 8.9-9.9 GiB against 16.3-16.4 GiB."""
import sys, torch
from pathlib import Path
sys.path.insert(0, str(Path(__file__).parents[2]/'tests'))
import fastai_gpu_tabular.stream as S
from test_gpu_stream import window_memory
from fastai.tabular.all import CategoryBlock
from fastai_gpu_tabular.data import synth_criteo, CRITEO_SCHEMA
from fastai_gpu_tabular.procs import Categorify, FillMissing, Normalize
from fastai_gpu_tabular.tabular import TabularGPU, RandomRowSplit
to = TabularGPU(synth_criteo(1_200_000, cap=50_000, gpu=True), procs=[Categorify, FillMissing, Normalize], splits=RandomRowSplit(0.2, 0),
                y_block=CategoryBlock(), **CRITEO_SCHEMA)
p = to.to_parquet('/tmp/oldclicks', overwrite=True, row_group_rows=16_384)
print('fixed (peak, window bytes, windows):', window_memory(p))
S._side_stream = lambda device: torch.cuda.Stream(device)
print('a stream a window:', window_memory(p))
