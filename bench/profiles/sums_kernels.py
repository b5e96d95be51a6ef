"""`_sums_kernel` and `_carry_kernel` (`SparseEmbedOpt`'s gradients summed by row) alone, over their shapes: lookups a program (C),
column tile (CB), warps, chunks a carry program (P) and a step of its loop over a long row (Q), on 65,536 rows x 39 columns of
Zipf ids (1.2: a row of ~12,000 lookups; 2.0; 'criteo': 1.2 with 3 columns of 3 ids, rows of ~22,000 lookups as synth-criteo's
smallest columns), widths 16 and 128, beside torch's `embedding_dense_backward`; the largest difference from it; then the
sums read where the bf16 block holds the gradients (`_BlockCols`) against its float32 copy and the sums. One GPU.

    python bench/profiles/sums_kernels.py | tee bench/results/sums_kernels_<card>.log"""
import torch, numpy as np, triton
import fastai_gpu_tabular.optimizer as O
dev = 'cuda'
def tm(f, n=20):
    f(); torch.cuda.synchronize(); e = [torch.cuda.Event(enable_timing=True) for _ in range(2)]; e[0].record()
    for _ in range(n): f()
    e[1].record(); torch.cuda.synchronize(); return e[0].elapsed_time(e[1])/n
bs, k, vocab = 65536, 39, 200_000
for zs in (1.2, 2.0, 'criteo'):
    z = torch.from_numpy(np.random.default_rng(0).zipf(1.2 if zs == 'criteo' else zs, (bs, k)) % vocab)
    if zs == 'criteo': z[:, :3] %= 3
    ids = (z + torch.arange(k)*vocab).view(-1).to(dev)
    srt, perm = torch.sort(ids.int()); seg = torch.cat([perm.new_zeros(1), (srt[1:] != srt[:-1]).cumsum(0)])
    nu = int(seg[-1]) + 1; n = len(ids)
    print('zipf', zs, 'lookups', n, 'rows', nu, 'hottest row lookups', int(torch.bincount(seg).max()), flush=True)
    for d in (16, 128):
        v = torch.randn(n, d, device=dev)
        ref = O._sums_torch(seg, perm, [0, n], [v], [n])[0]
        for C in (32, 64, 128, 256):
            nc = -(-n//C)
            gs, pt = torch.empty(n*d, device=dev), torch.empty(2*nc*d, device=dev)
            meta = torch.tensor([0, n, d, v.data_ptr(), gs.data_ptr(), pt.data_ptr(), 1, d], device=dev)  # 1 lookup a row of d
            out = []
            for CB in sorted({min(64, triton.next_power_of_2(d)), min(128, triton.next_power_of_2(d)), min(32, triton.next_power_of_2(d))}):
                for w in (1, 2, 4, 8):
                    try: ts = tm(lambda: O._sums_kernel[(nc, 1)](perm, seg, meta, v, C=C, CB=CB, num_warps=w))
                    except Exception as ex: out.append(f'CB{CB} w{w} failed'); continue
                    out.append(f'CB{CB} w{w} {ts:.3f}')
            tc = [f'P{P} Q{Q} {tm(lambda: O._carry_kernel[(-(-nc//P), 1)](seg, meta, C=C, BD=triton.next_power_of_2(d), P=P, Q=Q)):.3f}'
                  for P in (8, 32) for Q in sorted({P, max(2, O.CARRY_RUN//triton.next_power_of_2(d))})]
            err = (gs.view(n, d)[:nu] - ref[:nu]).abs().max().item()
            print(f'width {d} C {C}: sums {", ".join(out)} | carry {", ".join(tc)} ms | err {err:.1e}', flush=True)
        print(f'width {d}: torch embedding_dense_backward {tm(lambda: O._sums_torch(seg, perm, [0, n], [v], [n])):.3f} ms', flush=True)
        blk = O._BlockCols(v.view(bs, k*d).bfloat16(), 0, k, d)  # the lookups' gradients as the bf16 block holds them, row by row
        t_copy, t_block = [tm(lambda: O._sums_fused(seg, perm, [0, n], [f(blk)], [n])) for f in (O._fp32_lookups, lambda b: b)]
        print(f'width {d}: the float32 copy (`_cols`) then the sums {t_copy:.3f} ms, the sums read in the bf16 block {t_block:.3f} ms', flush=True)
