"""Packed tables and the row-sparse embedding step (issue 28): the packed model equals the per-table one (outputs, gradients,
`state_dict`); each rule equals its dense reference on the touched rows and leaves the other rows and their state as they were
(bit for bit on the CPU); a fit with `fit_one_cycle` resumes like a whole run; the command line's knobs."""
import json
from functools import partial
import pytest, torch
from fastai.tabular.all import Adam, set_seed, tabular_config
from fastai.optimizer import average_grad, average_sqr_grad, adam_step
from fastai_gpu_tabular.model import FastTabularModel, table_groups, table_block
from fastai_gpu_tabular.optimizer import SparseEmbedOpt, ForeachLamb, row_groups, joined, table_grad, _sums_torch
from fastai_gpu_tabular.learner import tabular_learner
from fastai_gpu_tabular.data import synth_movielens, synth_tabular
from fastai_gpu_tabular.train import main, emb_sizes, model_memory

SZS = [(20,5), (7,3), (30,5), (4,2), (9,3)]

def pair(**kw):
    set_seed(0); a = FastTabularModel(SZS, 2, 2, [8], **kw)
    set_seed(0); b = FastTabularModel(SZS, 2, 2, [8], sparse=True, **kw)
    return a, b

def batch(bs=16, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randint(0, n, (bs,), generator=g) for n,_ in SZS], 1), torch.randn(bs, 2, generator=g)

