"GPU suite for ForeachLamb (`pytest -m gpu`): fastai's Lamb's result on the device, and no host synchronisation in the step."
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

@pytest.mark.parametrize('kw', [{}, {'wd': 0.1}, {'wd': 0.1, 'decouple_wd': False}])
def test_same_as_fastai_lamb_on_gpu(kw):
    for a, b in zip(run(ForeachLamb, **kw)[0], run(Lamb, **kw)[0]): torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)

def test_step_has_no_host_sync():
    ps, opt = run(ForeachLamb, steps=2, wd=0.1)
    for p in ps: p.grad = torch.randn_like(p)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode('error')
    try: opt.step(); opt.zero_grad()
    finally: torch.cuda.set_sync_debug_mode('default')
