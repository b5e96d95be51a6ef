"""Issue 82: your own data, the fastai way: one column inference on every reader, a run folder that loads and resumes by its name,
predictions that carry an id. One test a finding (the item's number in its name); each failed before the change."""
import json, re
from pathlib import Path
import numpy as np, pandas as pd, pytest
from fastai_gpu_tabular.train import main, predict
from fastai_gpu_tabular.data import main as prep, synth_criteo
from fastai_gpu_tabular.learner import load_run
from test_run_integrity import C, FAST, base_frame, interrupted, base  # its fixture: the base file

@pytest.fixture(scope='module')
def criteo(tmp_path_factory):
    "A folder of two parquet files of Criteo-shaped rows: 26 integer id columns C1..C26, 13 float columns I1..I13, `label`"
    d = tmp_path_factory.mktemp('c')/'logs'; d.mkdir()
    df = synth_criteo(6_000, gpu=False)
    df.iloc[:3_000].to_parquet(d/'a.parquet'); df.iloc[3_000:].to_parquet(d/'b.parquet')
    return d

def test_01_02_only_the_target_named_gives_the_same_columns_with_and_without_dask(criteo, tmp_path, capsys):
    infos = []
    for dask in (False, True):
        prep(data=str(criteo), y_names='label', out=str(tmp_path/f'p{dask}'), cpu=True, dask=dask)
        infos.append(json.loads((tmp_path/f'p{dask}'/'dataset.json').read_text()))
    a, b = infos
    assert a['columns'] == b['columns'] and a['columns_by_types'] and b['columns_by_types']
    cats, conts = a['columns']['cat_names'], a['columns']['cont_names']
    assert cats[:26] == [f'C{i}' for i in range(1, 27)] and conts == [f'I{i}' for i in range(1, 14)]
    assert all(n.endswith('_na') for n in cats[26:])  # `FillMissing`'s flags
    out = capsys.readouterr().out
    assert out.count('columns by their types: categorical C1,C2') == 2 and '--cat-names' in out

def test_01_a_folder_with_only_the_target_is_refused_naming_the_flags(tmp_path):
    pd.DataFrame({'when': pd.to_datetime(['2020-01-01']*50), 'y': [0, 1]*25}).to_parquet(tmp_path/'t.parquet')
    for dask in (False, True):
        with pytest.raises(ValueError, match=r'no feature column besides the target.*`--cat-names`'):
            prep(data=str(tmp_path/'t.parquet'), y_names='y', out=str(tmp_path/'o'), cpu=True, dask=dask)

def test_02_ids_are_categorical_floats_continuous_times_continuous():
    from fastai_gpu_tabular.data import infer_names
    df = pd.DataFrame({'user': np.arange(100), 'x': np.linspace(0, 1, 100), 'timestamp': np.arange(100)*60, 'flag': [True]*100,
                       'y': [0]*100})
    assert infer_names(df, 'y') == dict(cat_names=['user', 'flag'], cont_names=['x', 'timestamp'], mh_names=[], left_out=[])
    assert infer_names(df, 'y', skip=['user'])['cat_names'] == ['flag']  # `fgt-prep --pass-names`

def test_04_load_run_takes_a_run_folder_as_fgt_predict_does(base, tmp_path):
    main(data=str(base), out=str(tmp_path/'r'), **C, **FAST)
    learn = load_run(tmp_path/'r', device='cpu')
    assert list(learn.dls.train_ds.cat_names) == ['u', 'i']

def test_05_resume_alone_goes_on_with_the_runs_settings(base, tmp_path):
    interrupted(base, tmp_path/'r')  # --layers 16 --emb-dim 4 --bs 512 --lr 1e-2 --opt adam, its own --data and columns
    main(out=str(tmp_path/'r'), resume=True, epochs=2, cpu=True)
    m = json.loads((tmp_path/'r'/'metrics.json').read_text())
    assert m['bs'] == 512 and m['lr'] == 1e-2 and m['accuracy'] > 0.6

