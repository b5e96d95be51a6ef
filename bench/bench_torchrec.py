"""`fgt-train`'s defaults beside TorchRec + FBGEMM on one GPU (issue 83), each in a fresh process, alternated, on the same processed
folder: the same streamed batches (`ParquetDataLoader` at the batch size `fgt-train` picked), the same MLP (`FastTabularModel`'s
`bn_cont` and layers, built by `build_step`), widths, learning rate and one-cycle schedule, bf16 autocast. The others train in a plain
PyTorch loop, as their users write it, the MLP by the same `ForeachLamb`: 'torchrec' the tables as TorchRec's `EmbeddingBagCollection`
sharded by `DistributedModelParallel` (table-wise, FBGEMM's fused kernel, `RowWiseAdagrad` applied in the backward: FBGEMM's
EXACT_ROWWISE_ADAGRAD), 'fbgemm' FBGEMM's table-batched embedding (TorchRec's kernel) alone. Training rows/s (batches x rows over the
training seconds, as `fgt-train` counts), AUC on the validation split, torch's peak GPU memory.

    python bench/bench_torchrec.py --data <processed folder> --repeats 3 --name torchrec_criteo_100m -- --epochs 1"""
import argparse, json, os, statistics, subprocess, sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).parent))
from common import report, run

def worker(a, m):
    "One run of `a.impl` at `fgt-train`'s settings `m` (its metrics.json): the metrics as `run` gives them"
    import torch, torch.nn as nn, torch.distributed as dist
    from fastai.callback.schedule import combined_cos
    from fastai.tabular.data import TabularDataLoaders
    import fastai_gpu_tabular.stream  # `from_processed`
    from fastai_gpu_tabular.train import build_step
    from fastai_gpu_tabular.ranking import roc_auc
    from fastai_gpu_tabular.optimizer import ForeachLamb
    from fastai.optimizer import Adam
    from fastai.torch_core import set_seed
    device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')
    t0 = time.perf_counter(); set_seed(42)  # `fgt-train`'s seed
    dls = TabularDataLoaders.from_processed(a.data, bs=m['bs'], seed=42, device=device)
    to,names = dls.train_ds,list(dls.train_ds.cat_names)
    learn = build_step(dls, to, 'category', '512,256', str(a.emb_dim), False, False, m['opt'], [], Path('/tmp'), m['precision'], 'fixed',
                       m['emb_opt'])
    bn_cont,layers,lr,eps = learn.model.bn_cont,learn.model.layers,m['lr'],1e-5  # `ForeachLamb`'s eps, which the tables share
    sizes,bound = [len(e.weight) for e in learn.model.embeds],0.01*3**0.5  # fastai's tables: trunc_normal(std 0.01); uniform of that std
    del learn  # its tables
    if device.type == 'cuda': torch.cuda.empty_cache(); torch.cuda.reset_peak_memory_stats(device)
    class Net(nn.Module):  # the tables' block (`emb` of the tables and the codes), then `fgt-train`'s MLP
        def __init__(self, tables): super().__init__(); self.tables,self.bn_cont,self.layers = tables,bn_cont,layers
        def forward(self, x_cat, x_cont): return self.layers(torch.cat([emb(self.tables, x_cat), self.bn_cont(x_cont)], 1))
    n = len(names)
    if a.impl == 'torchrec':
        from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
        from torchrec.distributed.model_parallel import DistributedModelParallel
        from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology, ParameterConstraints
        from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
        from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
        from torchrec.optim import RowWiseAdagrad
        os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(29500 + os.getpid() % 1000))
        dist.init_process_group('nccl' if device.type == 'cuda' else 'gloo', rank=0, world_size=1)
        ebc = EmbeddingBagCollection(tables=[EmbeddingBagConfig(name=f't_{c}', embedding_dim=a.emb_dim, num_embeddings=s, feature_names=[c],
                                                                weight_init_min=-bound, weight_init_max=bound) for c,s in zip(names, sizes)],
                                     device=torch.device('meta'))
        apply_optimizer_in_backward(RowWiseAdagrad, ebc.parameters(), dict(lr=lr, eps=eps))
        net = Net(ebc)
        cons = {f't_{c}': ParameterConstraints(sharding_types=['table_wise'], compute_kernels=['fused']) for c in names}
        plan = EmbeddingShardingPlanner(topology=Topology(world_size=1, compute_device=device.type), constraints=cons).collective_plan(
            net, [EmbeddingBagCollectionSharder()], dist.GroupMember.WORLD)
        model = DistributedModelParallel(net, device=device, plan=plan)
        fused = model.fused_optimizer
        def emb(tables, xc):
            b = len(xc)
            kjt = KeyedJaggedTensor(keys=names, values=xc.t().reshape(-1), lengths=xc.new_ones(n*b), stride=b, length_per_key=[b]*n)
            return tables(kjt).values()
        dense = [p for k,p in model.named_parameters() if '.tables.' not in f'.{k}']
    else:
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import SplitTableBatchedEmbeddingBagsCodegen, ComputeDevice
        from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation
        from fbgemm_gpu.split_embedding_configs import EmbOptimType
        loc,cd = (EmbeddingLocation.DEVICE, ComputeDevice.CUDA) if device.type == 'cuda' else (EmbeddingLocation.HOST, ComputeDevice.CPU)
        tbe = SplitTableBatchedEmbeddingBagsCodegen([(s, a.emb_dim, loc, cd) for s in sizes], optimizer=EmbOptimType.EXACT_ROWWISE_ADAGRAD,
                                                    learning_rate=lr, eps=eps, device=device)
        with torch.no_grad():
            for w in tbe.split_embedding_weights(): w.uniform_(-bound, bound)
        model = Net(tbe).to(device)
        class Fused:  # the learning rate FBGEMM's fused step reads
            param_groups = [{}]
            def step(self): tbe.set_learning_rate(self.param_groups[0]['lr'])
        fused = Fused()
        def emb(tables, xc):
            b = len(xc)
            return tables(xc.t().reshape(-1).long(), torch.arange(0, n*b+1, device=xc.device))
        dense = [p for k,p in model.named_parameters() if not k.startswith('tables.')]
    opt = ForeachLamb(dense, lr=lr) if m['opt'] == 'lamb' else Adam(dense, lr=lr)  # `fgt-train`'s choice (LAMB from 16,384 rows a step)
    for p in dense:
        if p.ndim == 1: opt.state[p]['layer_adapt'] = False  # `ExcludeEmbeddings`: biases and BatchNorm's weights without the trust ratio
    sched_lr,sched_mom = combined_cos(0.25, lr/25., lr, lr/1e5),combined_cos(0.25, 0.95, 0.85, 0.95)  # `fit_one_cycle`'s defaults
    loss_func,total,step,batches,seconds = nn.CrossEntropyLoss(),a.epochs*len(dls.train),0,0,0.
    setup_s,bf16 = time.perf_counter() - t0,m['precision'] == 'bf16'
    for epoch in range(a.epochs):
        model.train()
        if device.type == 'cuda': torch.cuda.synchronize()
        t = time.perf_counter()
        for xc,xn,y in dls.train:
            pos = step/total; opt.set_hyper('lr', sched_lr(pos)); opt.set_hyper('mom', sched_mom(pos))
            for g in fused.param_groups: g['lr'] = sched_lr(pos)
            fused.step()  # the tables' learning rate for this backward
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                out = model(xc, xn)
            loss = loss_func(out.float(), y.view(-1))
            loss.backward(); opt.step(); opt.zero_grad()
            step += 1; batches += 1
        if device.type == 'cuda': torch.cuda.synchronize()
        seconds += time.perf_counter() - t
    model.eval(); preds,targs = [],[]
    with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
        for xc,xn,y in dls.valid: preds.append(model(xc, xn).float().softmax(1)[:, 1]); targs.append(y.view(-1))
    auc = float(roc_auc(torch.cat(preds), torch.cat(targs)))
    peak = torch.cuda.max_memory_allocated(device) if device.type == 'cuda' else None
    return dict(train_rows_s=batches*m['bs']/seconds, auc=auc, phases=dict(setup=setup_s, train=seconds), gpu_peak_bytes=peak,
                loss=float(loss), batches=batches)

