"GPU tests: selected with `pytest -m gpu` (`-m gpu2`: two GPUs); without CUDA or cuDF they fail, so an empty GPU run cannot pass."
import pytest
from fastai_gpu_tabular.backend import gpu_available

@pytest.fixture(autouse=True)
def _need_gpu(request):
    if request.node.get_closest_marker('gpu') and not gpu_available():
        pytest.fail("this test needs cuDF and a CUDA GPU (install the `[gpu]` extra on a CUDA machine)")
    if request.node.get_closest_marker('gpu2'):
        import torch
        if not gpu_available() or torch.cuda.device_count() < 2:
            pytest.fail("this test needs two CUDA GPUs and cuDF (`pytest -m gpu2` on a machine with two GPUs)")
