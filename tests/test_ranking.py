"""The ranking metrics against references: a brute-force average over every order of tied rows (MRR, recall@k), sklearn's
`ndcg_score` per group (NDCG@k), and a plain per-group numpy loop on tie-free data, on hypothesis-generated scores,
labels, graded gains and group ids (near 2**62 included; groups of one row and groups with no positive)."""
import itertools, numpy as np, pytest, torch
from hypothesis import given, settings, HealthCheck, strategies as st
from sklearn.metrics import ndcg_score, roc_auc_score
from fastai_gpu_tabular.ranking import mrr, recall_at_k, ndcg_at_k, roc_auc

def brute(p, t, k):
    "(MRR, recall@k) of one group, averaged over every order of its tied scores"
    blocks = {}
    for i in range(len(p)): blocks.setdefault(p[i], []).append(i)
    rr, rec = [], []
    for perms in itertools.product(*[list(itertools.permutations(blocks[s])) for s in sorted(blocks, reverse=True)]):
        rel = [t[i] > 0 for b in perms for i in b]
        rr.append(next((1 / (j + 1) for j, x in enumerate(rel) if x), 0.)); rec.append(sum(rel[:k]) / max(sum(rel), 1))
    return np.mean(rr), np.mean(rec)

def ndcg_ref(p, t, k):
    "sklearn's tie-averaged NDCG@k of one group (a group of one row: 1)"
    return ndcg_score([t], [p], k=k) if len(p) > 1 else 1.

rows = st.tuples(st.integers(0, 3), st.integers(0, 2), st.integers(0, 3))  # (score, gain, group): many ties

@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(rows, min_size=1, max_size=18), st.integers(1, 5), st.sampled_from([0, 2**62 - 5]), st.booleans())
def test_equal_brute_force_and_sklearn(data, k, base, empty_as_zero):
    p, t, g = (np.array(c, dtype=float) for c in zip(*data))
    g = g.astype(np.int64) + base
    ids = np.unique(g)
    if any((g == i).sum() > 6 for i in ids): return  # brute force: at most 6! orders a group
    refs = {i: (*brute(p[g == i], t[g == i], k), ndcg_ref(p[g == i], t[g == i], k)) for i in ids}
    has = {i: t[g == i].max() > 0 for i in ids}
    counted = [i for i in ids if has[i] or empty_as_zero]
    # no group: NaN
    want = [np.sum([refs[i][j] if has[i] else 0. for i in counted]) / len(counted) if counted else np.nan for j in range(3)]
    P, T, G = torch.tensor(p), torch.tensor(t), torch.tensor(g)
    got = [float(mrr(P, T, G, empty_as_zero)), float(recall_at_k(P, T, G, k, empty_as_zero)), float(ndcg_at_k(P, T, G, k, empty_as_zero))]
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)

@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(rows, min_size=1, max_size=40), st.sampled_from([0, 2**62 - 5]), st.booleans())
def test_auc_equals_sklearn_overall_and_per_group(data, base, empty_as_zero):
    p, t, g = (np.array(c, dtype=float) for c in zip(*data))
    t, g = t % 2, g.astype(np.int64) + base  # binary labels, many tied scores
    P, T, G = torch.tensor(p), torch.tensor(t), torch.tensor(g)
    one = len(np.unique(t)) == 1
    assert np.isnan(float(roc_auc(P, T))) if one else np.isclose(float(roc_auc(P, T)), roc_auc_score(t, p), rtol=1e-12)
    both = {i: len(np.unique(t[g == i])) == 2 for i in np.unique(g)}
    per = [roc_auc_score(t[g == i], p[g == i]) if ok else 0. for i, ok in both.items() if ok or empty_as_zero]
    got = float(roc_auc(P, T, G, empty_as_zero))
    assert np.isnan(got) if not any(both.values()) else np.isclose(got, np.mean(per), rtol=1e-12), (got, per)

