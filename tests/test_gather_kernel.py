"""`table_block`'s Triton lookup (`_gather_into`, what a GPU runs), on the CPU by Triton's interpreter in a subprocess: the
block equals the lookups', tables spread over the block and codes of any integer type and strides; a code out of its table
raises. The GPU suite checks the compiled kernel, in bfloat16 too (the interpreter truncates where the GPU rounds)."""
import os, subprocess, sys, pytest

pytest.importorskip('triton')

SCRIPT = r'''
import torch, numpy as np
from fastai_gpu_tabular.model import _gather_into, table_groups, table_block, _offsets
torch.manual_seed(0)
tabs = [torch.randn(n, d) for n,d in [(20,5),(7,3),(30,5),(4,2),(9,3),(11,5)]]  # width 5: columns 0, 2, 5 of the block
bs, w = 37, 40
idx = torch.stack([torch.randint(0, len(t), (bs,)) for t in tabs], 1)
ref = table_block(idx, tabs, width=w)  # the CPU's lookups (and the offsets the kernel reads)
groups = list(zip(table_groups(tabs), _offsets[(idx.device, *(t.shape for t in tabs))]))
n = sum(t.shape[1] for t in tabs)
for codes in (idx, idx.to(torch.int32), idx.to(torch.int16).t().contiguous().t()):  # the loader's narrow codes, column-major
    x = torch.full((bs, w), 7.)
    for (base, cols), offs in groups: _gather_into(x, codes, base, offs)
    assert torch.equal(x[:, :n], ref[:, :n]) and (x[:, n:] == 7).all()
bad = idx.clone(); bad[3, 2] = 30  # table 2 has 30 rows
try:
    for (base, cols), offs in groups: _gather_into(torch.zeros(bs, w), bad, base, offs)
    raise AssertionError('no error')
except RuntimeError as e: assert 'out of its embedding table' in str(e), e
print('ok')
'''

def test_lookup_kernel_writes_the_lookups_into_the_block_in_interpreter():
    env = {**os.environ, 'TRITON_INTERPRET': '1'}
    r = subprocess.run([sys.executable, '-c', SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and 'ok' in r.stdout, r.stdout[-2000:] + r.stderr[-4000:]