def test_05_other_data_on_resume_is_named_in_a_short_line(base, tmp_path):
    interrupted(base, tmp_path/'r')
    base_frame().assign(u=lambda d: d['u'] % 50, i=lambda d: d['i'] % 40).to_parquet(tmp_path/'other.parquet')
    with pytest.raises(ValueError, match=r'vocabulary sizes \(the data\) differ for 2 columns \(u 301 -> 51, i 201 -> 41\)') as e:
        main(data=str(tmp_path/'other.parquet'), out=str(tmp_path/'r'), resume=True, **dict(C, **dict(FAST, epochs=2)))
    assert len(str(e.value)) < 700

def test_08_predict_keeps_the_columns_asked_for(base, tmp_path):
    main(data=str(base), out=str(tmp_path/'r'), **C, **FAST)
    p = predict(model=str(tmp_path/'r'), data=str(base), out=str(tmp_path/'p.parquet'), keep='u,i', cpu=True)
    df = pd.read_parquet(base)
    assert list(p.columns) == ['u', 'i', 'pred', 'prob_0', 'prob_1'] and p['u'].equals(df['u'])
    assert pd.read_parquet(tmp_path/'p.parquet').equals(p)
    with pytest.raises(ValueError, match="`keep`: no column 'id'"):
        predict(model=str(tmp_path/'r'), data=str(base), out=str(tmp_path/'q.parquet'), keep='id', cpu=True)

def cli(cmd, *args):
    "Run `fgt-train`/`fgt-prep`/`fgt-predict` with `args` in a new process: (exit status, stdout, stderr)"
    import subprocess, sys
    entry = dict(train='fastai_gpu_tabular.cli:train', prep='fastai_gpu_tabular.cli:prep', predict='fastai_gpu_tabular.predict:predict_cli')
    mod, fn = entry[cmd].split(':')
    r = subprocess.run([sys.executable, '-c', f'import sys; sys.argv[0] = "fgt-{cmd}"; from {mod} import {fn}; {fn}()', *map(str, args)],
                       capture_output=True, text=True, timeout=300)
    return r.returncode, r.stdout, r.stderr

def test_06_help_is_whole_and_names_the_command():
    rc, out, _ = cli('train', '--help')
    flat = ' '.join(out.split())
    assert rc == 0 and out.startswith('usage: fgt-train')
    assert "'rowwise-adagrad' where the tables are large (`choose_defaults`), else 'dense'" in flat  # the comment's second line
    assert "--last Keep the last epoch's weights (default: the epoch with the lowest validation loss) --mem-bytes" in flat  # no False
    assert cli('predict', '--help')[1].startswith('usage: fgt-predict') and cli('prep', '--help')[1].startswith('usage: fgt-prep')

def test_07_09_the_learning_rate_counts_and_a_stopped_run_are_said(base, tmp_path, capsys):
    main(data=str(base), out=str(tmp_path/'r'), stop_after=5, **dict(C, **dict(FAST, lr=None, emb_opt='rowwise-adagrad', emb_rule='fixed')))
    out = capsys.readouterr().out
    assert "learning rate 0.01 (the row-sparse tables' rule; `--lr` sets one)" in out and '1 process on cpu' in out
    assert 'process(es)' not in out and re.search(r'training rows x 1 epoch\)', out)
    assert re.search(r'stopped after 5 training batches \(`--stop-after`\): [\d,]+ rows/s; .*`--resume --out .*r` goes on', out)

def test_09_a_refusal_is_one_line_and_exit_status_1(base, tmp_path):
    for cmd, args, msg in (('train', ['--data', tmp_path/'nope.parquet', '--out', tmp_path/'r'], "fgt-train: `data`: no file"),
                           ('prep', ['--data', tmp_path/'nope.parquet', '--out', tmp_path/'p'], "fgt-prep: `data`: no file"),
                           ('predict', ['--model', tmp_path/'none', '--data', base], 'fgt-predict: ')):
        rc, _, err = cli(cmd, *args)
        assert rc == 1 and err.strip().startswith(msg) and 'Traceback' not in err and len(err.strip().splitlines()) == 1, err
    (tmp_path/'p').mkdir(); (tmp_path/'p'/'x').write_text('x')
    with pytest.raises(FileExistsError, match=r'pass `overwrite=True` \(`--overwrite`\)'):
        prep(data=str(base), out=str(tmp_path/'p'), cpu=True, **C)

