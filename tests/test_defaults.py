"""Issue 56: `fgt-train` chooses from the data and the device what used to need flags (row-sparse 16-wide tables where fastai's widths
would put most parameters in large tables, bf16 and CUDA graphs where they pay), says so, records it, and every choice has a flag that
overrides it; a processed folder reports its constant baseline; `tabular_learner(emb_opt=...)` is the explicit form in one keyword."""
import json, warnings
from functools import partial
from pathlib import Path
from types import SimpleNamespace
import numpy as np, pandas as pd, pytest, torch
from fastai.tabular.all import Adam, set_seed, tabular_config
from fastai_gpu_tabular.all import (CRITEO_CARDS, Categorify, CategoryBlock, FillMissing, Normalize, RandomRowSplit, SparseEmbedOpt,
                                    TabularGPU, movielens_sample, movielens_tabular, tabular_learner, RegressionBlock, TabularDataLoaders)
from fastai_gpu_tabular.train import main, choose_defaults, table_params, SPARSE_LR
from fastai_gpu_tabular.data import main as prep

def fake_to(cards, n_cont=13):
    "What `choose_defaults` reads of a `TabularGPU`: categorical columns and their vocabularies' sizes, continuous columns"
    names = [f'C{i}' for i in range(len(cards))]
    return SimpleNamespace(cat_names=names, classes={n: range(c + 1) for n, c in zip(names, cards)},
                           cont_names=[f'I{i}' for i in range(n_cont)])

CHOOSE = dict(device='cpu', world=1, bs=65_536, rows=100_000_000, epochs=1, n_out=2, layers='512,256', emb_dim=None, fastai_model=False,
              emb_opt='auto', emb_rule='auto', precision='auto', cuda_graph='auto')

def test_a_click_log_gets_row_sparse_16_wide_tables_and_movielens_keeps_fastais():
    cards = [min(c, 300_000) for c in CRITEO_CARDS]  # about what `--freq-threshold 15` leaves of 100M rows
    got = choose_defaults(fake_to(cards), **CHOOSE)
    assert got['emb_opt'][0] == 'rowwise-adagrad' and got['emb_rule'][0] == 'fixed' and '% in the tables' in got['emb_opt'][1]
    assert got['precision'][0] == 'fp32' and got['cuda_graph'][0] is False  # on the CPU
    emb, total = table_params(fake_to(cards), {}, [512, 256], 2)
    assert 1e9 < total < 2e9 and emb / total > 0.99  # as the 1.21B parameters a user got with no flag
    ml = movielens_tabular(movielens_sample(gpu=False))  # the default run's data: 2.5M parameters, dense tables as before
    got = choose_defaults(ml, **dict(CHOOSE, bs=64, rows=80_000))
    assert got['emb_opt'][0] == 'dense' and got['emb_rule'][0] == 'fastai'
    assert choose_defaults(fake_to(CRITEO_CARDS), **dict(CHOOSE, fastai_model=True))['emb_opt'][0] == 'dense'  # its tables are fastai's

def test_explicit_settings_are_not_chosen():
    got = choose_defaults(fake_to(CRITEO_CARDS), **dict(CHOOSE, emb_opt='dense', emb_rule='fastai', precision='fp32', cuda_graph=False))
    assert got == {}

def clicks(n=20_000, seed=0):
    "Six columns of ~n ids each (fastai's widths: 19M parameters in the tables), a count, and a label tied to one id column and the count"
    rng = np.random.default_rng(seed)
    ids = {k: rng.integers(0, n, n) for k in 'uvwstq'}
    x = rng.normal(size=n)
    return pd.DataFrame({**ids, 'x': x, 'y': ((x + (ids['u'] % 3 == 0)) > 0.7).astype('int64')})

COLS = dict(cat_names='u,v,w,s,t,q', cont_names='x', y_names='y')

def test_fgt_train_on_a_click_log_with_no_flags_uses_and_records_the_defaults(tmp_path, capsys):
    clicks().to_parquet(tmp_path/'c.parquet')
    learn = main(data=str(tmp_path/'c.parquet'), out=str(tmp_path/'r'), cpu=True, epochs=1, bs=1024, **COLS)
    m = json.loads((tmp_path/'r'/'metrics.json').read_text())
    assert m['defaults'] == dict(emb_opt='rowwise-adagrad', emb_rule='fixed', precision='fp32', cuda_graph=False)
    assert m['emb_opt'] == 'rowwise-adagrad' and m['lr'] == SPARSE_LR and learn.model.sparse
    assert {e.weight.shape[1] for e in learn.model.embeds} == {16}
    out = capsys.readouterr().out
    assert 'defaults: tables row-sparse (rowwise-adagrad) and 16 wide' in out and 'override with --emb-opt' in out
    assert json.loads((tmp_path/'r'/'lr.json').read_text())['how'] == "the row-sparse tables' rule"
    assert json.loads((tmp_path/'r'/'run.json').read_text())['emb_opt'] == 'rowwise-adagrad'  # what resume compares
    assert 'epoch 1 of 1: the lowest validation loss' in out

