"""The streaming `ParquetDataLoader` on the CPU: exact epochs over uneven row groups, equal shards for 1-3 ranks, the batches
of the `BatchDataLoader` without shuffling, prefetch order, bounded memory, resume through `fgt-train`, clear errors."""
import json, os, shutil, subprocess, sys
from pathlib import Path
import numpy as np, pandas as pd, pytest, torch
from torch.utils._pytree import tree_flatten
import pyarrow as pa, pyarrow.parquet as pq
from fastai.tabular.all import (explode_types, CategoryBlock, RegressionBlock, ProgressCallback, set_seed, tabular_config, accuracy,
                                RocAucBinary)
from fastai.tabular.data import TabularDataLoaders
from fastai_gpu_tabular.procs import Categorify, FillMissing, Normalize
from fastai_gpu_tabular.tabular import TabularGPU, RandomRowSplit
from fastai_gpu_tabular.loader import BatchDataLoader
from fastai_gpu_tabular.stream import ParquetDataLoader, ProcessedSplit
from fastai_gpu_tabular.learner import tabular_learner
from fastai_gpu_tabular.data import synth_movielens, synth_tabular
from test_distributed import launch, train, assert_same_weights

def frame(n, seed=0):
    "Rows whose target is their row number: coverage is checked on the targets"
    rng = np.random.default_rng(seed)
    return pd.DataFrame({'a': rng.integers(0, 50, n), 'b': rng.integers(0, 1000, n), 'x': rng.normal(size=n).astype('float32'),
                         'rid': np.arange(n, dtype='float32')})

def processed(path, n, row_group_rows=15_000, part_rows=97_000, **kwargs):
    to = TabularGPU(frame(n), procs=[Categorify, Normalize], cat_names=['a', 'b'], cont_names=['x'], y_names='rid',
                    y_block=RegressionBlock(), splits=RandomRowSplit(0.2, 0), **kwargs)
    return to, to.to_parquet(path, row_group_rows=row_group_rows, part_rows=part_rows)

def movielens_folder(path):
    "12,000 `synth_movielens` rows processed into `path`: row groups of 700 rows, part files of 3,000"
    return synth_tabular(synth_movielens(12_000, gpu=False), splits=RandomRowSplit(0.2, 42)).to_parquet(path, row_group_rows=700,
                                                                                                      part_rows=3_000)

@pytest.fixture(scope='module')
def big(tmp_path_factory):
    "About 1M rows, 800k of them for training in 58 row groups of 15,000 or 7,000-odd rows (each part file ends short)"
    to, path = processed(tmp_path_factory.mktemp('stream')/'big', 1_000_000)
    src = ProcessedSplit(path)
    assert len(src.groups) >= 50 and len(set(src.rows.tolist())) > 2
    return to, path, int(src.nbytes.sum())//10  # mem_bytes: a tenth of the training rows

def ids(dl): return [b[-1].view(-1).long() for b in dl]

def test_three_epochs_cover_every_row_once_in_new_orders(big):
    to, path, mem = big
    dl = ParquetDataLoader(path, bs=4096, shuffle=True, mem_bytes=mem, seed=1)
    assert len(dl.windows()) >= 10  # it streams: no window holds more than a tenth of the rows
    epochs = [torch.cat(ids(dl)) for _ in range(3)]
    want = torch.sort(torch.as_tensor(to.train.items['rid'].to_numpy()).long()).values
    for e in epochs: assert torch.equal(torch.sort(e).values, want)  # 800,000-odd rows: the last share is big enough to keep
    assert not torch.equal(epochs[0], epochs[1]) and not torch.equal(epochs[1], epochs[2])
    assert dl.epoch == 3

