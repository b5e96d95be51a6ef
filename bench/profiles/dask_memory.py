"""GPU memory of a dask-cuda worker through `fgt-prep --dask`'s passes: nvidia-smi, and torch's reserved and allocated memory
in the worker, after each pass (`synth_criteo` rows with the Kaggle cardinalities, written to /dev/shm first).

    python bench/profiles/dask_memory.py 100000000

One H200 before 02a7d10: 19.9 GB reserved (0 allocated) from the statistics pass on; one H100 after: 0 GB."""
import sys, time, subprocess, contextlib, torch
import fastai_gpu_tabular.tabular_dask as TD
from fastai_gpu_tabular.data import synth_criteo, main as prep
def main():
    rows = int(sys.argv[1]); raw = f'/dev/shm/raw{rows}'
    synth_criteo(rows, path=raw, overwrite=True)
    client = TD.dask_client(gpu=True)
    def wmem():
        import torch, gc
        return round(torch.cuda.memory_reserved()/2**30, 1), round(torch.cuda.memory_allocated()/2**30, 1)
    def smi(): return subprocess.run(['nvidia-smi', '--query-gpu=memory.used', '--format=csv,noheader,nounits'], capture_output=True, text=True).stdout.split()
    orig = TD._timed
    @contextlib.contextmanager
    def timed(td, name):
        with orig(td, name): yield
        print(f'after {name}: nvidia-smi MiB {smi()}, worker torch (reserved, allocated) GiB {list(client.run(wmem).values())}', flush=True)
    TD._timed = timed
    prep(data=raw, dask=True, cat_names=','.join(f'C{i}' for i in range(1, 27)), cont_names=','.join(f'I{i}' for i in range(1, 14)),
         y_names='label', freq_threshold='15', out='/tmp/pm_out', overwrite=True)
    print('end: nvidia-smi', smi(), list(client.run(wmem).values()))

if __name__ == '__main__': main()
