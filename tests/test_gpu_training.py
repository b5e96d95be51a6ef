"""GPU suite for the training loop (`pytest -m gpu`): no host synchronisation per batch in fp32 and bf16 with the
DeviceRecorder and the BatchDataLoader (fastai's own Recorder does synchronise: the check can fail), and mixed
precision with the loader and EmbeddingBag, keeping fp32 master weights and optimizer state."""
import pytest, torch
from torch import nn
from fastai.tabular.all import CategoryBlock, Adam, RocAucBinary, Recorder, ProgressCallback, set_seed
from fastai_gpu_tabular.procs import Categorify, FillMissing, Normalize
from fastai_gpu_tabular.tabular import TabularGPU
from fastai_gpu_tabular.learner import tabular_learner
from fastai_gpu_tabular.optimizer import ForeachLamb, ExcludeEmbeddings
from fastai_gpu_tabular.recorder import CheckNoSync, DeviceRecorder
from fastai_gpu_tabular.data import synth_movielens, BENCH_MH, synth_tabular

pytestmark = pytest.mark.gpu

def learner(mh=False, opt_func=ForeachLamb, bs=2048, n=100_000):
    set_seed(0)
    df = synth_movielens(n, n_users=3_000, n_items=1_000, gpu=True)
    to = synth_tabular(df, mh=mh)
    learn = tabular_learner(to.dataloaders(bs=bs, seed=0), layers=[128, 64], opt_func=opt_func, metrics=RocAucBinary())
    return learn

def fit_checked(learn, n_epoch=2, lr=3e-3):
    try: learn.fit_one_cycle(n_epoch, lr, cbs=CheckNoSync())
    finally: torch.cuda.set_sync_debug_mode('default')
    return learn

@pytest.mark.parametrize('precision', ['fp32', 'bf16'])
@pytest.mark.parametrize('opt_func', [ForeachLamb, Adam])
def test_training_loop_has_no_host_sync(precision, opt_func):
    learn = learner(opt_func=opt_func)
    assert isinstance(learn.recorder, DeviceRecorder)
    if precision == 'bf16': learn.to_bf16()
    fit_checked(learn)  # progress bar on: its loss comes from the non-blocking copies
    assert learn.recorder.values[-1][-1] > 0.6 and len(learn.recorder.losses) == 2*len(learn.dls.train)
    assert learn.recorder.shown_loss is not None and not learn.recorder.losses[-1].is_cuda

def test_fastai_recorder_is_caught_synchronising():
    learn = learner()
    learn.remove_cb(learn.recorder); learn.add_cb(Recorder())
    with pytest.raises(RuntimeError, match='synchroniz'): fit_checked(learn, n_epoch=1)

@pytest.mark.parametrize('precision', ['bf16', 'fp16'])
def test_mixed_precision_with_embedding_bags(precision):
    learn = learner(mh=True)
    getattr(learn, f'to_{precision}')()
    seen = []
    h = learn.model.layers[0][0].register_forward_hook(lambda m, i, o: seen.append(o.dtype))  # the first Linear
    learn.fit_one_cycle(2, 3e-3)
    h.remove()
    assert seen[0] == {'bf16': torch.bfloat16, 'fp16': torch.float16}[precision]
    assert all(p.dtype == torch.float32 for p in learn.model.parameters())
    assert all(t.dtype == torch.float32 for s in learn.opt.state.values() for k, t in s.items() if k in ('grad_avg', 'sqr_avg'))
    assert learn.opt._tables and learn.recorder.values[-1][-1] > 0.6

def test_exclude_embeddings_sets_the_state_of_tables_and_bags_only():
    learn = learner(mh=True)
    learn.fit_large_batch(1, cbs=ExcludeEmbeddings())
    emb = {id(p) for m in learn.model.modules() if isinstance(m, (nn.Embedding, nn.EmbeddingBag)) for p in m.parameters()}
    assert len(emb) == len(learn.dls.cat_names) + len(BENCH_MH)  # with the FillMissing `_na` columns
    for p in learn.model.parameters(): assert learn.opt.state[p].get('layer_adapt', True) == (id(p) not in emb and p.ndim > 1)
    assert learn.recorder.values[-1][-1] > 0.6

