"Documented behaviour beyond fastai: vocabulary options, multi-hot, new NaNs at inference, bad input, saved state."
import pickle, numpy as np, pandas as pd, pytest
from types import SimpleNamespace
from hypothesis import given, settings, assume, strategies as st, HealthCheck
from fastai.data.block import CategoryBlock
import torch
from fastai_gpu_tabular.backend import explode_rows, explode_elements, cum_offsets, list_values_offsets
from fastai_gpu_tabular.procs import Categorify, FillMissing, FillStrategy, Normalize, RARE, UNSEEN
from fastai_gpu_tabular.tabular import TabularGPU, save_procs, load_procs
from fastai_gpu_tabular.data import synth_movielens, synth_tabular
from fastai_gpu_tabular.tabular import random_splits, RandomRowSplit, _mix64

def tab(df, procs, n_train=None, **kw):
    n_train = len(df) if n_train is None else n_train
    return TabularGPU(df, procs=procs, splits=[list(range(n_train)), list(range(n_train, len(df)))], **kw)

def test_freq_threshold_and_unseen():
    df = pd.DataFrame({'c': ['a','a','b','c','c','c', 'b','zz',None,'a']})
    to = tab(df, [Categorify(freq_threshold=2, unseen=True)], 6, cat_names=['c'])
    assert list(to.classes['c']) == ['#na#', 'a', 'c', RARE, UNSEEN]
    assert to.items['c'].tolist() == [1,1,3,2,2,2, 3,4,0,1]

def test_max_size_keeps_seen_codes():
    df = pd.DataFrame({'c': list('aaabbc') + ['d']})
    plain = tab(df, [Categorify()], 6, cat_names=['c'])
    capped = tab(df, [Categorify(max_size=2, unseen=True)], 6, cat_names=['c'])
    assert list(capped.classes['c']) == ['#na#', 'a', 'b', RARE, UNSEEN]
    assert capped.items['c'].tolist() == [1,1,1,2,2,3,4]
    assert plain.items['c'].tolist()[:5] == capped.items['c'].tolist()[:5]  # kept categories keep fastai's codes

@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.one_of(st.none(), st.lists(st.sampled_from(list('abcde')), max_size=4)), min_size=2, max_size=30),
       st.integers(1, 3))
