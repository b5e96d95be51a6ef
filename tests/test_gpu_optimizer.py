"GPU suite for ForeachLamb (`pytest -m gpu`): the fused Triton kernels give fastai's Lamb's result, with no host synchronisation."
import pytest, torch
from torch import nn
from fastai.optimizer import Lamb
from fastai_gpu_tabular.optimizer import ForeachLamb

pytestmark = pytest.mark.gpu

def run(opt_func, steps=20, **kw):
    torch.manual_seed(0)
    m, w = nn.Sequential(nn.Linear(64, 32), nn.Linear(32, 1)).cuda(), torch.randn(64, 1, device='cuda')
    opt = opt_func(list(m.parameters()), lr=1e-2, **kw)
    for _ in range(steps):
        x = torch.randn(256, 64, device='cuda')
        (m(x) - x @ w).pow(2).mean().backward(); opt.step(); opt.zero_grad()
    return list(m.parameters()), opt

@pytest.mark.parametrize('kw', [{}, {'wd': 0.1}, {'wd': 0.1, 'decouple_wd': False}, {'mom': 0.8, 'sqr_mom': 0.9, 'eps': 1e-6}])
@pytest.mark.parametrize('fused', [True, False])
def test_same_as_fastai_lamb_on_gpu(kw, fused):
    ours, opt = run(ForeachLamb, fused=fused, **kw)
    assert bool(opt._tables) == fused
    for a, b in zip(ours, run(Lamb, **kw)[0]): torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)

@pytest.mark.parametrize('fused', [True, False])
def test_without_trust_ratio_is_fastai_adam(fused):
    from fastai.optimizer import Adam
    def no_adapt(ps, **kw):
        opt = ForeachLamb(ps, fused=fused, **kw)
        for p, *_ in opt.all_params(): opt.state[p]['layer_adapt'] = False
        return opt
    for a, b in zip(run(no_adapt, wd=0.01)[0], run(Adam, wd=0.01)[0]): torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)

def test_fused_through_learner_matches_fastai_lamb():
    "one-cycle lr and mom, wd_bn_bias masks, embeddings and BatchNorm, cuDF data"
    from test_optimizer import trained
    for wd, wd_bn_bias in [(0.1, False), (0.1, True)]:
        ours, theirs = trained(ForeachLamb, wd, wd_bn_bias, device='cuda'), trained(Lamb, wd, wd_bn_bias, device='cuda')
        assert ours.opt._tables and next(ours.model.parameters()).is_cuda
        for (n, a), b in zip(ours.model.named_parameters(), theirs.model.parameters()):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6, msg=n)

@pytest.mark.parametrize('fused', [True, False])
def test_step_has_no_host_sync(fused):
    ps, opt = run(ForeachLamb, steps=2, wd=0.1, fused=fused)
    for p in ps: p.grad = torch.randn_like(p)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode('error')
    try: opt.step(); opt.zero_grad()
    finally: torch.cuda.set_sync_debug_mode('default')