def test_an_epochs_first_window_is_small_so_its_first_batch_waits_less(big, monkeypatch):
    "The first batch waits for a window of about `FIRST_WINDOW_BATCHES` batches (at least a row group); the others fill the budget"
    import fastai_gpu_tabular.stream as st
    to, path, mem = big
    dl = ParquetDataLoader(path, bs=4096, shuffle=True, mem_bytes=4*mem, seed=1)  # windows of ~6 row groups
    nbytes = lambda w: sum(int(dl.src.nbytes[g]) for g in {g for g, _, _ in w})
    for epoch in range(2):
        wins = dl.windows(epoch)
        assert nbytes(wins[0]) <= st.FIRST_WINDOW_BATCHES*4096*dl._row_bytes() < nbytes(wins[1]) <= dl.window_bytes()
        assert sum(h-l for _, l, h in wins[0]) >= st.FIRST_WINDOW_BATCHES*4096//2
    monkeypatch.setattr(st, 'FIRST_WINDOW_BATCHES', 10**9)  # as large as the others: fewer windows, the same rows
    assert len(dl.windows(0)) < len(wins) or nbytes(dl.windows(0)[0]) > nbytes(wins[0])

@pytest.mark.parametrize('world', [1, 2, 3])
def test_ranks_get_equal_batch_counts_and_disjoint_shards(big, world):
    to, path, mem = big
    dls = [ParquetDataLoader(path, bs=3000, shuffle=True, mem_bytes=mem, seed=5, rank=r, world_size=world) for r in range(world)]
    shards = [ids(dl) for dl in dls]
    assert len({len(s) for s in shards}) == 1 and all(len(s) == len(dls[0]) for s in shards)
    rows = [torch.cat(s) for s in shards]
    allrows = torch.cat(rows)
    assert len(allrows.unique()) == len(allrows)  # disjoint
    left = len(to.train) - len(allrows)           # only the small-share rule may leave rows out: fewer than a batch a rank
    assert 0 <= left < 3000*world and (left == 0) == bool(dls[0].shares() or len(to.train) % (3000*world) == 0)

def test_fewer_row_groups_than_ranks_and_tiny_shares(tmp_path):
    to, path = processed(tmp_path/'small', 2_000, row_group_rows=1_000, part_rows=5_000)  # 1,600-odd training rows in 2 row groups
    n = len(to.train)
    for w in (3, 4):
        bs = next(b for b in range(50, 400) if 0 < n % (b*w) < w)  # the last batch leaves shares of 0 or 1 row: dropped in training
        dls = [ParquetDataLoader(path, bs=bs, shuffle=True, seed=0, rank=r, world_size=w) for r in range(w)]
        shards = [ids(dl) for dl in dls]
        assert len({len(s) for s in shards}) == 1 and {len(b) for s in shards for b in s} == {bs}
        assert len(torch.cat([torch.cat(s) for s in shards]).unique()) == n - n % (bs*w)
        vals = [ParquetDataLoader(path, bs=bs, split='valid', seed=0, rank=r, world_size=w) for r in range(w)]
        got = torch.cat([torch.cat(ids(dl)) for dl in vals])
        assert sorted(got.tolist()) == sorted(to.valid.items['rid'].astype(int).tolist())  # every validation row once
        assert len({len(dl) for dl in vals}) == 1

def test_unequal_part_files_of_tabular_dask_give_ranks_equal_shards(tmp_path):
    "`TabularDask` writes a part file a partition, of any size: ranks cut their shards from the rows, so sizes do not matter"
    import dask, dask.dataframe as dd
    from fastai_gpu_tabular.tabular_dask import TabularDask
    df, bounds = frame(30_000),[0, 500, 600, 20_000, 20_010, 30_000]
    ddf = dd.from_delayed([dask.delayed(df.iloc[a:b].reset_index(drop=True)) for a, b in zip(bounds[:-1], bounds[1:])], meta=df.iloc[:0])
    with dask.config.set(scheduler='sync'):
        td = TabularDask(ddf, procs=[Categorify, Normalize], cat_names=['a', 'b'], cont_names=['x'], y_names='rid',
                         y_block=RegressionBlock(), splits=RandomRowSplit(0.2, 0), progress=False)
        path = td.to_parquet(tmp_path/'d', row_group_rows=700)
    sizes = [pq.ParquetFile(f).metadata.num_rows for f in sorted((path/'train').glob('*.parquet'))]
    assert len(sizes) == 5 and max(sizes) > 100 * min(sizes)
    for w in (2, 3):
        dls = [ParquetDataLoader(path, bs=512, shuffle=True, seed=0, rank=r, world_size=w) for r in range(w)]
        shards = [ids(dl) for dl in dls]
        assert len({len(s) for s in shards}) == 1 and len(shards[0]) == len(dls[0]) > 0
        got = torch.cat([torch.cat(s) for s in shards])
        assert len(got.unique()) == len(got) and 0 <= sum(sizes) - len(got) < 512 * w  # disjoint; at most a batch a rank left