def test_multi_hot_matches_reference(rows, thr):
    assume(any(r is not None for r in rows[:max(1, len(rows)//2)]))
    df = pd.DataFrame({'g': pd.Series([None if r is None else '|'.join(r) for r in rows], dtype=object)})
    to = tab(df, [Categorify(freq_threshold=thr)], max(1, len(rows)//2), mh_names=['g'])
    tr = [t for r in rows[:max(1, len(rows)//2)] if r for t in r]
    counts = pd.Series(tr, dtype=object).value_counts()
    kept = sorted(counts[counts>=thr].index)
    rare = len(kept)+1 if thr > 1 else None
    ref = lambda t: kept.index(t)+1 if t in kept else (rare if (rare and t in counts) else 0)
    expect = [[ref(t) for t in r] if r else [0] for r in rows]
    assert [list(o) for o in to.items['g']] == expect
    vals, offs = list_values_offsets(to.items['g'])
    assert [list(vals[offs[i]:offs[i+1]]) for i in range(len(rows))] == expect

def test_multi_hot_list_column():
    df = pd.DataFrame({'g': pd.Series([['x','y'], [], None, ['y']], dtype=object)})
    to = tab(df, [Categorify()], mh_names=['g'])
    assert [list(o) for o in to.items['g']] == [[1,2],[0],[0],[2]]
    assert list(to.classes['g']) == ['#na#','x','y']

def test_new_nan_at_inference_is_filled():
    df = pd.DataFrame({'a': [1., 2., 3., 10.], 'b': [np.nan, 2., 4., 4.]})
    to = tab(df, [FillMissing(fill_strategy=FillStrategy.mode), Normalize], cont_names=['a','b'])
    assert to.cat_names == ['b_na'] and to.procs.fill_missing.na_dict == {'b': 4.}
    assert FillMissing(fill_strategy=FillStrategy.mode).strategy == 'mode' == to.procs.fill_missing.fill_strategy  # a name once fitted
    t = to.new(pd.DataFrame({'a': [np.nan], 'b': [np.nan]})); t.process()
    assert 'a_na' not in t.items.columns and t.cat_names == ['b_na']
    np.testing.assert_allclose(t.items['a'], (1. - df['a'].mean()) / (df['a'].std(ddof=0) + 1e-7), rtol=1e-6)

def test_mode_ties_go_to_first_seen():
    df = pd.DataFrame({'a': [5., 1., 1., 5., np.nan]})
    to = tab(df, [FillMissing(fill_strategy=FillStrategy.mode)], cont_names=['a'])
    assert to.procs.fill_missing.na_dict == {'a': 5.}

@pytest.mark.parametrize('kw,msg', [
    (dict(cat_names=['nope']), "'nope'"),
    (dict(cont_names=['s']), "'s'"),
    (dict(cont_names=['allnan']), "'allnan'"),
    (dict(cat_names=['s'], y_names='missing_y'), "'missing_y'"),
])
def test_bad_input_names_the_column(kw, msg):
    df = pd.DataFrame({'s': ['x','y','z'], 'allnan': [np.nan]*3, 'y': [0,1,0]})
    with pytest.raises(ValueError, match=msg): TabularGPU(df, procs=[Categorify, FillMissing, Normalize], **kw)

def test_empty_training_split():
    df = pd.DataFrame({'s': ['x','y'], 'y': [0,1]})
    with pytest.raises(ValueError, match='training split is empty'):
        TabularGPU(df, procs=[Categorify], cat_names=['s'], y_names='y', splits=[[], [0,1]])

def test_unseen_target_label_is_an_error():
    df = pd.DataFrame({'s': ['x','y','x'], 'y': ['a','b','c']})
    with pytest.raises(ValueError, match="target 'y'"):
        TabularGPU(df, procs=[Categorify], cat_names=['s'], y_names='y', y_block=CategoryBlock(), splits=[[0,1],[2]])

def test_saved_state_round_trip_and_pickle(tmp_path):
    df = synth_movielens(5_000, n_users=3_000, gpu=False)
    to = synth_tabular(df, procs=[Categorify(max_size=500, unseen=True), FillMissing, Normalize], mh=True)
    save_procs(to, tmp_path, parquet_min=100)
    assert list(tmp_path.glob('*.parquet')) and b'pickle' not in (tmp_path/'procs.json').read_bytes()
    again = TabularGPU.from_saved(df.iloc[random_splits(len(df))[0]].reset_index(drop=True), tmp_path)
    for n in to.cat_names + ['target']: assert again.items[n].tolist() == to.items[n].iloc[:len(to.train)].tolist(), n
    assert [list(o) for o in again.items['genres']] == [list(o) for o in to.items['genres'].iloc[:len(to.train)]]
    procs, names = load_procs(tmp_path)
    cat = next(p for p in procs if isinstance(p, Categorify))
    assert names['cat_names'] == list(to.cat_names) and cat.classes['userId'] == to.classes['userId']
    # what `learn.export` pickles: the empty copy, which holds no data
    e = pickle.loads(pickle.dumps(to.new_empty()))
    assert len(e) == 0 and e.classes['movieId'] == to.classes['movieId']

def test_large_vocabularies_keep_their_values_and_rare_numbers_load_as_arrays(tmp_path):
    "Vocabularies and rare ids over `parquet_min` go through parquet with their types; numeric rare ids load as numpy arrays"
    vocab = dict(i=list(range(0, 600, 3)), s=[f'id{i:03d}' for i in range(50)], u=[2**63 + i for i in range(30)],
                 f=[.5*i for i in range(40)])
    rare = dict(i=list(range(1, 600, 3)), s=[f'r{i}' for i in range(30)], u=[], f=[-1.5, -.5])
    c = Categorify.from_state(dict(freq_threshold=2, max_size=None, unseen=False, sep='|', vocab=vocab, rare=rare))
    to = SimpleNamespace(procs=[c], cat_names=list(vocab), cont_names=[], mh_names=[], y_names=[])
    save_procs(to, tmp_path/'a', parquet_min=20)
    (back,), names = load_procs(tmp_path/'a')
    assert len(list((tmp_path/'a').glob('*.parquet'))) == 6 and names['cat_names'] == list(vocab)
    import pyarrow.parquet as pq  # numeric vocabularies are written from `Categorify`'s arrays, typed as pyarrow types their lists
    types = {n: str(pq.read_schema(tmp_path/'a'/f'vocab-{i}.parquet').field('v').type) for i,n in enumerate(vocab)}
    assert types == dict(i='int64', s='string', u='uint64', f='double'), types
    for n in vocab: assert back.vocab[n] == vocab[n] and [type(o) for o in back.vocab[n]] == [type(o) for o in vocab[n]], n
    assert isinstance(back.rare['i'], np.ndarray) and back.rare['i'].tolist() == rare['i'] and back.rare['s'] == rare['s']
    assert back.rare['f'] == rare['f']  # under `parquet_min`: the JSON list
    df = pd.DataFrame(dict(i=[0, 1, 2, 3], s=['id001', 'r3', 'x', 'id049'], u=[2**63, 2**63+29, 1, 0], f=[.5, -.5, 2., 9.]))
    enc = lambda p: {n: p._encode(n, df[n]).tolist() for n in vocab}
    assert enc(back) == enc(c) and enc(c)['i'] == [1, 201, 0, 2]  # 201: `#rare#`, after the 200 ids
    save_procs(SimpleNamespace(procs=[back], **names), tmp_path/'b', parquet_min=20)  # the loaded state saves as it loaded
    (again,), _ = load_procs(tmp_path/'b')
    assert again.vocab == back.vocab and all(np.array_equal(again.rare[n], back.rare[n]) for n in rare)

def test_pickled_vocabularies_are_lean_and_come_back_as_they_were():
    "dask's workers get the procs pickled: numeric vocabularies and rare ids go as arrays and come back the same lists (values, types)"
    vocab = dict(i=list(range(0, 60_000, 3)), s=[f'id{i:05d}' for i in range(500)], u=[2**63 + i for i in range(300)],
                 f=[.5*i for i in range(400)], b=[False, True], m=[True, 2, 3], e=[])
    rare = dict(i=np.array([1, 4]), s=['r'], u=[], f=[-1.5], b=[], m=[], e=[])
    c = Categorify.from_state(dict(freq_threshold=2, max_size=None, unseen=True, sep='|', vocab=vocab, rare=rare))
    df = pd.DataFrame(dict(i=[0, 1, 3, 5], s=['id00001', 'r', 'x', None], u=[2**63, 2**63+299, 1, 0], f=[.5, -1.5, 2., 9.],
                           b=[True, False, True, False], m=pd.Series([True, 2, 3, 4], dtype=object), e=[1, 2, 3, 4]))
    enc = lambda p: {n: p._encode(n, df[n]).tolist() for n in vocab}
    before, state = enc(c), c.__getstate__()
    assert 'classes' not in state and '_arrays' not in state and isinstance(state['vocab']['i'], np.ndarray)
    assert state['vocab']['m'] is vocab['m'] and state['vocab']['s'] is vocab['s']  # as an array [True, 2, 3] would be [1, 2, 3]
    back = pickle.loads(pickle.dumps(c))
    for n in vocab: assert back.vocab[n] == vocab[n] and [type(o) for o in back.vocab[n]] == [type(o) for o in vocab[n]], n
    assert {n: list(v) for n,v in back.classes.items()} == {n: list(v) for n,v in c.classes.items()}
    assert back.rare['s'] == ['r'] and back.rare['i'].tolist() == [1, 4] and enc(back) == before
    assert isinstance(state['rare']['f'], np.ndarray) and state['rare']['s'] is rare['s']  # numeric rare ids go as arrays too
    assert back.rare['f'] == [-1.5] and type(back.rare['f'][0]) is float and back.rare['u'] == []  # and come back lists
    assert before['i'][:3] == [1, 20001, 2] and before['u'][:2] == [1, 300]  # 20001: `#rare#`, after the 20,000 ids
    assert pickle.loads(pickle.dumps(Categorify(max_size=3))).max_size == 3  # not fitted: as it was

def test_fastai_procs_are_swapped_for_ours():
    from fastai.tabular.core import Categorify as FC, FillMissing as FF
    df = pd.DataFrame({'s': ['x','y'], 'a': [1., np.nan]})
    to = TabularGPU(df, procs=[FC, FF], cat_names=['s'], cont_names=['a'])
    assert [type(p) for p in to.procs] == [FillMissing, Categorify]

def test_vocab_from_counts_as_arrays_equals_its_lists():
    "`arrays=True` gives numbers as the arrays `np.asarray` makes of the lists (what `Categorify` caches and pickles): same values, types"
    from fastai_gpu_tabular.procs import vocab_from_counts
    cases = [pd.Series([3, 1, 2, 5], index=np.array([7, -2, 9, 4], dtype=np.int32)),
             pd.Series([1, 4, 4], index=np.array([2**63 + 5, 3, 2**64 - 1], dtype=np.uint64)),
             pd.Series([1, 4, 4], index=np.array([5, 3, 1], dtype=np.uint64)),
             pd.Series([2, 2, 9], index=np.array([.5, -1.25, 3.], dtype=np.float32)),
             pd.Series([2, 7], index=np.array([True, False]))]
    for vc in cases:
        for ft, ms in ((1, None), (2, None), (1, 2), (3, 1)):
            lists, arrs = vocab_from_counts(vc, ft, ms), vocab_from_counts(vc, ft, ms, arrays=True)
            for l, a in zip(lists, arrs):
                assert isinstance(a, np.ndarray) and a.tolist() == l and [type(o) for o in a.tolist()] == [type(o) for o in l]
                if len(l): assert a.dtype == np.asarray(l).dtype, (vc.index.dtype, a.dtype)
    s = pd.Series([1, 1], index=['a', 'b'])  # strings stay lists
    assert vocab_from_counts(s, arrays=True) == (['a', 'b'], [])

def test_exploded_rows_offsets_follow_each_row():
    "`explode_rows`'s offsets (torch's `bincount` and `cumsum`): an empty or missing row holds one missing element, as pandas' `explode`"
    rs = np.random.default_rng(0)
    rows = [None if rs.random() < .1 else [int(v) for v in rs.integers(0, 9, rs.integers(0, 4))] for _ in range(500)]
    s = pd.Series(rows, dtype=object, index=np.arange(500)[::-1])  # any index: rows are positions
    e, offs = explode_rows(s)
    assert offs.dtype == np.int64
    np.testing.assert_array_equal(offs, np.cumsum([0] + [max(len(r or []), 1) for r in rows]))
    for i, r in enumerate(rows): assert e.iloc[offs[i]:offs[i+1]].dropna().tolist() == (r or []), i
    pd.testing.assert_series_equal(explode_elements(s), e)
    np.testing.assert_array_equal(explode_rows(pd.Series(['a|b', '', None, 'c'], dtype='str'))[1], [0, 2, 3, 4, 5])
    np.testing.assert_array_equal(cum_offsets(np.array([2, 0, 3], dtype=np.int32)), [0, 2, 2, 5])
    assert cum_offsets(np.zeros(0, np.int64)).tolist() == [0]

def _splitmix64(x):
    "The reference: splitmix64's finaliser on a numpy uint64 array"
    with np.errstate(over='ignore'):
        for k, m in ((30, 0xbf58476d1ce4e5b9), (27, 0x94d049bb133111eb)): x = (x ^ (x >> np.uint64(k))) * np.uint64(m)
        return x ^ (x >> np.uint64(31))

def test_row_split_is_splitmix64_of_the_uint64_positions():
    "`RandomRowSplit` hashes in torch's int64 (logical shifts, products wrapping): numpy's uint64 splitmix64, bit for bit"
    a = np.random.default_rng(1).integers(0, 2**64 - 1, 50_000, dtype=np.uint64); a[:3] = [0, 2**63, 2**64 - 1]
    np.testing.assert_array_equal(_mix64(torch.from_numpy(a.view(np.int64))).numpy().view(np.uint64), _splitmix64(a))
    for seed, pct, start in ((42, 0.2, 0), (7, 0.25, 2**40)):
        with np.errstate(over='ignore'):
            pos = np.arange(start, start + 50_000, dtype=np.uint64) + np.uint64(seed*0x9e3779b97f4a7c15 % 2**64)
        want = (_splitmix64(pos) >> np.uint64(11)) * 2.0**-53 < pct
        np.testing.assert_array_equal(RandomRowSplit(pct, seed).valid_mask(start, 50_000), want)
        assert 0.9*pct < want.mean() < 1.1*pct
