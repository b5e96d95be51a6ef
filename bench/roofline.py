"The roofline every loader/model benchmark compares with: a plain PyTorch loop over data already in device tensors."
import time, torch
from common import sync

def plain_loop(model, cats, conts, ys, bs, n_batches, warmup=5, lr=1e-3, mh=None, opt_func=None, bf16=False):
    """rows/s of a plain training loop: batches by index gather from device tensors, `opt_func` (default fastai's `Adam`
    with its defaults, as the Learner runs it), cross-entropy.
    `mh`: optional list of (values, offsets) multi-hot columns, gathered per batch like the loader does.
    `bf16`: forward and loss under bf16 autocast, as fastai's `to_bf16` runs them."""
    import contextlib
    from fastai_gpu_tabular.loader import bag_batch
    if opt_func is None: from fastai.optimizer import Adam as opt_func
    opt = opt_func(list(model.parameters()), lr=lr)
    model.train()
    n = len(cats)
    g = torch.Generator(device=cats.device); g.manual_seed(0)
    perm = torch.randperm(n, generator=g, device=cats.device)
    def step(i):
        idx = perm[(i*bs) % (n-bs+1):][:bs]
        xs = (cats[idx], conts[idx]) + ((tuple(bag_batch(v, o, idx) for v, o in mh),) if mh else ())
        with torch.autocast('cuda', dtype=torch.bfloat16) if bf16 else contextlib.nullcontext():
            loss = torch.nn.functional.cross_entropy(model(*xs), ys[idx].view(-1))
        loss.backward(); opt.step(); opt.zero_grad()
    for i in range(warmup): step(i)
    sync(); t = time.perf_counter()
    for i in range(n_batches): step(warmup + i)
    sync()
    return n_batches * bs / (time.perf_counter() - t)