def test_packed_model_equals_the_per_table_one():
    a, b = pair()
    assert list(a.state_dict()) == list(b.state_dict())  # fastai's names
    for k, v in a.state_dict().items(): assert torch.equal(v, b.state_dict()[k]), k  # and fastai's initial weights
    tabs = [e.weight for e in b.embeds]
    assert len({t.untyped_storage().data_ptr() for t in tabs}) == 3  # widths 5, 3, 2: one tensor each
    assert [cols for _, cols in table_groups(tabs)] == [[0, 2], [1, 4], [3]]
    x, c = batch()
    ya, yb = a(x, c), b(x, c)
    assert torch.equal(ya, yb)
    (ya*torch.arange(2.)).sum().backward(); (yb*torch.arange(2.)).sum().backward()
    for (n, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        assert q.grad.is_sparse == n.startswith('embeds'), n
        torch.testing.assert_close(q.grad.to_dense(), p.grad, rtol=0, atol=1e-7, msg=n)
    a2, _ = pair(); a2.load_state_dict(b.state_dict())  # loadable both ways
    b.load_state_dict(a.state_dict())
    assert len({t.untyped_storage().data_ptr() for t in (e.weight for e in b.embeds)}) == 3  # still packed

def test_a_block_in_autocasts_dtype_gives_the_float32_blocks_values_and_gradients():
    "`table_block(dtype=bfloat16)` before a `Linear` under autocast: what the float32 block gives once the `Linear` casts it"
    _, b = pair(); lin = torch.nn.Linear(20, 3)  # the tables' 18 columns and 2 continuous ones
    x, c = batch()
    res = []
    for dt in (None, torch.bfloat16):
        for p in [*b.parameters(), *lin.parameters()]: p.grad = None
        cc = c.clone().requires_grad_()
        with torch.autocast('cpu', torch.bfloat16): blk = table_block(x, [e.weight for e in b.embeds], [cc], 20, dt); y = lin(blk)
        y.float().pow(2).sum().backward()
        res.append((blk.dtype, y, [e.weight.grad for e in b.embeds], cc.grad, lin.weight.grad))
    (d0, y0, g0, c0, w0), (d1, y1, g1, c1, w1) = res
    assert (d0, d1) == (torch.float32, torch.bfloat16) and torch.equal(y0, y1) and torch.equal(w0, w1)
    assert c1.dtype == torch.float32 and torch.equal(c0, c1)
    for p, q in zip(g0, g1): assert q.dtype == torch.float32 and torch.equal(p.to_dense(), q.to_dense())

def test_joined_gradients_are_a_view_where_consecutive():
    b = torch.arange(24.).view(6, 4)
    v = joined([b[:2], b[2:5], b[5:]])
    assert v.data_ptr() == b.data_ptr() and torch.equal(v, b)
    w = joined([b[2:5], b[:2]])  # not in storage order: copied
    assert w.data_ptr() != b.data_ptr() and torch.equal(w, torch.cat([b[2:5], b[:2]]))

def test_table_block_gives_a_widths_gradient_as_one_tensor():
    "The tables of one width get one gradient tensor in the batch's order (no transposing copy); each table's is a view of it"
    set_seed(0); m = FastTabularModel([(20, 5), (7, 5), (30, 3)], 2, 2, [8], sparse=True)  # tables 0 and 1: one tensor
    x, c = torch.stack([torch.randint(0, n, (16,)) for n in (20, 7, 30)], 1), torch.randn(16, 2)
    m(x, c).sum().backward()
    g0, g1 = (e.weight.grad for e in m.embeds[:2])
    (_, ms), = [g for g in row_groups([e.weight for e in m.embeds]) if len(g[1]) == 2]
    ids, vals = table_grad(ms)
    assert ids.shape == (32,) and vals.shape == (32, 5)
    assert g0._values().data_ptr() == vals.data_ptr() and g1._values().data_ptr() == vals.data_ptr() + 5*vals.element_size()
    torch.testing.assert_close(torch.zeros(27, 5).index_add_(0, ids, vals), torch.cat([g0.to_dense(), g1.to_dense()]), rtol=0, atol=0)
    assert table_grad(ms[:1]) is None  # not the whole width
    m(x, c).sum().backward()  # accumulated gradients: each table's own, the opt's general path
    assert table_grad(ms) is None and g0 is not m.embeds[0].weight.grad

def test_moved_tables_are_packed_again():
    "The model keeps its tables' plan (`table_plan`) between batches, and makes it again when they move, however they move"
    import copy
    a, b = pair()
    x, c = batch()
    b(x, c); plan = b._table_plan
    b(x, c); assert b._table_plan is plan  # kept
    b.to(torch.float64).to(torch.float32)  # `Module.to` gives each parameter its own tensor
    assert torch.equal(a(x, c), b(x, c)) and b._table_plan is not plan
    assert len({t.untyped_storage().data_ptr() for t in (e.weight for e in b.embeds)}) == 3
    b.embeds[2].weight.data = b.embeds[2].weight.data.clone()  # moved without `Module.to`: the pointers tell
    assert torch.equal(a(x, c), b(x, c)) and len({t.untyped_storage().data_ptr() for t in (e.weight for e in b.embeds)}) == 3
    b2 = copy.deepcopy(b)  # a copy (or a pickle) does not carry the plan, whose tensors are the original's tables
    assert '_table_plan' not in b2.__dict__ and torch.equal(a(x, c), b2(x, c))
    assert {t.data_ptr() for t in (e.weight for e in b2.embeds)}.isdisjoint(t.data_ptr() for t in (e.weight for e in b.embeds))

def dense(g):
    "A row-sparse gradient made dense by adding its rows in order (as `SparseEmbedOpt` sums them on a CPU)"
    return torch.zeros(g.shape).index_add_(0, g._indices()[0], g._values())

def sparse_grads(model, seed):
    x, c = batch(seed=seed)
    model(x, c).pow(2).sum().backward()
    return x

def step_pair(rule, steps=3, **kw):
    "The packed model stepped by `rule` (`steps` times) beside a copy of its tables and a record of the touched rows"
    _, b = pair()
    opt = SparseEmbedOpt(list(b.parameters()), lr=0.1, opt_func=partial(Adam, wd=0.), rule=rule, **kw)
    return b, opt

@pytest.mark.parametrize('rule', ['adagrad', 'rowwise-adagrad', 'lazy-adam'])
def test_rules_step_only_the_touched_rows_as_their_reference(rule):
    b, opt = step_pair(rule)
    ref = {n: p.detach().clone() for n, p in b.named_parameters() if n.startswith('embeds')}
    st = {n: {} for n in ref}
    for s in range(1, 4):
        x = sparse_grads(b, s)
        grads = {n: dense(p.grad) for n, p in b.named_parameters() if n.startswith('embeds')}
        opt.step(); opt.zero_grad()
        for i, n in enumerate(ref):
            rows = x[:, i].unique()
            w, g = ref[n][rows], grads[n][rows]
            if rule == 'adagrad':
                st[n]['sum'] = st[n].get('sum', torch.zeros_like(ref[n])); s_ = st[n]['sum'][rows].addcmul_(g, g)
                w = w.addcdiv_(g, s_.sqrt().add_(1e-5), value=-0.1); st[n]['sum'][rows] = s_
            elif rule == 'rowwise-adagrad':
                st[n]['sum'] = st[n].get('sum', torch.zeros(len(ref[n]))); s_ = st[n]['sum'][rows] + g.pow(2).mean(1)
                w = w.addcdiv_(g, s_.sqrt().add_(1e-5)[:, None], value=-0.1); st[n]['sum'][rows] = s_
            else:  # fastai's own Adam functions on the touched rows, with the table's step count
                for k in ('grad_avg', 'sqr_avg'): st[n][k] = st[n].get(k, torch.zeros_like(ref[n]))
                p = torch.nn.Parameter(w); p.grad = g
                sd = dict(grad_avg=st[n]['grad_avg'][rows], sqr_avg=st[n]['sqr_avg'][rows])
                sd.update(average_grad(p, 0.9, dampening=True, **sd)); sd.update(average_sqr_grad(p, 0.99, **sd))
                adam_step(p, 0.1, 0.9, s, 0.99, eps=1e-5, **sd)
                w = p.data; st[n]['grad_avg'][rows], st[n]['sqr_avg'][rows] = sd['grad_avg'], sd['sqr_avg']
            ref[n][rows] = w
        for n, p in b.named_parameters():
            if n in ref: assert torch.equal(p.detach(), ref[n]), (rule, s, n)  # touched rows as the reference; the others unchanged

def test_adagrad_equals_torch_adagrad_on_the_dense_gradient():
    b, opt = step_pair('adagrad')
    tabs = {n: p.detach().clone().requires_grad_() for n, p in b.named_parameters() if n.startswith('embeds')}
    ref = torch.optim.Adagrad(list(tabs.values()), lr=0.1, eps=1e-5)
    for s in range(1, 6):
        sparse_grads(b, s)
        for n, p in b.named_parameters():
            if n in tabs: tabs[n].grad = dense(p.grad)
        opt.step(); opt.zero_grad(); ref.step()
        for n, p in b.named_parameters():
            if n in tabs: assert torch.equal(p.detach(), tabs[n].detach()), (s, n)  # every row, bit for bit

def test_first_lazy_adam_step_equals_fastai_adam_and_the_state_is_one_tensor_a_width():
    a, b = pair()
    oa = Adam(list(a.parameters()), lr=0.1, wd=0.)
    ob = SparseEmbedOpt(list(b.parameters()), lr=0.1, opt_func=partial(Adam, wd=0.), rule='lazy-adam')
    x, c = batch()
    for m in (a, b): m(x, c).pow(2).sum().backward()
    oa.step(); ob.step()
    for (n, p), (_, q) in zip(a.named_parameters(), b.named_parameters()): assert torch.equal(p, q), n  # untouched rows: 0 either way
    sts = [ob.state[e.weight]['grad_avg'] for e in b.embeds]
    assert len({s.untyped_storage().data_ptr() for s in sts}) == 3 and all(b.embeds[0].weight.grad is None for _ in sts)
    assert [len(base) for base, _ in row_groups([e.weight for e in b.embeds])] == [50, 16, 4]

def fit(tmp, rule, n_epoch=2, cbs=()):
    set_seed(0)
    to = synth_tabular(synth_movielens(3_000, n_users=200, n_items=80, gpu=False))
    learn = tabular_learner(to.dataloaders(bs=256, device='cpu', seed=0), layers=[16], config=dict(sparse=True), path=tmp,
                            opt_func=partial(SparseEmbedOpt, opt_func=ForeachLamb, rule=rule))
    learn.v0 = learn.validate()[0]  # untrained
    learn.fit_one_cycle(n_epoch, 3e-2, cbs=list(cbs))
    return learn

def test_learner_refuses_a_dense_optimizer_for_sparse_tables():
    to = synth_tabular(synth_movielens(500, n_users=20, n_items=10, gpu=False))
    with pytest.raises(ValueError, match='SparseEmbedOpt'):
        tabular_learner(to.dataloaders(bs=64, device='cpu'), config=dict(sparse=True))

@pytest.mark.parametrize('rule', ['rowwise-adagrad', 'lazy-adam'])
def test_fit_one_cycle_trains_and_the_schedules_reach_the_tables(tmp_path, rule):
    learn = fit(tmp_path, rule)
    vals = [v[1] for v in learn.recorder.values]  # validation losses
    assert vals[-1] < vals[0] < learn.v0 and vals[-1] < learn.v0 - 0.02
    assert learn.opt.hypers[0]['lr'] == learn.opt.dense.hypers[0]['lr'] == learn.recorder.lrs[-1] < 1e-3  # one schedule
    st = learn.opt.state[learn.model.embeds[0].weight]
    assert st['step'] == 2*len(learn.dls.train) and ('row_sum' in st or 'grad_avg' in st)

def test_fgt_train_sparse_tables_resume_like_a_whole_run(tmp_path):
    common = dict(data='synth', rows=6_000, epochs=2, bs=400, layers='32', lr=1e-2, cpu=True, deterministic=True, checkpoint_every=4,
                  emb_opt='lazy-adam', emb_rule='fixed', emb_dim='8', opt='lamb')
    whole = main(out=str(tmp_path/'whole'), **common)
    main(out=str(tmp_path/'cut'), stop_after=17, **common)
    m = json.loads((tmp_path/'cut'/'metrics.json').read_text())  # the stopped run's: what it trained, how fast
    assert m['stopped_after'] == 17 and m['train_rows_s'] > 0 and 0 < m['phases_s']['train'] < m['phases_s']['fit']
    cut = main(out=str(tmp_path/'cut'), resume=True, **common)
    for (k, v), w in zip(whole.model.state_dict().items(), cut.model.state_dict().values()): assert torch.equal(v, w), k
    m = json.loads((tmp_path/'whole'/'metrics.json').read_text())
    assert m['emb_opt'] == 'lazy-adam' and m['model']['grads_bytes'] < m['model']['weights_bytes']
    assert {e.weight.shape[1] for e in whole.model.embeds} == {8}

def test_fgt_train_cuda_graph_on_the_cpu_warns_and_trains_as_without(tmp_path):
    common = dict(data='synth', rows=3_000, epochs=1, bs=400, layers='16', lr=1e-2, cpu=True, emb_opt='rowwise-adagrad',
                  emb_rule='fixed', emb_dim='4', opt='lamb')
    with pytest.warns(UserWarning, match='`cuda_graph` needs a GPU, not the CPU'):
        g = main(out=str(tmp_path/'g'), cuda_graph=True, **common)
    e = main(out=str(tmp_path/'e'), **common)
    for (k, v), w in zip(g.model.state_dict().items(), e.model.state_dict().values()): assert torch.equal(v, w), k
    assert json.loads((tmp_path/'g'/'metrics.json').read_text())['cuda_graph_replays'] is None

def test_emb_rule_and_emb_opt_arguments():
    assert emb_sizes(None, 'fixed', ['a', 'b']) == {'a': 16, 'b': 16} and emb_sizes('4', 'fixed', ['a']) == {'a': 4}
    assert emb_sizes(None, 'fastai', ['a']) == {} and emb_sizes('a=3', 'fastai', ['a', 'b']) == {'a': 3}
    with pytest.raises(ValueError, match="one positive number"): emb_sizes('a=3', 'fixed', ['a'])
    for kw, msg in [(dict(emb_rule='big'), '`emb_rule`'), (dict(emb_opt='sgd'), '`emb_opt`'),
                    (dict(emb_opt='adagrad', fastai_model=True), 'fastai_model')]:
        with pytest.raises(ValueError, match=msg): main(data='synth', rows=500, cpu=True, **kw)

def test_model_memory_counts_no_dense_gradient_for_sparse_tables():
    _, b = pair()
    w = sum(p.numel()*4 for p in b.parameters()); t = sum(e.weight.numel()*4 for e in b.embeds)
    dense, lazy, rows = [model_memory(b, 'cpu', emb_opt=o) for o in ('dense', 'lazy-adam', 'rowwise-adagrad')]
    assert dense['grads_bytes'] == w and dense['opt_state_bytes'] == 2*w
    assert lazy['grads_bytes'] == w - t and lazy['opt_state_bytes'] == 2*w
    assert rows['opt_state_bytes'] == 2*(w - t) + sum(len(e.weight)*4 for e in b.embeds)

def test_sparse_step_follows_tables_moved_between_steps():
    "`SparseEmbedOpt` keeps its row groups between steps; a table given another tensor is stepped there, not in the old one"
    _, b = pair()
    opt = SparseEmbedOpt(list(b.parameters()), lr=0.1, opt_func=partial(Adam, wd=0.), rule='adagrad')
    x, c = batch()
    b(x, c).sum().backward(); opt.step(); opt.zero_grad()
    b.embeds[0].weight.data = b.embeds[0].weight.data.clone(); w0 = b.embeds[0].weight.detach().clone()
    b(x, c).sum().backward(); opt.step()
    assert not torch.equal(b.embeds[0].weight[x[:, 0]], w0[x[:, 0]]) and opt._rg[1][0][0].data_ptr() == b.embeds[0].weight.data_ptr()

@pytest.mark.parametrize('exchange', ['rows', 'whole'])
def test_touched_rows_are_each_widths_unique_lookups_padded_to_the_lookups(exchange):
    """`_touched`'s shapes follow the most rows a width's lookups can touch (no host sync on a GPU): its rows and sums, then padding.
    'rows' sorts the lookups (each table's rows or lookups, the fewer); 'whole' adds them into a buffer of the tables' size (the
    width's rows or lookups, the fewer)"""
    _, b = pair()
    opt = SparseEmbedOpt(list(b.parameters()), lr=0.1, opt_func=partial(Adam, wd=0.), rule='adagrad', exchange=exchange)
    x, c = batch(bs=40)
    b(x, c).sum().backward()
    groups = row_groups([e.weight for e in b.embeds])
    rows, un, starts, sums = opt._touched(groups)
    most = [sum(min(len(p), 40) for p, _ in ms) if exchange == 'rows' else min(len(base), 40*len(ms)) for base, ms in groups]
    assert len(rows) == (40*len(SZS) if exchange == 'rows' else sum(most)) and un.shape == (len(groups), 2)
    for (base, ms), (r0, n), s, g, m in zip(groups, un.tolist(), starts, sums, most):
        ids = torch.cat([x[:, next(i for i, e in enumerate(b.embeds) if e.weight is p)] + a for p, a in ms])
        assert torch.equal(rows[r0:r0+n] - s, torch.unique(ids)) and len(g) == m  # the most rows
        dense = torch.cat([p.grad.to_dense() for p, _ in ms])
        torch.testing.assert_close(g[:n], dense[torch.unique(ids)]); assert not g[n:].any()  # sums in another order

def test_a_width_without_lookups_is_left_alone():
    "A table whose gradient holds no rows (an empty row-sparse gradient) is not stepped; the others are"
    _, b = pair()
    opt = SparseEmbedOpt(list(b.parameters()), lr=0.1, opt_func=partial(Adam, wd=0.), rule='adagrad')
    x, c = batch()
    b(x, c).sum().backward()
    w = [e.weight.detach().clone() for e in b.embeds]
    b.embeds[3].weight.grad = torch.sparse_coo_tensor(torch.zeros(1, 0, dtype=torch.long), torch.zeros(0, 2), (4, 2))
    opt.step()
    assert torch.equal(b.embeds[3].weight, w[3]) and 'sum' not in opt.state[b.embeds[3].weight]
    assert all(not torch.equal(e.weight, v) for e, v in zip(b.embeds, w) if e is not b.embeds[3])

def test_cuda_graph_takes_back_a_forward_left_by_a_fit_cut_short():
    """An exception ends a fastai fit without `after_fit`, so a `CudaGraph` leaves its forward on the model: the next fit's
    `CudaGraph` gives the model its own back (on a GPU it would take the left one for the model's, which would call itself)"""
    from fastai.tabular.all import CategoryBlock
    from fastai_gpu_tabular.graph import CudaGraph
    from fastai_gpu_tabular.tabular import TabularGPU, RandomRowSplit
    from fastai_gpu_tabular.procs import Categorify, FillMissing, Normalize
    to = TabularGPU(synth_movielens(2_000, gpu=False), procs=[Categorify, FillMissing, Normalize], cat_names=['userId', 'movieId'],
                    cont_names=['days'], y_names='target', y_block=CategoryBlock(), splits=RandomRowSplit(0.2, 0))
    learn = tabular_learner(to.dataloaders(bs=256), layers=[8])
    old = CudaGraph()
    old.active, old.fwd = False, learn.model.forward
    learn.model.forward = old._forward  # what a graphed fit that an exception cut short leaves on a GPU
    with learn.no_bar(): learn.fit(1, cbs=CudaGraph())
    assert 'forward' not in learn.model.__dict__ and len(learn.recorder.values) == 1

def test_sparse_embed_opt_names_a_wrong_rule_or_exchange():
    p = [torch.nn.Parameter(torch.zeros(4, 2))]
    with pytest.raises(ValueError, match="`exchange` must be 'auto', 'rows', 'whole' or 'local', not 'all'"):
        SparseEmbedOpt(p, 1e-2, exchange='all')
    with pytest.raises(ValueError, match="`rule` must be one of"): SparseEmbedOpt(p, 1e-2, rule='sgd')
    assert SparseEmbedOpt(p, 1e-2).exchange == 'auto'

def test_sparse_embed_opt_auto_exchange_is_whole_for_tables_no_larger_than_the_lookups(monkeypatch):
    """'auto' across ranks: the whole gradient's all-reduce where the tables have no more rows than the ranks' lookups a step,
    decided once (same on every rank); in one process the lookups sorted ('rows')"""
    import fastai_gpu_tabular.optimizer as O
    p = [torch.nn.Parameter(torch.zeros(4, 2))]
    small,big,look = [(torch.zeros(20, 2), [])],[(torch.zeros(25, 2), [])],[torch.zeros(12, 2)]
    assert SparseEmbedOpt(p, 1e-2)._exchange(small, look) == 'rows'
    monkeypatch.setattr(O, 'distributed', lambda: True); monkeypatch.setattr(O, 'rank_world', lambda: (0, 2))
    o = SparseEmbedOpt(p, 1e-2)
    assert o._exchange(small, look) == 'whole' and o._exchange(big, look) == 'whole'  # the first step's choice stays
    assert SparseEmbedOpt(p, 1e-2)._exchange(big, look) == 'rows'
    assert SparseEmbedOpt(p, 1e-2, exchange='rows')._exchange(small, look) == 'rows'
