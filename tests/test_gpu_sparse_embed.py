"""GPU suite for the packed tables and `SparseEmbedOpt` (`pytest -m gpu`): the packed model equals the per-table one on the
device, each rule equals its dense reference on the touched rows (gradients summed the same way), and a bf16 fit never
synchronises with the host (the touched rows' count stays on the device)."""
from functools import partial
import pytest, torch
from fastai.tabular.all import set_seed, Adam
from fastai_gpu_tabular.model import FastTabularModel
from fastai_gpu_tabular.optimizer import SparseEmbedOpt, ForeachLamb
from fastai_gpu_tabular.learner import tabular_learner
from fastai_gpu_tabular.recorder import CheckNoSync
from fastai_gpu_tabular.data import synth_criteo, CRITEO_SCHEMA
from fastai_gpu_tabular.procs import Categorify, FillMissing, Normalize
from fastai_gpu_tabular.tabular import TabularGPU, RandomRowSplit
from fastai.tabular.all import CategoryBlock

pytestmark = pytest.mark.gpu
SZS = [(5000, 16), (30, 16), (70_000, 16), (4, 8), (900, 8)]

def test_packed_model_on_the_device_equals_the_per_table_one():
    with torch.device('cuda'):
        set_seed(0); a = FastTabularModel(SZS, 3, 2, [64])
        set_seed(0); b = FastTabularModel(SZS, 3, 2, [64], sparse=True)
    for k, v in a.state_dict().items(): assert torch.equal(v, b.state_dict()[k]), k
    x = torch.stack([torch.randint(0, n, (4096,), device='cuda') for n, _ in SZS], 1)
    c = torch.randn(4096, 3, device='cuda')
    with torch.autocast('cuda', torch.bfloat16): ya, yb = a(x, c), b(x, c)
    assert torch.equal(ya, yb)
    ya.float().sum().backward(); yb.float().sum().backward()
    for (n, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        torch.testing.assert_close(q.grad.to_dense(), p.grad, rtol=1e-5, atol=1e-5, msg=n)

@pytest.mark.parametrize('rule', ['adagrad', 'lazy-adam'])
def test_rule_leaves_untouched_rows_and_matches_the_dense_step_on_touched_ones(rule):
    with torch.device('cuda'):
        set_seed(0); b = FastTabularModel(SZS, 3, 2, [64], sparse=True)
    opt = SparseEmbedOpt(list(b.parameters()), lr=0.05, opt_func=partial(Adam, wd=0.), rule=rule)
    x = torch.stack([torch.randint(0, min(n, 50), (4096,), device='cuda') for n, _ in SZS], 1)  # rows 50 on: never touched
    b(x, torch.randn(4096, 3, device='cuda')).pow(2).sum().backward()
    before = {n: p.detach().clone() for n, p in b.named_parameters() if n.startswith('embeds')}
    grads = {n: p.grad.coalesce().to_dense() for n, p in b.named_parameters() if n.startswith('embeds')}
    opt.step()
    for n, p in b.named_parameters():
        if n not in before: continue
        assert torch.equal(p[50:], before[n][50:]) and not torch.equal(p[:50], before[n][:50]), n
        g = grads[n][:50]
        want = before[n][:50] - 0.05*g/(g.abs() + 1e-5)  # a first step of either: sqrt(g²) = |g|, Adam's moments debiased to g, g²
        # g is a sum of ~80 terms that may nearly cancel, added in another order (atomics): where |g| < 1e-3, g/(|g| + eps) moves
        # by up to 1e-2 a 1e-8 of g, so there the step is only bounded (by the learning rate); elsewhere it equals the dense one
        ok = g.abs() > 1e-3
        torch.testing.assert_close(p[:50][ok], want[ok], rtol=1e-5, atol=2e-6, msg=n)
        assert ok.float().mean() > 0.5 and ((p[:50] - before[n][:50]).abs() <= 0.05 + 1e-6).all(), n

def test_bf16_fit_never_synchronises(monkeypatch):
    "The touched rows' count stays on the device: the step enters no `allowed_sync` and `CheckNoSync` sees no host sync"
    import contextlib, fastai_gpu_tabular.optimizer as O
    @contextlib.contextmanager
    def refused(): raise AssertionError('the sparse step synchronised with the host')
    monkeypatch.setattr(O, 'allowed_sync', refused)
    set_seed(0)
    to = TabularGPU(synth_criteo(60_000, cap=20_000, gpu=True), procs=[Categorify, FillMissing, Normalize],
                    splits=RandomRowSplit(0.2, 0), y_block=CategoryBlock(), **CRITEO_SCHEMA)
    learn = tabular_learner(to.dataloaders(bs=4096), layers=[64], emb_szs={n: 16 for n in to.cat_names}, config=dict(sparse=True),
                            opt_func=partial(SparseEmbedOpt, opt_func=ForeachLamb, rule='rowwise-adagrad')).to_bf16()
    v0 = learn.validate()[0]
    try: learn.fit_one_cycle(2, 1e-2, cbs=CheckNoSync())
    finally: torch.cuda.set_sync_debug_mode('default')
    assert learn.recorder.values[-1][1] < v0 - 0.01
    assert learn.model.embeds[0].weight.grad is None  # no dense gradient was ever made for a table

def test_a_code_out_of_its_table_stops_the_lookup_kernel():
    "As `F.embedding` does on a GPU: a device assert (in a subprocess, since it ends the process's CUDA context)"
    import subprocess, sys
    script = ('import torch\nfrom fastai_gpu_tabular.model import FastTabularModel\n'
              f'm = FastTabularModel({SZS}, 3, 2, [64], sparse=True).cuda()\n'
              f'x = torch.stack([torch.randint(0, n, (4096,), device="cuda") for n, _ in {SZS}], 1)\n'
              'x[7, 1] = 30\nm(x, torch.randn(4096, 3, device="cuda")).sum().item()\nprint("no error")')
    r = subprocess.run([sys.executable, '-c', script], capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and 'no error' not in r.stdout and 'assert' in r.stderr.lower(), r.stdout[-2000:] + r.stderr[-3000:]

@pytest.mark.parametrize('rule', ['adagrad', 'rowwise-adagrad', 'lazy-adam'])
def test_every_widths_step_in_one_kernel_equals_the_rules_torch_ops(rule, monkeypatch):
    "The compiled `_rows_fused` against `SPARSE_RULES`' torch ops: widths 8, 16 and 72, weight decay, three steps"
    import fastai_gpu_tabular.optimizer as O
    szs = SZS + [(3000, 72)]
    def run(fused):
        with torch.device('cuda'): set_seed(0); m = FastTabularModel(szs, 3, 2, [64], sparse=True)
        opt = SparseEmbedOpt(list(m.parameters()), lr=0.05, opt_func=partial(Adam, wd=0.1), rule=rule)
        calls, fusable = [], O._fusable
        monkeypatch.setattr(O, '_fusable', lambda rows, parts: calls.append(fusable(rows, parts)) or (fused and calls[-1]))
        g = torch.Generator(device='cuda').manual_seed(1)
        for _ in range(3):
            x = torch.stack([torch.randint(0, n, (4096,), device='cuda', generator=g) for n, _ in szs], 1)
            m(x, torch.randn(4096, 3, device='cuda', generator=g)).pow(2).mean().backward(); opt.step(); opt.zero_grad()
        assert calls == [True]*3
        return [e.weight for e in m.embeds], [opt.state[e.weight] for e in m.embeds]
    (wa, sa), (wb, sb) = run(True), run(False)
    for a, b in zip(wa, wb): torch.testing.assert_close(a, b, rtol=1e-5, atol=5e-6, msg=rule)
    for a, b in zip(sa, sb):
        for k in a:
            # the kernels sum a row's gradients in another order than `embedding_dense_backward` (a scan over chunks of 64
            # lookups): lazy Adam's first moments of rows whose ~1,000 terms nearly cancel differ by ~1e-9 (a 1e-5 of the largest)
            if torch.is_tensor(a[k]):
                torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-5*b[k].abs().max().item(), msg=f'{rule} {k}')

def test_sums_by_row_in_two_kernels_equal_embedding_dense_backwards():
    "`_sums_fused` compiled, on Criteo-like skew (a 3-id table: rows of ~20k lookups over hundreds of chunks), widths 16 and 600"
    from fastai_gpu_tabular.optimizer import _sums_fused, _sums_torch
    g = torch.Generator(device='cuda').manual_seed(0)
    bs, cards = 65536, [(3, 16), (500_000, 16), (40, 16), (200_000, 600), (1000, 600)]
    groups = [[0, 1, 2], [3, 4]]
    start, ids, vals, most = 0, [], [], []
    for grp in groups:
        off = 0
        cols = [torch.randint(0, cards[c][0], (bs,), device='cuda', generator=g) + off for c in grp]
        for c in grp: off += cards[c][0]
        ids.append(torch.stack(cols, 1).view(-1) + start); start += off
        vals.append(torch.randn(len(ids[-1]), cards[grp[0]][1], device='cuda', generator=g))
        most.append(sum(min(cards[c][0], bs) for c in grp))
    srt, perm = torch.sort(torch.cat(ids).int())
    seg = torch.cat([perm.new_zeros(1), (srt[1:] != srt[:-1]).cumsum(0)])
    e = [0, len(ids[0]), len(ids[0]) + len(ids[1])]
    torch.cuda.set_sync_debug_mode('error')
    try: a = _sums_fused(seg, perm, e, vals, most)
    finally: torch.cuda.set_sync_debug_mode('default')
    ns = [len(torch.unique(i)) for i in ids]
    for x, y, n in zip(a, _sums_torch(seg, perm, e, vals, most), ns):
        torch.testing.assert_close(x[:n], y[:n], rtol=1e-4, atol=1e-3)  # sums of up to ~22k terms, in another order
    b = _sums_fused(seg, perm, e, vals, most)
    assert all(torch.equal(x[:n], y[:n]) for x, y, n in zip(a, b, ns))  # no atomics: the same sums every run (rows past n: unset)

@pytest.mark.parametrize('split', [False, True])
def test_tables_gradients_left_in_the_block_step_as_copied_ones(split):
    """Under `_joint_only` (the whole step's graph) the tables' bf16 gradients stay in the block: `SparseEmbedOpt` steps them as the
    float32 copies (`_cols`), also where a width's tables are split over parameter groups (each table's columns read then)"""
    from fastai_gpu_tabular.model import _joint_only
    x = torch.stack([torch.randint(0, n, (4096,), device='cuda') for n, _ in SZS], 1)
    c = torch.randn(4096, 3, device='cuda')
    def step(block):
        with torch.device('cuda'): set_seed(0); m = FastTabularModel(SZS, 3, 2, [64], sparse=True)
        ps = list(m.parameters())
        groups = [ps[:1], ps[1:]] if split else [ps]  # the first table of width 16 alone: its width's joint does not fit
        opt = SparseEmbedOpt(groups, lr=0.05, opt_func=partial(ForeachLamb, wd=0.), rule='rowwise-adagrad')
        for _ in range(3):
            with torch.autocast('cuda', torch.bfloat16): y = m(x, c)
            with (_joint_only() if block else torch.enable_grad()):
                y.float().pow(2).mean().backward()
                if block: assert hasattr(m.embeds[0].weight.grad, '_block') and not m.embeds[0].weight.grad._values().any()
                opt.step(); opt.zero_grad()
        return m
    a, b = step(False), step(True)
    for (n, p), (_, q) in zip(a.named_parameters(), b.named_parameters()): assert torch.equal(p, q), n
