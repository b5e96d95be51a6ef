"""How many distinct ids a categorical column may have: what `TabularDask` spends on one column's vocabulary, by its size.

    python bench/vocab_memory.py --ids 10000000,50000000,100000000   # cuDF on the GPU where there is one, else pandas

For `n` distinct int64 ids, each seen once in each of two partitions of `n` rows: the value counts of each partition
(`_value_counts`) and their merge (`_add_counts`: the step of the tree reduction that holds the whole column's counts on one
worker), with the peak of torch's allocator above what was allocated before (the partitions themselves, in cuDF's memory, are
not counted: they are the data, not the vocabulary); then the client's side (`_counts_series`, `vocab_from_counts`: seconds and
the growth of the process's resident memory, the vocabulary held); then encoding 1M rows with that vocabulary (`cat_codes`, a
searchsorted: its first call copies the vocabulary to the GPU, later ones reuse it). Prints a table, results/vocab_memory.json."""
import argparse, resource, sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).parent))
from common import report, sync

def rss_gb(): return int(open('/proc/self/statm').read().split()[1]) * resource.getpagesize() / 1e9  # resident memory now

def main():
    p = argparse.ArgumentParser()
    p.add_argument('--ids', default='10000000,50000000')
    p.add_argument('--cpu', action='store_true', help='pandas even where there is a GPU')
    a = p.parse_args()
    import numpy as np, pandas as pd, torch
    from fastai_gpu_tabular.backend import gpu_available, cat_codes
    from fastai_gpu_tabular.procs import vocab_from_counts
    import fastai_gpu_tabular.tabular_dask as tdm
    gpu = gpu_available() and not a.cpu
    lib = __import__('cudf') if gpu else pd
    rows = []
    for n in [int(o) for o in a.ids.split(',')]:
        v = np.random.default_rng(0).permutation(n).astype(np.int64) * 7 + 3  # distinct ids, in no order
        parts = [lib.Series(v), lib.Series(v[::-1].copy())]
        sample = lib.Series(np.random.default_rng(1).choice(v, 1_000_000))
        del v
        sync()
        if gpu: base = torch.cuda.memory_allocated(); torch.cuda.reset_peak_memory_stats()
        t = time.perf_counter()
        merged = tdm._add_counts(*[tdm._value_counts(s) for s in parts]); sync()
        counts_s = time.perf_counter() - t
        peak = torch.cuda.max_memory_allocated() - base if gpu else None
        del parts
        r0, t = rss_gb(), time.perf_counter()
        vocab, rare = vocab_from_counts(tdm._counts_series(merged))
        host_s, host_gb = time.perf_counter() - t, rss_gb() - r0
        del merged
        arr = np.asarray(vocab)
        sync(); t = time.perf_counter(); c = cat_codes(sample, arr); sync(); first_ms = 1e3 * (time.perf_counter() - t)
        sync(); t = time.perf_counter(); c = cat_codes(sample, arr); sync(); warm_ms = 1e3 * (time.perf_counter() - t)
        assert len(vocab) == n and not rare and int((c < 0).sum()) == 0
        rows.append(dict(ids=n, counts_s=round(counts_s, 3), gpu_peak_gb=round(peak / 1e9, 3) if gpu else '',
                         bytes_an_id=round(peak / n, 1) if gpu else '', ids_per_gb=f'{1e9 / (peak / n):,.0f}' if gpu else '',
                         host_s=round(host_s, 2), host_gb=round(host_gb, 2),
                         encode_1m_first_ms=round(first_ms, 1), encode_1m_ms=round(warm_ms, 2)))
        print(rows[-1], flush=True)
        del vocab, arr, sample, c
    report('vocab_memory' + ('' if gpu else '_cpu'), rows, list(rows[0]), dict(bench='vocab_memory', gpu=gpu))

if __name__ == '__main__': main()