def test_without_shuffle_the_batches_and_losses_of_the_batch_loader(tmp_path):
    to = synth_tabular(synth_movielens(30_000, n_users=500, n_items=200, gpu=False), mh=True)
    path = to.to_parquet(tmp_path/'ml', row_group_rows=1_500, part_rows=7_000)
    for mh_width in (None, 12):
        ref = BatchDataLoader(to.train, bs=1000, mh_width=mh_width)
        got = ParquetDataLoader(path, bs=1000, mem_bytes=400_000, mh_width=mh_width)
        assert len(got.windows()) > 5 and len(ref) == len(got)
        for a, b in zip(ref, got):  # batches straddle windows: the same rows, the same layout
            torch.testing.assert_close(b, a, rtol=0, atol=0)
    def losses(dls):
        set_seed(0)
        learn = tabular_learner(dls, layers=[16], config=tabular_config(use_bn=False, bn_cont=False), cbs=[])
        learn.remove_cb(ProgressCallback)
        learn.fit(1, 1e-2)
        return [float(l) for l in learn.recorder.losses], learn.recorder.values[-1]
    a = losses(to.dataloaders(bs=1000, shuffle=False, device='cpu'))
    b = losses(TabularDataLoaders.from_processed(path, bs=1000, mem_bytes=400_000, shuffle=False, device='cpu'))
    np.testing.assert_allclose(b[0], a[0], rtol=1e-6)
    np.testing.assert_allclose(b[1], a[1], rtol=1e-6)

def multi_hot_folder(path, n=3_000):
    "`n` rows with a multi-hot column 'g' (0-3 of 7 tags, some missing) processed into `path`"
    rng = np.random.default_rng(0)
    g = [None if rng.random() < .1 else '|'.join(rng.choice(list('abcdefg'), rng.integers(0, 4), replace=False)) for _ in range(n)]
    df = pd.DataFrame({'a': rng.integers(0, 20, n), 'g': g, 'y': rng.integers(0, 2, n)})
    to = TabularGPU(df, procs=[Categorify], cat_names=['a'], mh_names=['g'], y_names='y', y_block=CategoryBlock(),
                    splits=RandomRowSplit(0.2, 0))
    return to.to_parquet(path, row_group_rows=500)

@pytest.mark.parametrize('shape', ['tabular', 'multi-hot'])
def test_a_ranks_copy_reads_no_rows_and_knows_the_batches_types(tmp_path, big, shape, monkeypatch):
    "`new` (each rank's `sharded` copy, made by `distrib_ctx`) takes the batches' types from the schema: no row group is read for it"
    import fastai_gpu_tabular.distributed  # `BatchDataLoader.sharded`
    path = big[1] if shape == 'tabular' else multi_hot_folder(tmp_path/'mh')
    dls, reads, read = TabularDataLoaders.from_processed(path, bs=512, device='cpu'), [], ProcessedSplit.read
    monkeypatch.setattr(ProcessedSplit, 'read', lambda self, gs, *a, **k: reads.append(gs) or read(self, gs, *a, **k))
    for dl in dls:
        one = dl.sharded(1, 2)
        assert reads == [] and (one.rank, one.world_size) == (1, 2) and one._n_inp == (3 if shape == 'multi-hot' else 2)
        b = next(iter(one))
        assert reads and one._types == explode_types(b) and len(b) == one._n_inp + 1
        reads.clear()

def test_the_next_window_is_read_before_this_ones_last_batch(big):
    _, path, mem = big
    dl = ParquetDataLoader(path, bs=4096, shuffle=True, mem_bytes=mem, seed=0)
    dl.log = []
    for b in dl: pass
    log, n = dl.log, len(dl.windows())
    for k in range(1, n):
        last = max(i for i, e in enumerate(log) if e == ('batch', k-1))
        assert log.index(('read', k)) < last, k