def test_equal_a_per_group_loop_on_tie_free_data():
    rng = np.random.default_rng(0)
    n, k = 20_000, 10
    g = rng.integers(0, 800, n) * 7919 + 2**61
    p, t = rng.standard_normal(n), rng.integers(0, 5, n) * (rng.random(n) < 0.3)
    ref = []
    for i in np.unique(g):
        o = np.argsort(-p[g == i]); tt = t[g == i][o]
        if tt.max() == 0: continue
        rel = tt > 0
        dcg = (tt[:k] / np.log2(np.arange(2, min(k, len(tt)) + 2))).sum()
        ideal = np.sort(tt)[::-1][:k]
        ref.append((1 / (np.argmax(rel) + 1), rel[:k].sum() / rel.sum(), dcg / (ideal / np.log2(np.arange(2, len(ideal) + 2))).sum()))
    P, T, G = torch.tensor(p), torch.tensor(t), torch.tensor(g)
    got = [float(mrr(P, T, G)), float(recall_at_k(P, T, G, k)), float(ndcg_at_k(P, T, G, k))]
    np.testing.assert_allclose(got, np.mean(ref, 0), rtol=1e-10)

def test_k_below_one_is_refused():
    x = torch.ones(3)
    with pytest.raises(ValueError, match='`k`'): recall_at_k(x, x, x.long(), 0)
    with pytest.raises(ValueError, match='`k`'): ndcg_at_k(x, x, x.long(), 0)

@pytest.mark.gpu
def test_the_same_on_the_gpu_without_a_host_sync():
    rng = np.random.default_rng(1)
    n = 100_000
    P, T, G = (torch.tensor(a) for a in (rng.integers(0, 50, n).astype(float), rng.integers(0, 3, n), rng.integers(0, 5_000, n) + 2**62))
    cpu = [mrr(P, T, G), recall_at_k(P, T, G, 20), ndcg_at_k(P, T, G, 10), roc_auc(P, T > 1, G), roc_auc(P, T > 1)]
    P, T, G = P.cuda(), T.cuda(), G.cuda()
    torch.cuda.set_sync_debug_mode('error')  # computed on the device, read only at the end
    try: gpu = [mrr(P, T, G), recall_at_k(P, T, G, 20), ndcg_at_k(P, T, G, 10), roc_auc(P, T > 1, G), roc_auc(P, T > 1)]
    finally: torch.cuda.set_sync_debug_mode('default')
    np.testing.assert_allclose([float(o) for o in gpu], [float(o) for o in cpu], rtol=1e-9)

# --- the fastai metrics: group ids travel with the batches, in memory, streamed, through the CLI and over 2 ranks
import json
from pathlib import Path
from fastai.tabular.all import ProgressCallback, set_seed, tabular_config, RocAucBinary
from fastai.tabular.data import TabularDataLoaders
from fastai_gpu_tabular.ranking import MRR, NDCGAt, RecallAt, GroupAuc, RocAucBinary as DeviceRocAucBinary
from fastai_gpu_tabular.data import synth_movielens, synth_tabular
from fastai_gpu_tabular.learner import tabular_learner
from fastai_gpu_tabular.train import main
import fastai_gpu_tabular.stream

def ranked_data(n=12_000):
    df = synth_movielens(n, n_users=200, n_items=150, gpu=False)
    # raw string ids (hashed to distinct groups); graded gains
    df['user'], df['rating_gain'] = df['userId'].astype(str), df['target']*2. + df['hour'] % 3
    return synth_tabular(df, splits=(range(int(n*.8)), range(int(n*.8), n)))

METRICS = lambda: [MRR('user'), NDCGAt(10, 'user'), RecallAt(20, 'user'), NDCGAt(5, 'user', gain='rating_gain')]

def fitted(dls):
    set_seed(0)
    learn = tabular_learner(dls, layers=[16], metrics=METRICS(), config=tabular_config(use_bn=False, bn_cont=False))
    learn.remove_cb(ProgressCallback)
    learn.fit(1, 1e-2)
    return learn

def test_metrics_through_fit_equal_the_functions_on_get_preds():
    to = ranked_data()
    learn = fitted(to.dataloaders(bs=1000, shuffle=False, extra_names=['user', 'rating_gain'], device='cpu'))
    preds, targs, (users, gains) = learn.get_preds_extras()
    assert len(users) == len(to.valid) and torch.equal(gains, torch.tensor(to.valid.items['rating_gain'].to_numpy(), dtype=torch.float32))
    s, t = (preds[:, 1].log() - preds[:, 0].log()), targs.view(-1)
    want = [mrr(s, t, users), ndcg_at_k(s, t, users, 10), recall_at_k(s, t, users, 20), ndcg_at_k(s, gains, users, 5)]
    np.testing.assert_allclose([float(v) for v in learn.recorder.values[-1][1:]], [float(w) for w in want], rtol=1e-4)
    assert learn.recorder.metric_names[3:-1] == ['mrr', 'ndcg@10', 'recall@20', 'ndcg@5']

