"GPU suite: the first process on a machine compiles no cupy kernel for the procs, and the torch paths that replaced them equal pandas"
import json, os, subprocess, sys, tempfile, textwrap, numpy as np, pandas as pd, pytest
from fastai_gpu_tabular.backend import *

pytestmark = pytest.mark.gpu

COLS = {'i8': pd.array([3, -1, 3, None, 7], dtype='Int8'), 'i32': pd.array([5, 9, None, 5, 2**30], dtype='Int32'),
        'i64': pd.array([2**62, 1, None, 2**62+1, 1], dtype='Int64'), 'u16': pd.array([7, 2, 7, None, 65535], dtype='UInt16'),
        'u64': pd.array([2**64-1, 0, None, 5, 0], dtype='UInt64'), 'f32': pd.array([0.5, np.nan, -2.0, 0.5, 1e30], dtype='float32'),
        'b': pd.array([True, False, None, True, True], dtype='boolean')}

@pytest.mark.parametrize('col', list(COLS))
def test_uniques_and_codes_equal_pandas(col):
    p = pd.Series(COLS[col], name=col); g = to_backend(p.to_frame(), gpu=True)[col]
    u = sorted_uniques(g)
    assert u == sorted_uniques(p) and [type(o) for o in u] == [type(o) for o in sorted_uniques(p)]
    for cats in (u, u[1:], u[:1]):  # every value known, the first unknown, only one known
        np.testing.assert_array_equal(to_pandas(cat_codes(g, cats)).to_numpy(), cat_codes(p, cats).to_numpy(), err_msg=str(cats))

def test_standardize_equals_pandas_bit_for_bit():
    p = pd.Series(np.random.default_rng(0).standard_normal(10_000) * 1e3)
    for s in (p, p.round().astype('int64'), p.where(p > 0)):  # floats, integers (torch on both), missing values (the frames' own)
        g, ref = to_backend(s.to_frame('x'), gpu=True)['x'], ((s.astype('float64') - 3.25) / 7.5).astype('float32').to_numpy()
        np.testing.assert_array_equal(to_pandas(standardize(g, 3.25, 7.5)).to_numpy(), ref)
        np.testing.assert_array_equal(standardize(s, 3.25, 7.5).to_numpy(), ref)

SPY = '''
import json, traceback, cupy.cuda.compiler as cc
names = []
f = cc._compile_module_with_cache
def spy(source, *a, **k):
    at = [f"{fr.name}:{fr.lineno}" for fr in traceback.extract_stack() if 'fastai_gpu_tabular' in fr.filename][-2:]
    names.append(source[source.find('void'):][:60] + ' at ' + ' < '.join(reversed(at))); return f(source, *a, **k)
cc._compile_module_with_cache = spy
'''

def compiled(code:str, **env)->list:
    "The cupy kernels `code` compiled in a new process with an empty cupy cache (each with its first kernel line and its caller)"
    with tempfile.TemporaryDirectory() as d:
        r = subprocess.run([sys.executable, '-c', SPY + textwrap.dedent(code)], capture_output=True, text=True,
                           env=dict(os.environ, CUPY_CACHE_DIR=d, **env))
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.splitlines()[-1])

def test_procs_compile_no_cupy_kernel_in_a_fresh_process():
    "bench_e2e's procs in a new process with an empty cupy cache: every kernel they launch is compiled ahead of time"
    assert compiled('''
        from fastai.tabular.all import CategoryBlock
        from fastai_gpu_tabular.data import synth_movielens, BENCH_SCHEMA
        from fastai_gpu_tabular.tabular import TabularGPU, random_splits
        from fastai_gpu_tabular.procs import Categorify, FillMissing, Normalize
        df = synth_movielens(100_000, gpu=False)
        import cudf; df = cudf.from_pandas(df)
        names.clear()  # what building the frame needed is not the procs'
        schema = {k: list(v) if isinstance(v, tuple) else v for k, v in BENCH_SCHEMA.items()}
        TabularGPU(df, procs=[Categorify, FillMissing, Normalize], splits=random_splits(len(df), 0.2, 42), y_block=CategoryBlock(),
                   **schema)
        print(json.dumps(names))''') == []

def test_a_first_fgt_prep_of_multi_hot_rows_and_its_first_batch_compile_no_cupy_kernel(tmp_path):
    """`fgt-prep --dask` on one GPU (dask's threads in this process, `RandomRowSplit`, a multi-hot column of `|`-joined strings),
    then a streamed batch of its folder, in a new process with an empty cupy cache: nothing compiled. (A machine's first
    MovieLens-shaped `fgt-prep` spent 11 s compiling cupy's `bincount` and `cumsum`, the split's hash and `~`: bench/NOTES.md)"""
    from fastai_gpu_tabular.data import synth_movielens
    synth_movielens(60_000, gpu=False).to_parquet(tmp_path/'in.parquet', row_group_size=15_000)
    assert compiled(f'''
        from fastai_gpu_tabular.data import main
        from fastai_gpu_tabular.stream import TabularDataLoaders
        names.clear()
        main(data='{tmp_path/"in.parquet"}', cat_names='userId,movieId,hour', cont_names='days,year', mh_names='genres',
             y_names='target', dask=True, out='{tmp_path/"out"}', blocksize='256KB')
        b = TabularDataLoaders.from_processed('{tmp_path/"out"}', bs=4096).one_batch()
        print(json.dumps(names))''', CUDA_VISIBLE_DEVICES=os.environ.get('CUDA_VISIBLE_DEVICES', '0').split(',')[0]) == []

def test_split_hash_and_multi_hot_offsets_through_torch_equal_numpy():
    "The split's hash and the multi-hot offsets, now torch's kernels on the GPU: numpy's and pandas' results exactly"
    import cupy
    from fastai_gpu_tabular.tabular import RandomRowSplit
    for sp, start in ((RandomRowSplit(0.2, 42), 0), (RandomRowSplit(0.3, 9), 2**40)):
        g = sp.valid_mask(start, 200_000, cupy)
        assert g.dtype == bool
        np.testing.assert_array_equal(cupy.asnumpy(g), sp.valid_mask(start, 200_000))
    p = pd.Series(['a|b', None, '', 'c', 'a||c', 'b'] * 500, dtype='str')
    (ep, op), (eg, og) = explode_rows(p), explode_rows(to_backend(p.to_frame('m'), gpu=True)['m'])
    np.testing.assert_array_equal(cupy.asnumpy(og), op)
    eg = to_pandas(eg)
    assert eg.isna().tolist() == ep.isna().tolist() and eg.dropna().tolist() == ep.dropna().tolist()
    np.testing.assert_array_equal(cupy.asnumpy(cum_offsets(cupy.asarray([3, 0, 2], dtype=cupy.int32))), [0, 3, 3, 5])