def test_each_windows_read_and_wait_are_timed(big):
    "`reads`: each window of the last pass in order, the seconds its read took and the seconds the batches waited for it"
    import time
    _, path, mem = big
    dl = ParquetDataLoader(path, bs=4096, shuffle=True, mem_bytes=mem, seed=0)
    n, load = len(dl.windows()), dl.load
    dl.load = lambda win, k, epoch: (time.sleep(0.6) if k == 2 else None) or load(win, k, epoch)  # window 2 is slow to read
    for b in dl: pass
    assert [r[0] for r in dl.reads] == list(range(n)) and n > 4
    assert dl.reads[2][1] >= 0.6 and dl.reads[2][2] > 0.3, dl.reads[:4]  # read after window 0's batches began: they waited

def test_the_reader_is_pyarrow_off_the_gpu_and_checked(big):
    "`reader='auto'` (the default) decodes on the CPU for a CPU loader; cuDF's reader only where a GPU has it"
    path = big[1]
    assert ParquetDataLoader(path, bs=512, device='cpu').reader == 'pyarrow'
    with pytest.raises(ValueError, match="`reader` must be 'auto', 'pyarrow' or 'cudf'"): ParquetDataLoader(path, bs=512, reader='arrow')

def test_resume_at_a_batch_starts_at_its_window(big):
    _, path, mem = big
    dl = ParquetDataLoader(path, bs=4096, shuffle=True, mem_bytes=mem, seed=3)
    whole = ids(dl)
    dl.epoch, dl.skip, dl.log = 0, 77, []
    rest = ids(dl)
    assert len(rest) == len(whole) - 77 and all(torch.equal(a, b) for a, b in zip(rest, whole[77:]))
    sizes = [sum(hi-lo for _, lo, hi in w) for w in dl.windows(0)]
    first = int(np.searchsorted(np.cumsum(sizes), 77*4096, 'right'))
    assert dl.log[0] == ('read', first) and first > 0  # the windows before batch 77 were not read

def test_fgt_train_streams_a_processed_folder_and_resumes_like_a_whole_run(tmp_path):
    path = movielens_folder(tmp_path/'proc')
    common = ('--data', path, '--bs', 800, '--epochs', 2, '--checkpoint-every', 5, '--layers', '64,32', '--mem-bytes', 150_000)
    out = lambda name, *a: launch(1, '-m', 'fastai_gpu_tabular.train', '--deterministic', '--cpu', '--out', tmp_path/name, *common, *a)
    out('whole'); out('cut', '--stop-after', 17)
    st = torch.load(tmp_path/'cut'/'checkpoint.pth', weights_only=False)
    assert (st['epoch'], st['batch']) == (1, 5)
    out('cut', '--resume')
    assert_same_weights(tmp_path/'whole', tmp_path/'cut', tol=1e-6)
    m = json.loads((tmp_path/'whole'/'metrics.json').read_text())
    assert m['roc_auc_score'] > 0.55

@pytest.mark.parametrize('n', [1, 2])
def test_resume_check_script_reads_the_next_epochs_batches(tmp_path, n):
    "tests/resume_check.py, the billion-row check of a resume mid-epoch, on n CPU ranks"
    path = movielens_folder(tmp_path/'proc')
    common = ('--', '--data', path, '--bs', 800 // n, '--epochs', 2, '--checkpoint-every', 5, '--layers', '16', '--cpu',
              '--mem-bytes', 150_000, '--out', tmp_path/'run')
    launch(n, 'tests/resume_check.py', '--stage', 'cut', *common)
    assert (torch.load(tmp_path/'run'/'checkpoint.pth', weights_only=False)['batch']) == 5
    out = launch(n, 'tests/resume_check.py', '--stage', 'resume', '--batches', 3, *common)
    res = [json.loads((tmp_path/'run'/f'resume_check_rank{r}.json').read_text()) for r in range(n)]
    assert all(r['same'] and len(r['seen']) == 3 for r in res) and out.count('are a fresh loader') == n, out
    assert all(len({json.dumps(b) for b in r['seen']}) == 3 for r in res)  # fingerprints that tell batches apart
    if n == 2: assert res[0]['seen'] != res[1]['seen']  # each rank its own shard