def test_device_auc_equals_fastais_roc_auc_binary():
    "Our `RocAucBinary` (no group column needed) gives fastai's through `fit`, `GroupAuc` the mean of sklearn's per user"
    to = ranked_data()
    set_seed(0)
    learn = tabular_learner(to.dataloaders(bs=1000, shuffle=False, extra_names=['user'], device='cpu'), layers=[16],
                            metrics=[RocAucBinary(), DeviceRocAucBinary(), GroupAuc('user')],
                            config=tabular_config(use_bn=False, bn_cont=False))
    learn.remove_cb(ProgressCallback)
    learn.fit(1, 1e-2)
    fai, ours, gauc = learn.recorder.values[-1][2:]
    assert learn.recorder.metric_names[3:-1] == ['roc_auc_score', 'roc_auc_score', 'gauc'] and 0.5 < ours < 1
    assert abs(fai - ours) < 1e-6, (fai, ours)
    preds, targs, (users,) = learn.get_preds_extras()
    y, s, u = targs.view(-1).numpy(), preds[:, 1].numpy(), users.numpy()
    per = [roc_auc_score(y[u == i], s[u == i]) for i in np.unique(u) if len(np.unique(y[u == i])) == 2]
    assert abs(gauc - np.mean(per)) < 1e-4, (gauc, np.mean(per))

def test_streamed_pass_through_groups_give_the_in_memory_metrics(tmp_path):
    to = ranked_data()
    a = fitted(to.dataloaders(bs=1000, shuffle=False, extra_names=['user', 'rating_gain'], device='cpu')).recorder.values[-1]
    path = to.to_parquet(tmp_path/'p', pass_names=['user', 'rating_gain'], row_group_rows=700)
    dls = TabularDataLoaders.from_processed(path, bs=1000, shuffle=False, mem_bytes=200_000, extra_names=['user', 'rating_gain'],
                                            device='cpu')
    np.testing.assert_allclose(fitted(dls).recorder.values[-1], a, rtol=1e-5)

def test_a_metric_without_groups_says_what_to_pass():
    to = ranked_data(3_000)
    learn = tabular_learner(to.dataloaders(bs=500, device='cpu'), layers=[8], metrics=MRR())
    learn.remove_cb(ProgressCallback)
    with pytest.raises(ValueError, match="extra_names"): learn.fit(1)

def test_cli_group_names_and_metrics(tmp_path):
    learn = main(data='synth', rows=4_000, epochs=1, bs=256, cpu=True, out=str(tmp_path/'r'), group_names='userId',
                 metrics='auc,mrr,ndcg@10,recall@20')
    m = json.loads((tmp_path/'r'/'metrics.json').read_text())
    assert {'roc_auc_score', 'mrr', 'ndcg@10', 'recall@20'} <= set(m) and 0 < m['ndcg@10'] <= 1
    with pytest.raises(ValueError, match='--group-names'): main(data='synth', rows=2_000, cpu=True, out=str(tmp_path/'x'), metrics='mrr')
    with pytest.raises(ValueError, match='needs a cutoff'):
        main(data='synth', rows=2_000, cpu=True, out=str(tmp_path/'x'), group_names='userId', metrics='ndcg')

def test_two_ranks_give_one_process_value(tmp_path):
    from test_distributed import launch
    launch(2, 'tests/dist_rank_worker.py', tmp_path)
    r0, r1 = [json.loads((tmp_path/f'rank{r}.json').read_text()) for r in (0, 1)]
    assert r0['values'] == r1['values']
    to = ranked_data()
    learn = tabular_learner(to.dataloaders(bs=500, extra_names=['user', 'rating_gain'], device='cpu', seed=0), layers=[16],
                            metrics=METRICS(), config=tabular_config(use_bn=False, bn_cont=False))
    learn.model.load_state_dict(torch.load(tmp_path/'model.pth', weights_only=True))
    learn.remove_cb(ProgressCallback)
    np.testing.assert_allclose(r0['values'], [float(v) for v in learn.validate()], rtol=1e-5)
