"Our pandas path, with default options, against fastai's `TabularPandas` (`reduce_memory=False`) on random frames."
import warnings, numpy as np, pandas as pd
from hypothesis import given, settings, assume, HealthCheck
from fastai.tabular.core import TabularPandas, Categorify as FCategorify, FillMissing as FFillMissing
from fastai.data.transforms import Normalize as FNormalize
from fastai.data.block import CategoryBlock, RegressionBlock
from fastai_gpu_tabular.tabular import TabularGPU
from fastai_gpu_tabular.procs import Categorify, FillMissing, Normalize
from frames import frames, usable, CAT, CONT

def both(df, n_train, y, y_block):
    splits = [list(range(n_train)), list(range(n_train, len(df)))]
    kw = dict(cat_names=list(CAT), cont_names=list(CONT), y_names=y, y_block=y_block, splits=splits, reduce_memory=False)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        fai = TabularPandas(df.copy(), procs=[FCategorify, FFillMissing, FNormalize], **{**kw, 'cat_names': list(CAT)})
    return fai, TabularGPU(df, procs=[Categorify, FillMissing, Normalize], **kw)

def check_same(fai, ours):
    assert list(ours.cat_names) == list(fai.cat_names)
    for n in fai.cat_names: np.testing.assert_array_equal(ours.items[n].to_numpy(), fai.items[n].to_numpy().astype(np.int64), err_msg=n)
    for n in fai.cont_names:
        assert ours.items[n].dtype == np.float32
        np.testing.assert_allclose(ours.items[n].to_numpy(), fai.items[n].to_numpy(), rtol=1e-6, atol=0, err_msg=n)
    for n in fai.y_names: np.testing.assert_allclose(ours.items[n].to_numpy(), fai.items[n].to_numpy(), rtol=1e-6, err_msg=n)

@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(frames())
def test_same_as_fastai(d):
    df, n_train = d
    assume(usable(df, n_train))
    fai, ours = both(df, n_train, 'yc', CategoryBlock())
    check_same(fai, ours)
    for n in fai.cat_names: assert list(ours.classes[n]) == list(fai.classes[n]), n
    assert list(ours.procs.categorize.vocab) == list(fai.procs.categorize.vocab)
    # a test set with categories unseen in training, and NaNs only where training had them (fastai asserts otherwise)
    test = df.sample(frac=1, random_state=0).reset_index(drop=True)
    test['ci'] = test['ci'].where(test.index % 3 > 0, 99.)
    if test[CONT].isna().any().any() and not set(test[CONT].columns[test[CONT].isna().any()]) <= set(fai.procs.fill_missing.na_dict): return
    t_f, t_o = fai.new(test.copy()), ours.new(test)
    t_f.process(); t_o.process()
    check_same(t_f, t_o)

@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(frames())
def test_same_as_fastai_regression(d):
    df, n_train = d
    assume(usable(df, n_train))
    check_same(*both(df, n_train, 'yr', RegressionBlock()))

def test_caller_frame_untouched():
    df = pd.DataFrame({'a': ['x', None, 'y', 'x'], 'b': [1., np.nan, 3., 4.], 'y': [0., 1., 0., 1.]})
    before = df.copy()
    cats = ['a']
    TabularGPU(df, procs=[Categorify, FillMissing, Normalize], cat_names=cats, cont_names=['b'], y_names='y')
    pd.testing.assert_frame_equal(df, before)
    assert cats == ['a']
