"""`TabularDask` on GPUs: dask_cudf partitions on a `LocalCUDACluster` (`pytest -m gpu`: one worker; `-m gpu2`: two),
against `TabularGPU` on cuDF, and two workers against one."""
import pytest
from fastai.data.block import CategoryBlock
from fastai_gpu_tabular.procs import Categorify, FillMissing, Normalize
from fastai_gpu_tabular.tabular import TabularGPU, RandomRowSplit
from fastai_gpu_tabular.data import synth_movielens, synth_criteo, CRITEO_SCHEMA, read_dask
from fastai_gpu_tabular.tabular_dask import TabularDask
from test_dask import assert_same_state, assert_same_output

PROCS = [Categorify, FillMissing, Normalize]
KW = dict(cat_names=['userId', 'movieId', 'hour'], cont_names=['days', 'year'], mh_names=['genres'], y_names='target',
          y_block=CategoryBlock(), procs=PROCS, splits=RandomRowSplit(0.2, seed=5))

def cuda_client(n):
    "`dask_client`'s local cluster of `n` GPU workers, at its defaults: two threads a worker"
    from fastai_gpu_tabular.tabular_dask import dask_client
    client = dask_client(n_workers=n, gpu=True, dashboard_address=None)
    assert list(client.nthreads().values()) == [2] * n
    mr = client.run(lambda: type(__import__('rmm').mr.get_current_device_resource()).__name__)  # stream-ordered frees by default
    assert set(mr.values()) == {'CudaAsyncMemoryResource'}, mr
    return client.cluster, client

def data(tmp_path, n=400_000):
    df = synth_movielens(n, n_users=20_000, n_items=5_000, gpu=True)
    df.to_parquet(tmp_path/'in.parquet', row_group_size_rows=50_000)
    return df

def run(tmp_path, name, n_workers):
    import cudf, dask_cudf  # imported here: the CPU suite collects this file
    cluster, client = cuda_client(n_workers)
    try:
        ddf = dask_cudf.read_parquet(tmp_path/'in.parquet', split_row_groups=True)
        td = TabularDask(ddf, progress=False, **KW)
        assert isinstance(td.ddf._meta, cudf.DataFrame)
        td.to_parquet(tmp_path/name)
        return td
    finally: client.close(); cluster.close()

@pytest.mark.gpu
def test_one_cuda_worker_equals_tabulargpu_on_cudf(tmp_path):
    df = data(tmp_path)
    td = run(tmp_path, 'dask', 1)
    ref = TabularGPU(df, **KW)
    assert_same_state(ref, td)
    ref.to_parquet(tmp_path/'mem')
    assert_same_output(tmp_path/'mem', tmp_path/'dask')

@pytest.mark.gpu2
def test_two_cuda_workers_equal_one(tmp_path):
    data(tmp_path)
    one, two = run(tmp_path, 'one', 1), run(tmp_path, 'two', 2)
    assert_same_state(one, two)
    assert_same_output(tmp_path/'one', tmp_path/'two')

@pytest.mark.gpu
def test_write_pass_meta_computed_on_pandas_is_cudfs(tmp_path):
    "The write pass's meta, computed on pandas (`_processed_meta`), has the columns and types the procs give on cuDF: lists, strings too"
    import dask, dask_cudf
    from fastai_gpu_tabular.tabular_dask import _processed, _processed_meta
    df = data(tmp_path, 100_000)
    df['title'] = df['movieId'].astype(str)
    df.to_parquet(tmp_path/'in.parquet', row_group_size_rows=50_000)
    with dask.config.set(scheduler='sync'):
        td = TabularDask(dask_cudf.read_parquet(tmp_path/'in.parquet', split_row_groups=True), progress=False, **KW)
        prep = td._prepared(extra=['title'])
    args = list(td.procs), td._names, ['title']
    got, want = _processed_meta(prep._meta, *args), _processed(prep._meta, *args)
    assert type(got) is type(want) and len(got) == 0 and list(got.columns) == list(want.columns)
    assert dict(got.dtypes) == dict(want.dtypes), (dict(got.dtypes), dict(want.dtypes))
    assert str(got['genres'].dtype).startswith('list')