def test_the_override_flags_win(tmp_path):
    clicks().to_parquet(tmp_path/'c.parquet')
    learn = main(data=str(tmp_path/'c.parquet'), out=str(tmp_path/'r'), cpu=True, epochs=1, bs=1024, emb_opt='dense', emb_rule='fastai',
                 precision='fp32', no_cuda_graph=True, lr=1e-3, **COLS)
    m = json.loads((tmp_path/'r'/'metrics.json').read_text())
    assert m['defaults'] == {} and m['emb_opt'] == 'dense' and not getattr(learn.model, 'sparse', False)
    assert max(e.weight.shape[1] for e in learn.model.embeds) > 16
    with pytest.raises(ValueError, match='pass one of them'):
        main(data=str(tmp_path/'c.parquet'), out=str(tmp_path/'q'), cpu=True, cuda_graph=True, no_cuda_graph=True, **COLS)

def test_a_processed_folder_reports_its_baseline(tmp_path, capsys):
    clicks().to_parquet(tmp_path/'c.parquet')
    prep(data=str(tmp_path/'c.parquet'), out=str(tmp_path/'p'), cpu=True, **COLS)
    main(data=str(tmp_path/'p'), out=str(tmp_path/'r'), cpu=True, epochs=1, bs=1024, lr=1e-2)
    m = json.loads((tmp_path/'r'/'metrics.json').read_text())
    y = clicks()['y']  # the folder's validation rows are those of `RandomRowSplit(0.2, 42)`, as in memory
    tr, va = RandomRowSplit(0.2, 42)(clicks())
    want = float((y.iloc[np.asarray(va)] == y.iloc[np.asarray(tr)].mode()[0]).mean())
    assert m['baseline'] == dict(metric='accuracy', value=pytest.approx(want), guess='the majority class')
    assert 'baseline (the majority class, always): accuracy' in capsys.readouterr().out

@pytest.mark.parametrize('block', ['category', 'regression'])
def test_a_processed_folders_baseline_is_its_rows_baseline(tmp_path, block):
    "The baseline read from a folder of many part files (its target column streamed) is the one of the rows in memory"
    from fastai_gpu_tabular.train import baseline
    df = clicks(20_000).assign(r=lambda d: np.random.RandomState(1).randn(len(d)).astype('float32'))
    y, yb = ('y', CategoryBlock()) if block == 'category' else ('r', RegressionBlock())
    to = TabularGPU(df, procs=[Categorify, FillMissing, Normalize], cat_names=['u', 'v', 'w'], cont_names=['x'], y_names=y,
                    y_block=yb, splits=RandomRowSplit(0.2, 0))
    path = to.to_parquet(tmp_path/'p', part_rows=1_500, row_group_rows=500)
    assert len(list((path/'train').iterdir())) == 11
    got, want = baseline(TabularDataLoaders.from_processed(path, bs=512, device='cpu').train_ds, block, path), baseline(to, block)
    assert got['metric'] == want['metric'] == ('accuracy' if block == 'category' else '_rmse')
    assert got['value'] == pytest.approx(want['value'], rel=1e-6) and 0 < got['value'] < 1.5

def test_emb_opt_keyword_equals_the_explicit_form():
    df = clicks(3_000)
    to = TabularGPU(df, procs=[Categorify, FillMissing, Normalize], cat_names=['u', 'v', 'w'], cont_names=['x'], y_names='y',
                    y_block=CategoryBlock(), splits=RandomRowSplit(0.2, 0))
    def fit(**kw):
        set_seed(0)
        learn = tabular_learner(to.dataloaders(bs=256, seed=0, device='cpu'), layers=[32], emb_szs={n: 8 for n in 'uvw'}, **kw)
        with learn.no_bar(), learn.no_logging(): learn.fit_one_cycle(1, 1e-2)
        return learn
    a = fit(emb_opt='rowwise-adagrad')
    b = fit(config=dict(tabular_config(), sparse=True), opt_func=partial(SparseEmbedOpt, opt_func=Adam, rule='rowwise-adagrad'))
    for (k, v), w in zip(a.model.state_dict().items(), b.model.state_dict().values()): assert torch.equal(v, w), k
    assert a.model.sparse and a.model_args['config']['sparse']
    with pytest.raises(ValueError, match="`emb_opt` must be None, 'dense' or one of"): tabular_learner(a.dls, emb_opt='sgd')

def test_the_readme_click_log_flow(tmp_path, capsys):
    "The README's Python click-log flow, as written there (no knob), on a small processed folder on the CPU: fgt-train's choices"
    from fastai.tabular.data import TabularDataLoaders
    from fastai_gpu_tabular.all import RocAucBinary, accuracy
    from fastai_gpu_tabular.learner import SPARSE_LR, big_tables
    prep(data='synth-criteo', rows=20_000, out=str(tmp_path/'crp'), cpu=True)
    dls = TabularDataLoaders.from_processed(tmp_path/'crp', bs=2048, device='cpu')
    learn = tabular_learner(dls, metrics=[accuracy, RocAucBinary()])
    with learn.no_bar(): learn.fit_one_cycle(1)
    big = big_tables(dls.train_ds, {}, [200, 100], 2)[0]  # fgt-train's rule (20,000 rows: small tables; 60k ids: test_own_data)
    assert learn.model.sparse == big and (learn.lr == SPARSE_LR) == big and learn.recorder.values[-1][-1] > 0.55  # AUC
    assert ("tabular_learner: row-sparse ('rowwise-adagrad') and 16 wide" in capsys.readouterr().out) == big
    readme = (Path(__file__).parents[1]/'README.md').read_text()  # the flow above is the README's, line for line
    for line in ("learn = tabular_learner(dls, metrics=[accuracy, RocAucBinary()])", "learn.fit_one_cycle(1)"):
        assert line in readme, line