def test_two_ranks_under_distrib_ctx_disjoint_shards_exact_validation(tmp_path, big):
    _, path, mem = big
    launch(2, 'tests/dist_stream_worker.py', path, tmp_path)
    r0, r1 = [json.loads((tmp_path/f'rank{r}.json').read_text()) for r in (0, 1)]
    assert r0['n_train'] == r1['n_train'] and not set(r0['rows']) & set(r1['rows'])
    assert r0['valid'] == r1['valid']
    # one process with rank 0's weights: the same validation loss over every validation row once
    dls = TabularDataLoaders.from_processed(path, bs=20_000, shuffle=False, device='cpu')
    learn = tabular_learner(dls, layers=[8], config=tabular_config(use_bn=False, bn_cont=False), y_range=None)
    learn.model.load_state_dict(torch.load(tmp_path/'model.pth', weights_only=True))
    learn.remove_cb(ProgressCallback)
    np.testing.assert_allclose(r0['valid'], [float(learn.validate()[0])], rtol=1e-5)

def test_memory_stays_bounded(tmp_path):
    "RSS growth over an epoch of ~190 MB of rows, `mem_bytes` 16 MB: at most 3 x mem_bytes + 96 MB"
    n, rng = 2_500_000, np.random.default_rng(0)
    df = pd.DataFrame({**{f'c{i}': rng.integers(0, 100, n) for i in range(8)}, **{f'x{i}': rng.normal(size=n) for i in range(8)},
                       'y': rng.normal(size=n)})
    to = TabularGPU(df, procs=[Categorify, Normalize], cat_names=[f'c{i}' for i in range(8)], cont_names=[f'x{i}' for i in range(8)],
                    y_names='y', y_block=RegressionBlock(), splits=RandomRowSplit(0.01, 0))
    path = to.to_parquet(tmp_path/'mem', row_group_rows=50_000)
    del df, to
    mem = 16 << 20
    code = f"""
import threading, time
from fastai_gpu_tabular.stream import ParquetDataLoader
def rss(): return int(open('/proc/self/statm').read().split()[1])*4096
peak, done = [0], False
def sample():  # every 2 ms, the background reads included (ru_maxrss would carry the parent's peak across exec)
    while not done: peak[0] = max(peak[0], rss()); time.sleep(0.002)
dl = ParquetDataLoader({str(path)!r}, bs=8192, shuffle=True, mem_bytes={mem}, seed=0)
it = iter(dl); next(it); base = rss()
th = threading.Thread(target=sample); th.start()
for b in it: pass
done = True; th.join()
print(base, peak[0], len(dl.windows(0)))
"""
    r = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS='1'))
    assert r.returncode == 0, r.stderr[-3000:]
    base, peak, n_windows = map(int, r.stdout.split())
    assert n_windows >= 10
    assert peak - base <= 3*mem + (96 << 20), (base, peak, (peak-base)/mem)

def test_bad_input_is_named(tmp_path):
    _, path = processed(tmp_path/'ok', 5_000, row_group_rows=500, part_rows=2_000)
    def broken(name, f):
        p = tmp_path/name; shutil.copytree(path, p); f(p); return p
    with pytest.raises(FileNotFoundError, match='no dataset.json'): ParquetDataLoader(tmp_path)
    p = broken('noprocs', lambda p: (p/'procs'/'procs.json').unlink())
    with pytest.raises(FileNotFoundError, match='no saved procs'): ParquetDataLoader(p)
    def retype(p):  # part 1 written with float64 codes
        t = pq.read_table(p/'train'/'part.00001.parquet'); pq.write_table(t.set_column(0, 'a', t['a'].cast('float64')),
                                                                          p/'train'/'part.00001.parquet')
    with pytest.raises(ValueError, match=r"column 'a' is double in .*part.00001.parquet but int8 in .*part.00000"):
        ParquetDataLoader(broken('types', retype))
    def drop(p): t = pq.read_table(p/'train'/'part.00001.parquet'); pq.write_table(t.drop_columns(['x']), p/'train'/'part.00001.parquet')
    with pytest.raises(ValueError, match=r"part.00001.parquet has no column 'x'"): ParquetDataLoader(broken('missing', drop))
    with pytest.raises(ValueError, match=r"part.00001.parquet: cannot read it as parquet"):
        ParquetDataLoader(broken('junk', lambda p: (p/'train'/'part.00001.parquet').write_bytes(b'not parquet')))
    with pytest.raises(ValueError, match=r"`mem_bytes`=50,000 is too small .* one batch of 4,096 rows"): ParquetDataLoader(path, bs=4096,
                                                                                                                           mem_bytes=50_000)
    with pytest.raises(ValueError, match='mh_width'): ParquetDataLoader(path, mh_width='max')