@pytest.mark.gpu
def test_workers_keep_no_torch_cache_between_passes(tmp_path):
    "What torch cached on a worker is given back after each pass and merge: cuDF, which allocates outside it, finds the memory free"
    import dask_cudf, torch
    synth_criteo(4_000_000, cap=500_000, gpu=True).to_parquet(tmp_path/'c.parquet', row_group_size_rows=250_000)
    cluster, client = cuda_client(1)
    try:
        cols = {k: list(v) if isinstance(v, tuple) else v for k, v in CRITEO_SCHEMA.items()}
        td = TabularDask(dask_cudf.read_parquet(tmp_path/'c.parquet', split_row_groups=True), progress=False, procs=PROCS,
                         y_block=CategoryBlock(), splits=RandomRowSplit(0.2, seed=5), **cols)
        reserved = list(client.run(torch.cuda.memory_reserved).values())[0]
    finally: client.close(); cluster.close()
    assert len(td.classes['C3']) > 100_000 and reserved < 64 << 20, reserved

@pytest.mark.gpu
def test_footers_split_out_and_float64_columns_on_cudf(tmp_path):
    """dask_cudf's parquet footers give the split's positions (no layout pass); value counts merged in pieces (numbers and
    strings: cuDF's hash); float64 columns fitted as float32 where `reduce_memory` narrows them; uint64 ids above 2**63 kept:
    all `TabularGPU`'s on cuDF"""
    import cudf, dask, dask_cudf, numpy as np
    import fastai_gpu_tabular.tabular_dask as tdm
    rng, n = np.random.default_rng(6), 200_000
    x = rng.standard_normal(n); x[rng.random(n) < 0.1] = np.nan
    df = cudf.DataFrame({'id': rng.integers(0, 50_000, n), 's': rng.integers(0, 3_000, n).astype(str), 'x': x,
                         'big': rng.standard_normal(n) * 1e300, 'y': rng.integers(0, 2, n),
                         'u': np.uint64(2**63) + rng.integers(0, 500, n).astype(np.uint64)})  # 64-bit hashes above 2**63
    df.to_parquet(tmp_path/'in.parquet', row_group_size_rows=40_000)
    kw = dict(cat_names=['id', 's', 'u'], cont_names=['x', 'big'], y_names='y', y_block=CategoryBlock(), splits=RandomRowSplit(0.2, seed=2),
              procs=[Categorify(max_size={'id': 20_000, 's': 1_000}), FillMissing, Normalize])
    ddf = dask_cudf.read_parquet(tmp_path/'in.parquet', split_row_groups=True)
    rows = tdm._footer_rows(ddf, len(ddf.to_delayed()))  # dask_cudf fuses the 5 row groups into fewer partitions: its buckets' sums
    assert rows is not None and sum(rows) == n and len(rows) < 5
    d, _ = read_dask(str(tmp_path/'in.parquet'), gpu=True, cat_names='id,s,u', cont_names='x,big', y_names='y')
    assert len(d.to_delayed()) == 1 and tdm._footer_rows(d, 1) == [n]  # `GPU_BLOCKSIZE` of the GPU holds the 200k-row file
    with dask.config.set(scheduler='sync'):
        td = TabularDask(ddf, progress=False, split_out=3, **kw)
        td.to_parquet(tmp_path/'dask')
    x = td._layout['types']['x']  # cuDF's nullable Float32 where the column has missing values
    assert 'layout' not in td.timings and np.dtype(getattr(x, 'numpy_dtype', x)) == np.float32 and 'big' not in td._layout['types']
    ref = TabularGPU(df, **kw)
    assert_same_state(ref, td)
    assert min(ref.procs.categorify.vocab['u']) >= 2**63  # not wrapped through int64
    ref.to_parquet(tmp_path/'mem')
    assert_same_output(tmp_path/'mem', tmp_path/'dask')

