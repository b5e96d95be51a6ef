"""The ranking metrics against references: a brute-force average over every order of tied rows (MRR, recall@k), sklearn's
`ndcg_score` per group (NDCG@k), and a plain per-group numpy loop on tie-free data, on hypothesis-generated scores,
labels, graded gains and group ids (near 2**62 included; groups of one row and groups with no positive)."""
import itertools, numpy as np, pytest, torch
from hypothesis import given, settings, HealthCheck, strategies as st
from sklearn.metrics import ndcg_score
from fastai_gpu_tabular.ranking import mrr, recall_at_k, ndcg_at_k

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
    want = [np.sum([refs[i][j] if has[i] else 0. for i in counted]) / max(len(counted), 1) for j in range(3)]
    P, T, G = torch.tensor(p), torch.tensor(t), torch.tensor(g)
    got = [float(mrr(P, T, G, empty_as_zero)), float(recall_at_k(P, T, G, k, empty_as_zero)), float(ndcg_at_k(P, T, G, k, empty_as_zero))]
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)

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
    cpu = [mrr(P, T, G), recall_at_k(P, T, G, 20), ndcg_at_k(P, T, G, 10)]
    P, T, G = P.cuda(), T.cuda(), G.cuda()
    torch.cuda.set_sync_debug_mode('error')  # computed on the device, read only at the end
    try: gpu = [mrr(P, T, G), recall_at_k(P, T, G, 20), ndcg_at_k(P, T, G, 10)]
    finally: torch.cuda.set_sync_debug_mode('default')
    np.testing.assert_allclose([float(o) for o in gpu], [float(o) for o in cpu], rtol=1e-9)
