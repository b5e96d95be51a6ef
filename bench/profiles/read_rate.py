"""The loader alone (issues 53, 54): how fast a processed folder's training batches arrive on a device with no model behind
them, to tell a read-bound epoch from a step-bound one. Run one process a GPU at once to see what the ranks share:

    python bench/profiles/read_rate.py /tmp/b3/processed --batches 400                     # one GPU, cuDF's decode
    for g in 0 1 2 3; do CUDA_VISIBLE_DEVICES=$g python bench/profiles/read_rate.py /tmp/b3/processed & done; wait

Prints all the rows over the seconds after the first batch (which waits for the first window) and the first batch's seconds. On 4 H200s,
a 100M-row folder in the page cache: 19.29M rows/s alone, 24-34M each with 4 at once (NOTES, session 30)."""
import argparse, time
p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument('folder', help='a processed folder (`fgt-prep --out`)')
p.add_argument('--batches', type=int, default=400)
p.add_argument('--bs', type=int, default=65536)
p.add_argument('--reader', default='auto', help="`ParquetDataLoader`'s reader: auto, cudf or pyarrow")
p.add_argument('--device', default=None, help='default: cuda where there is a GPU, else cpu')
a = p.parse_args()
import torch
from fastai.tabular.all import TabularDataLoaders
import fastai_gpu_tabular.stream  # noqa: F401 (`TabularDataLoaders.from_processed`)

dev = a.device or ('cuda' if torch.cuda.is_available() else 'cpu')
sync = torch.cuda.synchronize if dev.startswith('cuda') else (lambda: None)
dl = TabularDataLoaders.from_processed(a.folder, bs=a.bs, device=dev, reader=a.reader).train
t0, n, first = time.perf_counter(), 0, None
for i, b in enumerate(dl):
    if i == 0: sync(); first = time.perf_counter() - t0
    n += len(b[0])
    if i + 1 >= a.batches: break
sync(); t = time.perf_counter() - t0
print(f"reader {dl.reader} on {dev}: {i+1} batches, {n:,} rows in {t:.2f}s, first batch {first:.2f}s; "
      f"{n/max(t - first, 1e-9)/1e6:.2f}M rows/s after the first", flush=True)  # all the rows over the time after the first batch
