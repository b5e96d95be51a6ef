"""Where `fgt-train`'s time goes outside the training phase: the run under cProfile in a fresh process (the first on the
machine: cold kernel caches), then the same run again in another process (warm caches); metrics.json's phases of both,
and the profile's top entries by cumulative time.

    python bench/profiles/profile_train.py --data /tmp/crp --epochs 1 --precision bf16 --emb-dim 16 --bs 65536"""
import argparse, cProfile, io, json, pstats, subprocess, sys, tempfile
p = argparse.ArgumentParser()
p.add_argument('--data', required=True)
p.add_argument('--top', type=int, default=45)
p.add_argument('--profiled', action='store_true', help='(internal) this process is the profiled run')
a, rest = p.parse_known_args()  # the rest: fgt-train's flags
if a.profiled:
    from fastcore.script import anno_parser
    from fastai_gpu_tabular.train import main
    kw = {k: v for k, v in anno_parser(main).parse_args(rest).__dict__.items() if k not in ('pdb', 'xtra', 'data')}  # typed as fgt-train's
    pr = cProfile.Profile(); pr.enable(); main(data=a.data, **kw); pr.disable()
    s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats('cumulative').print_stats(a.top); print(s.getvalue()[-12000:])
    sys.exit()
for run in ('cold, profiled', 'warm'):
    out = tempfile.mkdtemp()
    cmd = ([sys.executable, __file__, '--profiled', '--data', a.data, *rest, '--out', out] if run != 'warm' else
           [sys.executable, '-m', 'fastai_gpu_tabular.train', '--data', a.data, *rest, '--out', out])
    r = subprocess.run(cmd, capture_output=True, text=True)
    if run != 'warm': print(r.stdout[-12000:])
    print(run, json.dumps(json.load(open(f'{out}/metrics.json'))['phases_s']) if r.returncode == 0 else r.stderr[-3000:])