def test_default_mem_bytes_is_capped_so_an_epoch_streams(big, monkeypatch):
    "Without `mem_bytes`, a quarter of the free memory, at most `STREAM_MAX_BYTES`: never one window of the whole split"
    import fastai_gpu_tabular.stream as stream
    to, path, mem = big
    assert stream.default_mem_bytes('cpu') <= stream.STREAM_MAX_BYTES
    monkeypatch.setattr(stream, 'STREAM_MAX_BYTES', mem)  # the cap at a tenth of this split: its windows, as if mem_bytes=mem
    dl = ParquetDataLoader(path, bs=4096, shuffle=True, seed=1)
    assert dl.mem_bytes is None and dl.window_bytes() == ParquetDataLoader(path, bs=4096, mem_bytes=mem).window_bytes()
    assert len(dl.windows()) >= 10

def test_write_parts_holds_at_most_threads_frames_and_keeps_order(tmp_path, monkeypatch):
    "Part files written `threads` at once: results in the items' order, frames taken only as threads free up, a failed write raises"
    import threading, time
    import fastai_gpu_tabular.tabular as tab
    made, done, most, lock = [0], [0], [0], threading.Lock()
    def items():
        for i in range(7):
            made[0] += 1
            with lock: most[0] = max(most[0], made[0] - done[0])
            yield i, pd.DataFrame({'a': np.arange(i + 1, dtype='int8')})
    def slow(df, folder, i, rg, f=tab.write_part):
        time.sleep(0.05); r = f(df, folder, i, rg)
        with lock: done[0] += 1
        return r
    monkeypatch.setattr(tab, 'write_part', slow)
    res = tab.write_parts(items(), tmp_path, 100, threads=2)
    assert [r['rows'] for r in res] == list(range(1, 8)) and [r['file'] for r in res] == [f'part.{i:05d}.parquet' for i in range(7)]
    assert most[0] <= 3 and pq.read_table(tmp_path/'part.00006.parquet').num_rows == 7  # 2 being written, 1 being made
    def bad(df, folder, i, rg):
        if i == 3: raise OSError('disk full')
        return {'file': i, 'rows': len(df)}
    monkeypatch.setattr(tab, 'write_part', bad)
    with pytest.raises(OSError, match='disk full'): tab.write_parts(items(), tmp_path, 100, threads=2)

def test_pinned_buffers_are_lent_again_and_dropped_for_larger_ones(monkeypatch):
    "`_pinned_lease`: a free buffer that fits is lent again, two held at once are two, a larger need drops the smaller free ones"
    import fastai_gpu_tabular.stream as st
    made = []
    monkeypatch.setattr(st, '_pin', lambda n: made.append(n) or torch.empty(n, dtype=torch.uint8))  # pinning needs CUDA
    monkeypatch.setattr(st, '_pins', [])
    st._warm_pins(1000, 2)  # what a loader's thread does before its reading threads need them
    assert made == [1250, 1250] and len(st._pins) == 2
    with st._pinned_lease(900) as a, st._pinned_lease(1000) as b:
        assert a is not b and len(made) == 2 and not st._pins
        with st._pinned_lease(10) as c: assert made[2:] == [12] and c.numel() == 12  # none free: pinned now
    assert sorted(x.numel() for x in st._pins) == [12, 1250, 1250]
    with st._pinned_lease(1100) as d: assert d.numel() == 1250 and len(made) == 3  # the smallest free one that fits
    with st._pinned_lease(2000) as e: assert e.numel() == 2500 and not st._pins  # none fits: the smaller free ones dropped
    assert [x.numel() for x in st._pins] == [2500]

