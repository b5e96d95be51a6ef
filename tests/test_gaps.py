"""Issue 85's audit: three bugs planted in the library passed every test. One test each, checked to fail with its bug planted:
`vocab_from_counts`' numeric `max_size` order swapped, `Checkpoint`'s RNG restore dropped, `ExcludeEmbeddings` without bags."""
from pathlib import Path
import numpy as np, pandas as pd, pytest, torch
from hypothesis import given, settings, strategies as st
from fastai.tabular.all import ProgressCallback, tabular_config, set_seed, nn
from fastai_gpu_tabular.procs import vocab_from_counts
from fastai_gpu_tabular.data import synth_movielens, synth_tabular
from fastai_gpu_tabular.learner import tabular_learner
from fastai_gpu_tabular.optimizer import ForeachLamb, ExcludeEmbeddings
from fastai_gpu_tabular.distributed import Checkpoint, StopAfter

@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.integers(-50, 50), st.integers(1, 6), min_size=1, max_size=30), st.integers(1, 3), st.integers(1, 12))
def test_numeric_max_size_keeps_the_most_frequent_ties_by_value(counts, freq, size):
    "The numeric branch (numpy) against a reference in plain Python: kept are the `size` most frequent, ties by the smaller value"
    vc = pd.Series(counts, dtype='int64')
    ref = sorted((v for v, c in counts.items() if c >= freq), key=lambda v: (-counts[v], v))[:size]
    kept, rare = vocab_from_counts(vc, freq, size)
    assert kept == sorted(ref) and rare == sorted(set(counts) - set(ref))

def _fit(out:Path, stop:int=0, resume:bool=False):
    "Two epochs with dropout on the embeddings and the layers, checkpointed each epoch; `stop` after that many batches"
    set_seed(0)
    to = synth_tabular(synth_movielens(3_000, n_users=100, n_items=50, gpu=False))
    learn = tabular_learner(to.dataloaders(bs=256, seed=0, device='cpu'), layers=[16], config=tabular_config(ps=[0.5], embed_p=0.3))
    learn.remove_cb(ProgressCallback)
    ck = out/'checkpoint.pth'
    learn.fit_one_cycle(2, 1e-2, cbs=[Checkpoint(ck, resume=ck if resume else None)] + ([StopAfter(stop)] if stop else []))
    return {k: v.clone() for k, v in learn.model.state_dict().items()}

def test_a_run_with_dropout_resumes_as_the_whole_run(tmp_path):
    "The dropout masks after a resume are the whole run's only if the checkpoint's RNG states come back (`_set_rng`)"
    whole = _fit(tmp_path/'whole')
    _fit(tmp_path/'cut', stop=12)  # in the second epoch: its checkpoint is the first epoch's end
    resumed = _fit(tmp_path/'cut', resume=True)
    for k in whole: torch.testing.assert_close(resumed[k], whole[k], msg=lambda m: f'{k}: {m}')

def test_exclude_embeddings_covers_the_bags_on_the_cpu():
    "A multi-hot column's `nn.EmbeddingBag` is stepped without LAMB's trust ratio, as the tables are"
    set_seed(0)
    to = synth_tabular(synth_movielens(2_000, n_users=50, n_items=20, gpu=False), mh=True)
    learn = tabular_learner(to.dataloaders(bs=256, seed=0, device='cpu'), layers=[8], opt_func=ForeachLamb, cbs=ExcludeEmbeddings())
    learn.remove_cb(ProgressCallback)
    learn.fit(1, 1e-3)
    bags = [m.weight for m in learn.model.modules() if isinstance(m, nn.EmbeddingBag)]
    assert bags and all(learn.opt.state[p]['layer_adapt'] is False for p in bags)
