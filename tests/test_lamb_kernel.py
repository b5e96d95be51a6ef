"""ForeachLamb's fused Triton kernels, run on the CPU by Triton's interpreter: the same parameters as fastai's Lamb
through a Learner (one-cycle lr and mom, wd_bn_bias parameter states, several blocks per parameter). A subprocess,
since Triton reads TRITON_INTERPRET when it is imported. The GPU suite runs the same kernels compiled."""
import os, subprocess, sys, pytest
from pathlib import Path

pytest.importorskip('triton')

SCRIPT = r'''
import torch
from torch import nn
from fastai.optimizer import Lamb, Adam
import fastai_gpu_tabular.optimizer as O
from test_optimizer import trained
O._Table.BLOCK, O._Table.TILES = 64, 2  # several programs per parameter, and parameters smaller than a tile
calls, step = [], O._Table.step
O._Table.step = lambda self, *a: (calls.append(len(self.BP)), step(self, *a))[1]
O.ForeachLamb._can_fuse = lambda self, ps, sts: True  # CPU tensors: the interpreter runs the kernels
for wd, wd_bn_bias in [(0., False), (0.1, False), (0.1, True)]:
    ours, theirs = trained(O.ForeachLamb, wd, wd_bn_bias), trained(Lamb, wd, wd_bn_bias)
    for (n, a), b in zip(ours.model.named_parameters(), theirs.model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6, msg=n)
assert len(calls) == 9 and calls[0] > len(list(ours.model.parameters())), calls
def run(opt_func, **kw):
    torch.manual_seed(0)
    m, w = nn.Sequential(nn.Linear(60, 40), nn.Linear(40, 1)), torch.randn(60, 1)
    opt = opt_func(m.parameters(), lr=1e-2, **kw)
    for i in range(10):
        x = torch.randn(64, 60)
        (m(x) - x @ w).pow(2).mean().backward(); opt.step(); opt.zero_grad()
    return list(m.parameters())
for kw in ({'wd': 0.1, 'decouple_wd': False}, {'mom': 0.8, 'sqr_mom': 0.9, 'eps': 1e-6}):
    for a, b in zip(run(O.ForeachLamb, **kw), run(Lamb, **kw)): torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
def no_adapt(ps, **kw):  # no trust ratio anywhere: fastai's Adam
    opt = O.ForeachLamb(ps, **kw)
    for p, *_ in opt.all_params(): opt.state[p]['layer_adapt'] = False
    return opt
for a, b in zip(run(no_adapt, wd=0.01), run(Adam, wd=0.01)): torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
print('ok', calls)
'''

def test_fused_kernels_match_fastai_lamb_in_interpreter():
    path = os.pathsep.join([str(Path(__file__).parent), os.environ.get('PYTHONPATH', '')])
    env = {**os.environ, 'TRITON_INTERPRET': '1', 'PYTHONPATH': path}
    r = subprocess.run([sys.executable, '-c', SCRIPT], env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0 and 'ok' in r.stdout, r.stdout[-2000:] + r.stderr[-4000:]
