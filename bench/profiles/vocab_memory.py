"""How many distinct ids a categorical column may have: what `TabularDask` spends on one column's vocabulary, by its size.

    python bench/profiles/vocab_memory.py --ids 10000000,50000000,100000000   # cuDF on the GPU where there is one, else pandas

For `n` distinct int64 ids, each seen once in each of two partitions of `n` rows: the value counts of each partition
(`_value_counts`) and their merge (`_add_counts`: the step of the tree reduction that holds the whole column's counts on one
worker), with the peak of torch's allocator above what was allocated before (the partitions themselves, in cuDF's memory, are
not counted: they are the data, not the vocabulary); then the client's side (`_counts_series`, `vocab_from_counts`: seconds and
the growth of the process's resident memory, the vocabulary held); then encoding 1M rows with that vocabulary (`cat_codes`, a
searchsorted: its first call copies the vocabulary to the GPU, later ones reuse it). Prints a table, results/vocab_memory.json.

    python bench/profiles/vocab_memory.py --merge 2,8 --ids 10000000        # k partitions' counts merged at once, pairwise, by split_every

`--merge`: a column whose `n` ids all recur in each of k partitions, the k value counts merged as the tree reduction's group
does (`_add_counts(*counts)`, one `torch.unique` of all), as a pairwise fold would, and as `TabularDask`'s tree does with
`split_every` 2 and 8 (`_tree`, dask's synchronous scheduler: one worker doing every merge, the results of a level held until the
next takes them); the peak above the counts held before (the GPU's allocator where there is one, else the process's resident
memory, its high-water mark reset first). results/vocab_merge.json"""
import argparse, resource, sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).parent.parent))  # bench/: common, roofline
from common import report, sync

def rss_gb(): return int(open('/proc/self/statm').read().split()[1]) * resource.getpagesize() / 1e9  # resident memory now

def _status_gb(key): return next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith(key)) * 1024 / 1e9

def merges(ids:list, ks:list, gpu:bool):
    "Peak memory and seconds of merging k partitions' counts of the same `n` ids: at once (the group) and pairwise"
    import numpy as np, pandas as pd, torch, functools, dask
    from dask import delayed
    import fastai_gpu_tabular.tabular_dask as tdm
    lib, rows = __import__('cudf') if gpu else pd, []
    for n in ids:
        for k in ks:
            vcs = [tdm._value_counts(lib.Series(np.random.default_rng(i).permutation(n).astype(np.int64) * 7 + 3)) for i in range(k)]
            tree = lambda m: dask.compute(tdm._tree([delayed(lambda v: v)(v) for v in vcs], tdm._add_counts, m), scheduler='sync')[0]
            for how, f in (('group', lambda: tdm._add_counts(*vcs)), ('pairwise', lambda: functools.reduce(tdm._add_counts, vcs)),
                           ('split_every=2', lambda: tree(2)), ('split_every=8', lambda: tree(8))):
                sync()
                if gpu: base = torch.cuda.memory_allocated(); torch.cuda.reset_peak_memory_stats()
                else: open('/proc/self/clear_refs', 'w').write('5'); base = _status_gb('VmRSS')
                t = time.perf_counter(); m = f(); sync(); s = time.perf_counter() - t
                peak = (torch.cuda.max_memory_allocated() - base) / 1e9 if gpu else _status_gb('VmHWM') - base
                assert len(m[0]) == n and int(m[1].sum()) == n * k
                del m
                rows.append(dict(ids=n, parts=k, merge=how, seconds=round(s, 3), peak_gb=round(peak, 3), bytes_an_id=round(peak * 1e9 / n, 1),
                                 memory='GPU allocator' if gpu else 'host resident'))
                print(rows[-1], flush=True)
            del vcs
    report('vocab_merge' + ('' if gpu else '_cpu'), rows, list(rows[0]), dict(bench='vocab_memory --merge', gpu=gpu))

def main():
    p = argparse.ArgumentParser()
    p.add_argument('--ids', default='10000000,50000000')
    p.add_argument('--cpu', action='store_true', help='pandas even where there is a GPU')
    p.add_argument('--merge', default=None, help='numbers of partitions, e.g. 2,8: time and measure the merges only')
    a = p.parse_args()
    import numpy as np, pandas as pd, torch
    from fastai_gpu_tabular.backend import gpu_available, cat_codes
    from fastai_gpu_tabular.procs import vocab_from_counts
    import fastai_gpu_tabular.tabular_dask as tdm
    gpu = gpu_available() and not a.cpu
    if a.merge: return merges([int(o) for o in a.ids.split(',')], [int(o) for o in a.merge.split(',')], gpu)
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