@pytest.mark.gpu
def test_default_partitions_stay_within_a_workers_device_memory_limit(tmp_path):
    """Under a 64 MB `device_memory_limit` a default partition holds at most 8 MB of files (1/`LIMIT_BLOCKS`): the ~20 MB file is
    read in several (1.3 GB partitions under a 2.7 GB limit spilled to host and back: 0.20x the unlimited rate)"""
    import cudf, numpy as np
    from dask_cuda import LocalCUDACluster
    from distributed import Client
    from fastai_gpu_tabular.data import LIMIT_BLOCKS, _parquet_parts
    rng, n = np.random.default_rng(0), 1_200_000
    cudf.DataFrame({'id': rng.integers(0, 1 << 40, n), 'x': rng.standard_normal(n), 'y': rng.integers(0, 2, n)}).to_parquet(
        tmp_path/'in.parquet', row_group_size_rows=30_000)
    assert (tmp_path/'in.parquet').stat().st_size > 2 * 64_000_000 // LIMIT_BLOCKS
    with LocalCUDACluster(n_workers=1, protocol='tcp', dashboard_address=None, device_memory_limit='64MB') as cl, Client(cl):
        assert _parquet_parts(None, True)['blocksize'] == 64_000_000 // LIMIT_BLOCKS
        d, _ = read_dask(str(tmp_path/'in.parquet'), gpu=True, cat_names='id', cont_names='x', y_names='y')
        assert len(d.to_delayed()) > 1 and len(d) == n

@pytest.mark.gpu2
def test_two_cuda_workers_on_click_logs_equal_tabulargpu(tmp_path):
    """Criteo's 26 id and 13 count columns from several files on two workers (both given partitions; by default an even share of
    the rows each), value counts merged in pieces, partitions written as part files: `TabularGPU`'s state and rows on cuDF"""
    from distributed import get_task_stream
    from fastai_gpu_tabular.backend import read_frame
    from fastai_gpu_tabular.data import _busiest
    from fastai_gpu_tabular.tabular_dask import _footer_rows
    synth_criteo(1_200_000, cap=200_000, gpu=True, path=tmp_path/'in', file_rows=300_000)
    cols = {k: list(v) if isinstance(v, tuple) else v for k, v in CRITEO_SCHEMA.items()}
    kw = dict(procs=[Categorify(freq_threshold=2), FillMissing, Normalize], y_block=CategoryBlock(), splits=RandomRowSplit(0.2, seed=3))
    cluster, client = cuda_client(2)
    try:
        even, _ = read_dask(str(tmp_path/'in'), gpu=True, **cols)  # by default an even share of the rows a thread (by the footers)
        assert _busiest(_footer_rows(even, even.npartitions), 4) <= 1.05 * 300_000 and len(even) == 1_200_000
        ddf, _ = read_dask(str(tmp_path/'in'), gpu=True, blocksize='8MB', **cols)
        with get_task_stream(client) as ts:
            td = TabularDask(ddf, progress=False, split_out=2, **kw, **cols)
            td.to_parquet(tmp_path/'dask', part_rows=100_000)
    finally: client.close(); cluster.close()
    assert len(ddf.to_delayed()) >= 4 and len({t['worker'] for t in ts.data}) == 2
    ref = TabularGPU(read_frame(tmp_path/'in', gpu=True), **kw, **cols)  # the files in order
    assert_same_state(ref, td)
    ref.to_parquet(tmp_path/'mem')
    assert_same_output(tmp_path/'mem', tmp_path/'dask')