def test_a_run_folder_holds_its_loss_curves(base, tmp_path):
    main(data=str(base), out=str(tmp_path/'r'), **C, **dict(FAST, epochs=2))
    png = (tmp_path/'r'/'loss.png').read_bytes()
    assert png[:8] == b'\x89PNG\r\n\x1a\n' and len(png) > 10_000

def test_03_tabular_learner_chooses_what_fgt_train_chooses(capsys):
    "60k ids (fastai's widths would give 45M parameters) get row-sparse 16-wide tables and their lr; LAMB at 16,384 rows a step"
    from fastai_gpu_tabular.all import TabularGPU, Categorify, Normalize, CategoryBlock, RandomRowSplit, tabular_learner, SparseEmbedOpt
    from fastai_gpu_tabular.learner import SPARSE_LR
    from fastai_gpu_tabular.optimizer import ExcludeEmbeddings
    rng = np.random.default_rng(0)
    df = pd.DataFrame({'user': rng.integers(0, 60_000, 200_000), 'item': rng.integers(0, 500, 200_000), 'x': rng.normal(size=200_000),
                       'y': rng.integers(0, 2, 200_000)})
    to = TabularGPU(df, procs=[Categorify, Normalize], cat_names=['user', 'item'], cont_names=['x'], y_names='y',
                    y_block=CategoryBlock(), splits=RandomRowSplit(0.1))
    learn = tabular_learner(to.dataloaders(bs=16_384, device='cpu'))
    out = capsys.readouterr().out
    assert learn.model.sparse and learn.lr == SPARSE_LR and [e.embedding_dim for e in learn.model.embeds] == [16, 16]
    assert learn.opt_func.func is SparseEmbedOpt and learn.opt_func.keywords['rule'] == 'rowwise-adagrad'
    assert any(isinstance(c, ExcludeEmbeddings) for c in learn.cbs)  # LAMB's, at 16,384 rows a step
    assert "tabular_learner: row-sparse ('rowwise-adagrad') and 16 wide (fastai's widths would give" in out and 'LAMB (16,384 rows' in out
    small = tabular_learner(to.dataloaders(bs=512, device='cpu'), emb_szs={'user': 4, 'item': 4})  # small tables: fastai's flow
    assert not small.model.sparse and small.opt_func is not learn.opt_func and 'tabular_learner' not in capsys.readouterr().out
    from functools import partial
    from fastai_gpu_tabular.optimizer import ForeachLamb
    own = tabular_learner(to.dataloaders(bs=16_384, device='cpu'), emb_szs={'user': 300, 'item': 8}, config=dict(sparse=True),
                          opt_func=partial(SparseEmbedOpt, opt_func=ForeachLamb, rule='lazy-adam'))  # the caller's row-sparse tables kept
    own.create_opt()
    assert type(own.opt.dense) is ForeachLamb and own.opt.rule == 'lazy-adam' and own.model.embeds[0].embedding_dim == 300  # 18M: big

def test_03_a_large_batch_learner_validates_before_any_fit():
    "LAMB's `ExcludeEmbeddings` (chosen at 16,384 rows a step) found no optimizer in `validate` before a fit"
    from fastai_gpu_tabular.all import TabularGPU, Categorify, Normalize, CategoryBlock, RandomRowSplit, tabular_learner
    rng = np.random.default_rng(0)
    df = pd.DataFrame({'user': rng.integers(0, 600, 40_000), 'x': rng.normal(size=40_000), 'y': rng.integers(0, 2, 40_000)})
    to = TabularGPU(df, procs=[Categorify, Normalize], cat_names=['user'], cont_names=['x'], y_names='y', y_block=CategoryBlock(),
                    splits=RandomRowSplit(0.5))
    learn = tabular_learner(to.dataloaders(bs=16_384, device='cpu'), layers=[8])
    assert np.isfinite(float(learn.validate()[0]))