def test_lr_find_reads_exact_losses():
    learn = learner()
    sug = learn.lr_find(show_plot=False)
    assert 1e-5 < sug.valley < 1 and all(not l.is_cuda for l in learn.recorder.losses)

def test_device_roc_auc_binary_validates_without_host_sync():
    "Our `RocAucBinary` (from `all`) under `CheckNoSync(valid=True)`, fastai's value; fastai's own is caught synchronising"
    from fastai_gpu_tabular.all import RocAucBinary as DeviceRocAucBinary
    learn = learner(); learn.metrics = DeviceRocAucBinary()
    try: learn.fit(1, 3e-3, cbs=CheckNoSync(valid=True))
    finally: torch.cuda.set_sync_debug_mode('default')
    ours = learn.recorder.values[-1][-1]
    learn.metrics = RocAucBinary()
    assert 0.6 < ours and abs(learn.validate()[1] - ours) < 1e-6
    with pytest.raises(RuntimeError, match='synchroniz'):
        try: learn.fit(1, 3e-3, cbs=CheckNoSync(valid=True))
        finally: torch.cuda.set_sync_debug_mode('default')

def test_lr_find_reads_the_gpu_every_few_batches_and_stops_where_fastai_does():
    "Under `CheckNoSync` our `LRFinder` reads the GPU once in `LR_FIND_CHECK` batches; its points are fastai's (which is caught syncing)"
    from fastai.callback.schedule import LRFinder
    from fastai_gpu_tabular.learner import _fai_lrfinder_after_batch
    def run(after_batch, check=False):
        old = LRFinder.after_batch; LRFinder.after_batch = after_batch
        learn = learner(opt_func=Adam)
        if check: learn.add_cb(CheckNoSync())
        try:
            with learn.no_bar(): sug = learn.lr_find(start_lr=1e-4, end_lr=1e4, num_it=60, show_plot=False)
        finally: LRFinder.after_batch = old; torch.cuda.set_sync_debug_mode('default')
        return sug.valley, [float(o) for o in learn.recorder.losses], learn.recorder.lrs
    ours, fai = run(LRFinder.after_batch, check=True), run(_fai_lrfinder_after_batch)
    n = min(len(ours[2]), len(fai[2]))
    assert len(fai[2]) < 60 and abs(len(ours[2]) - len(fai[2])) <= 1  # diverged; the same batch, or one on (atomics' rounding)
    assert ours[2][:n] == fai[2][:n] and torch.allclose(torch.tensor(ours[1][:n-2]), torch.tensor(fai[1][:n-2]), rtol=1e-2)
    with pytest.raises(RuntimeError, match='synchroniz'): run(_fai_lrfinder_after_batch, check=True)

def test_fgt_train_pads_short_multi_hot_rows_in_memory_and_streamed(tmp_path):
    """On a GPU `fgt-train` pads a multi-hot column of short rows (a few genres a rating) to its longest row, in memory and from a
    processed folder alike: every batch (codes, lengths) of one shape, so `CudaGraph` can replay the whole step"""
    import json
    from itertools import islice
    from fastai_gpu_tabular.train import read_step
    df = synth_movielens(20_000, n_users=500, n_items=200, gpu=False)
    longest = int(df['genres'].str.split('|').map(len).max())
    df.to_parquet(tmp_path/'r.parquet')
    cols = dict(cat_names='userId,movieId', cont_names='days', mh_names='genres', y_names='target')
    dls, to, *_ = read_step(str(tmp_path/'r.parquet'), 0, True, 0, torch.device('cuda'), 1024, 0.2, 0, [], 'category', **cols)
    assert [dl.mh_width for dl in dls.loaders] == ['max', 'max']
    assert {tuple(b[2][0][0].shape) for b in islice(dls.train, 5)} == {(1024, longest)}
    to.to_parquet(tmp_path/'p')
    assert json.loads((tmp_path/'p'/'dataset.json').read_text())['multi_hot']['train']['genres']['longest'] == longest
    dls, *_ = read_step(str(tmp_path/'p'), 0, True, 0, torch.device('cuda'), 1024, None, 0, [], None)
    assert dls.train.mh_width == longest and {tuple(b[2][0][0].shape) for b in islice(dls.train, 5)} == {(1024, longest)}
