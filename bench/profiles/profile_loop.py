"""fastai's training loop around a step that does nothing, as `CudaGraph` runs it around a whole step's replay: the host's
microseconds a training batch with `fgt-train`'s callbacks (the scheduler, the recorder, the timer, `ExcludeEmbeddings`), on the
CPU; `--cprofile tottime` shows where they go. Another package: `PYTHONPATH=<its folder> python bench/profiles/profile_loop.py`.

    python bench/profiles/profile_loop.py --rounds 3 --name loop_host_cpu"""
import argparse, cProfile, pstats, statistics, sys
from pathlib import Path
p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument('--rounds', type=int, default=3)
p.add_argument('--cprofile', default=None, help="also a cProfile of one more fit, in this order (pstats': tottime, cumulative)")
p.add_argument('--name', default=None, help="write the rounds to bench/results/NAME.json")
a = p.parse_args()
sys.path.insert(0, str(Path(__file__).parents[1]))
from fastai.tabular.all import CategoryBlock, noop
from fastai_gpu_tabular.data import synth_criteo, CRITEO_SCHEMA
from fastai_gpu_tabular.procs import Categorify, FillMissing, Normalize
from fastai_gpu_tabular.tabular import TabularGPU, RandomRowSplit
from fastai_gpu_tabular.learner import tabular_learner
from fastai_gpu_tabular.optimizer import ForeachLamb, ExcludeEmbeddings
from fastai_gpu_tabular.train import TrainTimer
from common import report

to = TabularGPU(synth_criteo(200_000, cap=1000, gpu=False), procs=[Categorify, FillMissing, Normalize], splits=RandomRowSplit(0.2, 42),
                y_block=CategoryBlock(), **CRITEO_SCHEMA)
learn = tabular_learner(to.dataloaders(bs=64, seed=0, device='cpu'), layers=[8], emb_szs={n: 2 for n in to.cat_names},
                        opt_func=ForeachLamb, cbs=[ExcludeEmbeddings(), TrainTimer()], emb_opt='rowwise-adagrad')
def one_batch():  # `CudaGraph._one_batch` around its replay: the graph's outputs, then fastai's events of the step
    learn.pred,learn.loss_grad,learn.loss = pred,loss,loss
    learn('after_pred'); learn('after_loss')
    learn._with_events(noop, 'backward', Exception); learn._with_events(noop, 'step', Exception)
xb = learn.dls.one_batch(); pred = learn.model(*xb[:2]).detach(); loss = pred.mean()
learn.fit_one_cycle(1, 1e-2)  # the optimizer and the loop's first calls made
learn._do_one_batch = one_batch
us = []
for _ in range(a.rounds):
    with learn.no_bar(): learn.fit_one_cycle(1, 1e-2)
    us.append(learn.train_timer.seconds/learn.train_timer.batches*1e6)
print(f"{learn.train_timer.batches} training batches a fit: {statistics.median(us):.0f} us a batch (median of {a.rounds}: "
      f"{', '.join(f'{u:.0f}' for u in us)})")
if a.name: report(a.name, [dict(round=i, us_a_batch=round(u, 1)) for i,u in enumerate(us)], ['round', 'us_a_batch'],
                  dict(bench='loop_host', median_us=round(statistics.median(us), 1)))
if a.cprofile:
    cp = cProfile.Profile(); cp.enable()
    with learn.no_bar(): learn.fit_one_cycle(1, 1e-2)
    cp.disable(); pstats.Stats(cp).sort_stats(a.cprofile).print_stats(30)