def test_a_part_files_bytes_hold_what_its_row_groups_read(big, monkeypatch):
    "The bytes cuDF decodes a window from (`_file_bytes`, in pinned memory): the row groups asked for read as from the file, the others not"
    import fastai_gpu_tabular.stream as st
    monkeypatch.setattr(st, 'READ_PIECE', 4096)  # many pieces on the copy threads, some ending inside a row group
    src = ProcessedSplit(big[1])
    f, want = src.files[0], [1, 3]
    spans, size = src.spans[0]
    assert size == os.path.getsize(f) and len(spans) == pq.ParquetFile(f).metadata.num_row_groups > 3
    buf = torch.full((size + 100,), 0xAB, dtype=torch.uint8)
    ranges = src._file_bytes(0, want, buf)
    b = buf[:size].numpy().tobytes()
    assert ranges[0][0] == 0 and ranges[-1][1] == size and buf[size:].eq(0xAB).all()
    pf = pq.ParquetFile(pa.BufferReader(b))
    assert pf.read_row_groups(want).equals(pq.ParquetFile(f).read_row_groups(want))
    raw = open(f, 'rb').read()
    for j, (a, e) in enumerate(spans):  # a row group not asked for is left unread (marked), one asked for is the file's bytes
        assert (b[a:e] == raw[a:e]) == (j in want) and (j in want or set(b[a:e]) == {0xAB})
    unread = sum(e-a for j, (a, e) in enumerate(spans) if j not in want)
    assert sum(x != y for x, y in zip(b, raw)) <= unread and b[:4] == b[-4:] == b'PAR1'
    assert sum(e-a for a, e in ranges) == size - unread
    assert st._read_ranges([(4, 10), (10, 20), (20, 30)], [1], 40) == [(0, 4), (10, 20), (30, 40)]
    with pytest.raises(Exception): pq.ParquetFile(pa.BufferReader(b)).read_row_groups([0])
    with pytest.raises(ValueError, match=f'{os.path.basename(f)}.*do not fit'): src._file_bytes(0, want, buf[:size-1])

def layout(b):
    "What a captured step depends on in a batch: each tensor's shape, strides and type, nested tuples spread out"
    return [(tuple(x.shape), x.stride(), x.dtype, x.device) for x in tree_flatten(list(b))[0]]

@pytest.mark.parametrize('shape', ['tabular', 'multi-hot'])
def test_a_shape_batch_is_laid_out_as_the_batches_and_draws_nothing(tmp_path, big, shape):
    "`shape_batch`: the inputs and targets of a batch, as the training batches lay them out, made from no file and no random draw"
    import random
    path = big[1] if shape == 'tabular' else multi_hot_folder(tmp_path/'mh')
    for mh in ([None] if shape == 'tabular' else [4]):  # padded bags: the layout whose sizes are fixed (a graph a step)
        dl = ParquetDataLoader(path, bs=512, shuffle=True, seed=0, mh_width=mh)
        st = random.getstate(), torch.get_rng_state().tolist(), dl.epoch
        s = dl.shape_batch()
        assert (random.getstate(), torch.get_rng_state().tolist(), dl.epoch) == st
        assert layout(s) == layout(next(iter(dl))) and len(s[0]) == 512
        assert not s[0].any() and (shape == 'tabular' or not any(x.any() for x in tree_flatten(list(s[2]))[0]))  # codes 0, empty bags

def test_reads_started_ahead_are_taken_by_their_pass_only(big):
    "`read_ahead` reads the coming pass's first windows now; that pass takes them (no window read twice), another pass drops them"
    _, path, mem = big
    want = ids(ParquetDataLoader(path, bs=4096, shuffle=True, mem_bytes=mem, seed=2))
    dl = ParquetDataLoader(path, bs=4096, shuffle=True, mem_bytes=mem, seed=2)
    loads, load = [], dl.load
    dl.load = lambda win, k, epoch: loads.append((epoch, k)) or load(win, k, epoch)
    dl.read_ahead(); dl.read_ahead()  # once
    for _, f in dl._ahead[1].values(): f.result()
    assert sorted(loads) == [(0, 0), (0, 1)]  # read before the pass began
    got = ids(dl)
    assert len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want))
    assert sorted(loads) == [(0, k) for k in range(len(dl.windows(0)))]  # each window once
    loads.clear(); dl.read_ahead(); dl.epoch = 0  # read for epoch 1, then a pass over epoch 0: dropped, read again
    for _, f in dl._ahead[1].values(): f.result()
    assert all(torch.equal(a, b) for a, b in zip(ids(dl), want))
    assert sorted(loads) == sorted([(1, 0), (1, 1)] + [(0, k) for k in range(len(dl.windows(0)))])
