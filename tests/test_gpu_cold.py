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

def test_procs_compile_no_cupy_kernel_in_a_fresh_process():
    "bench_e2e's procs in a new process with an empty cupy cache: every kernel they launch is compiled ahead of time"
    code = textwrap.dedent('''
        import json, cupy.cuda.compiler as cc
        names = []
        f = cc._compile_module_with_cache
        def spy(source, *a, **k): names.append(source[source.find('void'):][:60]); return f(source, *a, **k)
        cc._compile_module_with_cache = spy
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
        print(json.dumps(names))''')
    with tempfile.TemporaryDirectory() as d:
        r = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, env=dict(os.environ, CUPY_CACHE_DIR=d))
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.splitlines()[-1]) == []
