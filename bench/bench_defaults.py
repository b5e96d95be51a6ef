"""`fgt-train` with no model, optimizer or precision flag against the best flags and against dense fp32 tables (issue 56's targets:
the defaults' wall time <= 1.2x the best flags', AUC within 0.002 of dense fp32), each in a fresh process on the same data, one after
the other; with `--ref`, another package's defaults too (an earlier commit's: the MovieLens run no slower, its AUC no lower).

    python bench/bench_defaults.py --data /tmp/criteo_processed --name defaults_criteo -- --epochs 1
    python bench/bench_defaults.py --data movielens --configs defaults --ref /tmp/base --repeats 2 --name defaults_movielens

The first run of each configuration is the one a user gets (kernel caches are the machine's, warm after the first process)."""
import argparse, json, statistics, sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).parent))
from common import report, run

CONFIGS = dict(defaults=[],  # what a user who passes no flag gets
               best=['--precision', 'bf16', '--emb-rule', 'fixed', '--emb-dim', '16', '--emb-opt', 'rowwise-adagrad', '--lr', '0.01',
                     '--cuda-graph'],  # the five flags of the click-log recipe
               dense_fp32=['--emb-opt', 'dense', '--emb-rule', 'fastai', '--precision', 'fp32', '--no-cuda-graph'])  # the AUC reference

if __name__ == '__main__':
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--data', required=True, help="a processed folder (fgt-prep), a file, or 'movielens'")
    p.add_argument('--configs', default='defaults,best,dense_fp32', help=f"comma-separated, of {', '.join(CONFIGS)}")
    p.add_argument('--ref', default=None, help="a folder holding another `fastai_gpu_tabular` package: its defaults run too ('ref')")
    p.add_argument('--repeats', type=int, default=1)
    p.add_argument('--name', default='defaults')
    p.add_argument('flags', nargs='*', help="fgt-train's flags for every configuration, after `--`")
    a = p.parse_args()
    here = Path(__file__).resolve().parents[1]
    runs = [('this', here, c) for c in a.configs.split(',')] + ([('ref', Path(a.ref).resolve(), 'defaults')] if a.ref else [])
    rows = []
    for i in range(a.repeats):
        for version, root, cfg in runs:
            r = run(root, a.data, [*a.flags, *CONFIGS[cfg]]); m = r['metrics']
            rows.append(dict(version=version, config=cfg, run=i, wall=round(r['wall'], 2), train_s=round(r['phases']['train'], 2),
                             train_rows_s=round(m['train_rows_s'] or 0), auc=m.get('roc_auc_score'), accuracy=m.get('accuracy'),
                             params=m.get('model', {}).get('params'), emb_opt=m.get('emb_opt'), precision=m.get('precision'),
                             cuda_graph=m.get('cuda_graph', m.get('cuda_graph_replays') is not None), lr=m.get('lr'),
                             defaults=m.get('defaults'), phases={k: round(v, 2) for k, v in r['phases'].items()}, package=r['package']))
            print(json.dumps(rows[-1]), flush=True)
    first = lambda cfg, v='this': next((r for r in rows if r['config'] == cfg and r['version'] == v), None)
    for r in rows:
        if (b := first('best')) and r['version'] == 'this': r['wall_over_best'] = round(r['wall'] / b['wall'], 3)
        if (d := first('dense_fp32')) and r['auc'] is not None and d['auc'] is not None: r['auc_minus_dense'] = round(r['auc'] - d['auc'], 4)
        if (f := first('defaults', 'ref')) and r['auc'] is not None: r['auc_minus_ref'] = round(r['auc'] - f['auc'], 4)
    cols = ['version', 'config', 'run', 'wall', 'train_s', 'train_rows_s', 'auc', 'accuracy', 'params', 'emb_opt', 'precision', 'cuda_graph',
            'lr', 'wall_over_best', 'auc_minus_dense', 'auc_minus_ref']
    rate = lambda v, warm: [r['train_rows_s'] for r in rows if r['version'] == v and r['config'] == 'defaults' and (r['run'] > 0) == warm]
    summary = {k: round(statistics.median(rate('this', w))/statistics.median(rate('ref', w)), 3) for k, w in (('first', False), ('warm', True))
               if a.ref and rate('ref', w)}  # this package's defaults over the ref's, training rows/s: the first round, the later ones' medians
    report(a.name, rows, cols, dict(bench='defaults', data=a.data, flags=a.flags, configs=a.configs, ref=a.ref, summary=summary))
    print(summary)