@pytest.mark.gpu
def test_fgt_prep_on_one_gpu_computes_in_its_process(tmp_path):
    """`fgt-prep --dask` on one GPU (`CUDA_VISIBLE_DEVICES` one device): no cluster started, dask's threads in its own process; the
    files `fgt-prep` writes in memory"""
    import os, subprocess, sys
    from pathlib import Path
    synth_criteo(600_000, cap=50_000, gpu=True, path=tmp_path/'in', file_rows=150_000, row_group_rows=25_000)
    flags = [f for k in ('cat_names', 'cont_names') for f in (f"--{k.replace('_', '-')}", ','.join(CRITEO_SCHEMA[k]))]
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=os.environ.get('CUDA_VISIBLE_DEVICES', '0').split(',')[0],
               PYTHONPATH=os.pathsep.join([str(Path(__file__).parent.parent), os.environ.get('PYTHONPATH', '')]))
    def prep(out, *more):
        r = subprocess.run([sys.executable, '-m', 'fastai_gpu_tabular.cli', *more, '--data', str(tmp_path/'in'), *flags, '--y-names',
                            'label', '--freq-threshold', '2', '--out', str(tmp_path/out)], env=env, capture_output=True, text=True,
                           timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        return r.stdout + r.stderr
    out = prep('dask', '--dask')
    assert 'TabularDask on cuDF (GPU)' in out and '(dask in this process: one GPU)' in out and 'dask dashboard' not in out, out
    prep('mem')
    assert_same_output(tmp_path/'mem', tmp_path/'dask')

@pytest.mark.gpu
def test_planned_rows_are_dask_cudfs_partitions(tmp_path, monkeypatch):
    """`_planned_rows` of the footers: the rows of each partition of dask_cudf's adaptive read, so that a default read on this
    process's threads is planned once (the blocksize picked on the footers) where it was planned until even"""
    import dask, dask_cudf, fastai_gpu_tabular.data as fd
    from fastai_gpu_tabular.backend import parquet_files, parquet_schema
    from fastai_gpu_tabular.tabular_dask import _footer_rows
    synth_criteo(700_000, cap=50_000, gpu=True, path=tmp_path/'in', file_rows=100_000, row_group_rows=30_000)
    files = parquet_files(tmp_path/'in'); groups = parquet_schema(files)['groups']
    total = sum(g[2] for g in groups)
    assert len(groups) == 28 and sum(g[1] for g in groups) == 700_000
    for b in (1, total // 9, total // 4, int(total * 0.6), 2 * total):
        ddf = dask_cudf.read_parquet(files, **fd._parquet_parts(b, True))
        assert fd._planned_rows(groups, b) == _footer_rows(ddf, ddf.npartitions), b
    reads, f = [], fd._parquet_parts
    monkeypatch.setattr(fd, '_parquet_parts', lambda b, gpu, alike=True: reads.append(b) or f(b, gpu, alike))
    monkeypatch.setattr(fd, '_gpu_blocksize', lambda: int(total * 0.6))  # a first blocksize of uneven partitions (60% and 40%)
    with dask.config.set(scheduler='threads', num_workers=2):
        d = fd._read_parquet(files, None, True)
        assert len(reads) > 1 and fd._busiest(_footer_rows(d, d.npartitions), 2) <= 1.05 * 350_000
        reads.clear(); d = fd._read_parquet(files, None, True, groups=groups)
    assert len(reads) == 1 and fd._busiest(_footer_rows(d, d.npartitions), 2) <= 1.05 * 350_000 and len(d) == 700_000

@pytest.mark.gpu
def test_dask_in_this_process_frees_in_stream_order(monkeypatch):
    """On one GPU in this process cuDF's resource becomes RMM's stream-ordered one where cuDF's default (`cudaMalloc`, whose
    `cudaFree` waits for the whole device) is set; a resource the user set (a pool) is kept"""
    import os, rmm, torch
    from fastai_gpu_tabular.cluster import dask_scheduler
    from fastai_gpu_tabular.stream import _async_mr
    monkeypatch.setenv('CUDA_VISIBLE_DEVICES', os.environ.get('CUDA_VISIBLE_DEVICES', '0').split(',')[0])
    i = torch.cuda.current_device(); old = rmm.mr.get_per_device_resource(i)
    try:
        for mr,want in ((rmm.mr.CudaMemoryResource(), rmm.mr.CudaAsyncMemoryResource),
                        (rmm.mr.PoolMemoryResource(rmm.mr.CudaMemoryResource(), 2**26), rmm.mr.PoolMemoryResource)):
            _async_mr.cache_clear(); rmm.mr.set_per_device_resource(i, mr)
            with dask_scheduler(True) as c: assert c is None and type(rmm.mr.get_per_device_resource(i)) is want
    finally: _async_mr.cache_clear(); rmm.mr.set_per_device_resource(i, old)
