"""Does the streaming loader train as well from windows of ~10 row groups as from ~40? The question behind the format's row-group
size (`ROW_GROUP_BYTES`): 4x larger groups write 100M Criteo rows ~3 s faster (bench/NOTES.md), but a window of the default
budget then holds ~10 of them instead of ~40, a coarser shuffle. Synthetic rows are independent, so their order is made to
matter: the training rows sorted by one id column (`--order`, as a log is ordered by time), or left as generated.

    python bench/profiles/shuffle_windows.py                         # CPU, ~15 minutes: 3 seeds x (resident, 40 a window, 10 a window)
    python bench/profiles/shuffle_windows.py --rows 4000000 --seeds 5

Each run: a fresh `tabular_learner` ([200, 100], embeddings of width 8), `fit_one_cycle(1, lr)` with batches of `--bs`, from
`TabularDataLoaders.from_processed` with `mem_bytes` that makes a window hold `--groups` row groups (prefetch 2: three windows
and two batches) and an epoch `--windows` windows (the default budget's ~650 MB windows are ~1/4 of 25M Criteo rows), against the same rows resident and shuffled whole (`BatchDataLoader`); the validation rows (a random 20%)
are the same in every run. Reports the validation AUC by seed, mean and spread."""
import argparse, json, statistics, sys, tempfile, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).parent.parent))  # bench/: common, roofline
from common import report

def main():
    p = argparse.ArgumentParser()
    p.add_argument('--rows', type=int, default=2_000_000)
    p.add_argument('--cap', type=int, default=5_000, help='most distinct ids of a column')
    p.add_argument('--order', default='C2', help="an id column the rows are sorted by, or 'none' (as generated)")
    p.add_argument('--groups', default='40,10', help='row groups a window holds (each a run)')
    p.add_argument('--windows', type=int, default=8, help='windows an epoch (the same in every run: only the row groups change)')
    p.add_argument('--seeds', type=int, default=3)
    p.add_argument('--bs', type=int, default=1024)
    p.add_argument('--lr', type=float, default=1e-2)
    p.add_argument('--name', default='shuffle_windows')
    a = p.parse_args()
    import numpy as np, torch
    from fastai.tabular.all import CategoryBlock, RocAucBinary, set_seed
    from fastai_gpu_tabular.data import synth_criteo, CRITEO_SCHEMA
    from fastai_gpu_tabular.procs import Categorify, FillMissing, Normalize
    from fastai_gpu_tabular.tabular import TabularGPU, RandomRowSplit
    from fastai_gpu_tabular.learner import tabular_learner
    from fastai_gpu_tabular.stream import TabularDataLoaders, ParquetDataLoader
    torch.set_num_threads(max(torch.get_num_threads(), 1))
    df = synth_criteo(a.rows, cap=a.cap, seed=0, gpu=False)
    if a.order != 'none': df = df.sort_values(a.order, kind='stable').reset_index(drop=True)
    names = {k: list(v) if isinstance(v, tuple) else v for k, v in CRITEO_SCHEMA.items()}
    to = TabularGPU(df, procs=[Categorify, FillMissing, Normalize], y_block=CategoryBlock(), splits=RandomRowSplit(0.2, seed=1), **names)
    n_train, tmp = len(to.train), Path(tempfile.mkdtemp())
    rows, cfg = [], dict(layers=[200, 100], emb_szs={n: 8 for n in to.cat_names})
    def fit(dls, seed):
        set_seed(seed); learn = tabular_learner(dls, metrics=RocAucBinary(), **cfg)
        with learn.no_bar(), learn.no_logging(): learn.fit_one_cycle(1, a.lr)
        return float(learn.validate()[1])
    runs = [('resident, shuffled whole', None)] + [(f'{g} row groups a window', int(g)) for g in a.groups.split(',')]
    for name, g in runs:
        if g is None: path = None
        else:  # windows of the same rows in every run, of g row groups
            rg = -(-n_train // (a.windows * g)); path = to.to_parquet(tmp/f'g{g}', row_group_rows=rg)
            src = ParquetDataLoader(path, bs=a.bs, mem_bytes=1 << 40, device='cpu').src  # the loader's own bytes a group and a row
            mem = 3 * g * int(src.nbytes.max()) + 2 * a.bs * (int((src.nbytes / np.maximum(src.rows, 1)).max()) + 1)
        aucs = []
        for s in range(a.seeds):
            t = time.perf_counter()
            dls = to.dataloaders(bs=a.bs, device='cpu', seed=s) if path is None else \
                  TabularDataLoaders.from_processed(path, bs=a.bs, mem_bytes=mem, seed=s, device='cpu')
            aucs.append(fit(dls, s)); print(name, s, round(aucs[-1], 5), f'{time.perf_counter()-t:.0f} s', flush=True)
        rows.append(dict(run=name, row_group_rows=None if g is None else rg, windows=None if g is None else len(dls.train.windows()),
                         aucs=[round(x, 5) for x in aucs], mean=round(statistics.mean(aucs), 5),
                         std=round(statistics.stdev(aucs), 5) if len(aucs) > 1 else 0.))
    base = rows[0]['mean']
    for r in rows: r['vs_resident'] = round(r['mean'] - base, 5)
    report(a.name, rows, ['run', 'row_group_rows', 'windows', 'mean', 'std', 'vs_resident', 'aucs'],
           dict(bench='shuffle_windows', rows=a.rows, train_rows=n_train, cap=a.cap, order=a.order, bs=a.bs, lr=a.lr, seeds=a.seeds))

if __name__ == '__main__': main()