if __name__ == '__main__':
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--data', required=True, help="a processed folder (fgt-prep)")
    p.add_argument('--impls', default='fgt,torchrec,fbgemm', help="comma-separated, of fgt, torchrec, fbgemm")
    p.add_argument('--repeats', type=int, default=1)
    p.add_argument('--emb-dim', type=int, default=16, help="every table's width (fgt-train's `--emb-dim`)")
    p.add_argument('--epochs', type=int, default=1)
    p.add_argument('--name', default='torchrec')
    p.add_argument('flags', nargs='*', help="more of fgt-train's flags (after `--`): the others take its batch size, learning rate, "
                   "optimizer, precision and tables' step from its metrics.json")
    p.add_argument('--worker', default=None, help=argparse.SUPPRESS)  # fgt-train's metrics.json as JSON: one run of `--impl`
    p.add_argument('--impl', default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        print('FGT_BENCH', json.dumps(worker(a, json.loads(a.worker))), flush=True); os._exit(0)  # NCCL's teardown skipped
    here,rows,fgt = Path(__file__).resolve().parents[1],[],None
    flags = ['--epochs', str(a.epochs), '--emb-dim', str(a.emb_dim), *a.flags]
    for i in range(a.repeats):
        for impl in a.impls.split(','):
            if impl == 'fgt':
                r = run(here, a.data, flags); fgt = r['metrics']
                rows.append(dict(impl='fgt', run=i, train_rows_s=round(r['train_rows_s']), auc=r['auc'], train_s=round(r['phases']['train'], 2),
                                 gpu_peak_gb=round((fgt.get('gpu_peak_bytes') or 0)/2**30, 2), wall=round(r['wall'], 1)))
            else:
                if fgt is None: sys.exit("`--impls`: 'fgt' first (the others take its batch size and learning rate)")
                t = time.time()
                res = subprocess.run([sys.executable, __file__, '--data', a.data, '--worker', json.dumps(fgt), '--impl', impl, '--epochs',
                                      str(a.epochs), '--emb-dim', str(a.emb_dim)], capture_output=True, text=True, cwd=here)
                line = next((l for l in res.stdout.splitlines() if l.startswith('FGT_BENCH ')), None)
                if line is None: rows.append(dict(impl=impl, run=i, error=(res.stderr.strip().splitlines() or ['no output'])[-1][:300])); continue
                w = json.loads(line[len('FGT_BENCH '):])
                rows.append(dict(impl=impl, run=i, train_rows_s=round(w['train_rows_s']), auc=w['auc'], train_s=round(w['phases']['train'], 2),
                                 gpu_peak_gb=round((w['gpu_peak_bytes'] or 0)/2**30, 2), wall=round(time.time() - t, 1)))
            print(json.dumps(rows[-1]), flush=True)
    med = lambda impl, k, warm: statistics.median([r[k] for r in rows if r['impl'] == impl and k in r and (r['run'] > 0) == warm] or [0])
    summary = {}
    for impl in a.impls.split(','):
        if impl == 'fgt' or not med(impl, 'train_rows_s', False): continue
        for k,warm in (('first', False), ('warm', True)):
            if med(impl, 'train_rows_s', warm): summary[f'fgt_over_{impl}_{k}'] = round(med('fgt', 'train_rows_s', warm)/med(impl, 'train_rows_s', warm), 3)
        summary[f'auc_fgt_minus_{impl}'] = round(med('fgt', 'auc', False) - med(impl, 'auc', False), 4)
    report(a.name, rows, ['impl', 'run', 'train_rows_s', 'auc', 'train_s', 'gpu_peak_gb', 'wall', 'error'],
           dict(bench='torchrec', data=a.data, epochs=a.epochs, emb_dim=a.emb_dim, summary=summary))
    print(summary)
