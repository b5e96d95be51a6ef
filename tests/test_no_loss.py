"""Issue 81: no code from a checkpoint, no run lost to a typo or a full disk, every target predicted in its own range. One test a
finding (the item's number in its name); each failed before the fix. The full-disk cases write on a small tmpfs (root can mount one;
elsewhere they are skipped, and `replacing`'s own test in 00_backend injects the error)."""
import json, math, os, re, shutil, subprocess
from pathlib import Path
import numpy as np, pandas as pd, pytest, torch
from fastai_gpu_tabular.train import main, predict
from fastai_gpu_tabular.data import main as prep
from fastai_gpu_tabular.learner import save_run, load_run
from test_run_integrity import C, FAST, base_frame, interrupted, base, run  # its fixtures: the base file, a run trained on it

def tree(d):
    "{relative path: bytes} of every file under folder `d`"
    return {str(f.relative_to(d)): f.read_bytes() for f in sorted(Path(d).rglob('*')) if f.is_file()}

@pytest.fixture
def small_disk(tmp_path):
    "A 4 MiB tmpfs, and `fill(leave)`: a file taking all but `leave` bytes of it"
    d = tmp_path/'disk'; d.mkdir()
    if subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=4m', 'tmpfs', str(d)], capture_output=True).returncode:
        pytest.skip('cannot mount a tmpfs here (not root): the injected-error test in 00_backend covers `replacing`')
    def fill(leave:int=8192):
        free = shutil.disk_usage(d).free
        with open(d/'filler', 'wb') as f: f.write(b'\0'*max(free - leave, 0))
    try: yield d, fill
    finally: subprocess.run(['umount', str(d)])

# 1. Security
def test_01_a_checkpoint_never_runs_code(run, base, tmp_path):
    out, planted = tmp_path/'r', tmp_path/'planted'
    interrupted(base, out)
    class Plant:
        def __reduce__(self): return (open, (str(planted), 'w'))  # unpickling it creates the file `planted`
    st = torch.load(out/'checkpoint.pth', weights_only=False)  # our own file, trusted
    torch.save(dict(st, plant=Plant()), out/'checkpoint.pth')
    with pytest.raises(ValueError, match=r'checkpoint.pth: not a checkpoint of tensors and plain data.*could run code'):
        main(data=str(base), out=str(out), resume=True, **dict(C, **dict(FAST, epochs=2)))
    assert not planted.exists()

def test_01_a_checkpoint_holds_only_tensors_and_plain_data(base, tmp_path):
    interrupted(base, tmp_path/'r')
    st = torch.load(tmp_path/'r'/'checkpoint.pth', weights_only=True)  # no allow-list: nothing but tensors and Python's own types
    assert {'opt', 'rng', 'epoch', 'batch', 'weights'} <= set(st) and isinstance(st['opt']['hypers'], list)
    main(data=str(base), out=str(tmp_path/'r'), resume=True, **dict(C, **dict(FAST, epochs=2)))  # and resumes (rng restored)
    assert json.loads((tmp_path/'r'/'metrics.json').read_text())['accuracy'] > 0.6

# 2. `--overwrite` removes the earlier run only once the new one's arguments and data are good
@pytest.mark.parametrize('bad, err', [(dict(data='no_such.parquet'), FileNotFoundError), (dict(metrics='bogus'), ValueError),
                                      (dict(y_names='nope'), ValueError)])
def test_02_overwrite_with_a_typo_keeps_the_earlier_run(run, base, tmp_path, bad, err):
    out = tmp_path/'r'; shutil.copytree(run, out)
    before = tree(out)
    with pytest.raises(err): main(**{**dict(data=str(base), out=str(out), overwrite=True, **C, **FAST), **bad})
    assert tree(out) == before
    main(data=str(base), out=str(out), overwrite=True, **C, **FAST)  # the same without the typo replaces it
    assert (out/'model'/'model.json').exists() and tree(out) != before

# 3, 9. A full disk: the earlier file whole, and the error says so, with the path
def test_03_save_run_on_a_full_disk_keeps_the_earlier_model(run, small_disk):
    d, fill = small_disk
    learn = load_run(run/'model', device='cpu')
    save_run(learn, d/'m')
    before = tree(d/'m')
    fill()
    with pytest.raises(OSError, match=r'no space left on device writing .*m \(the earlier folder is kept\)'): save_run(learn, d/'m')
    assert tree(d/'m') == before and load_run(d/'m', device='cpu') is not None
    assert sorted(o.name for o in d.iterdir()) == ['filler', 'm']  # no temporary left behind

def test_03_predictions_on_a_full_disk_keep_the_earlier_file(run, base, small_disk):
    d, fill = small_disk
    pd.DataFrame({'pred': np.arange(100)}).to_parquet(d/'p.parquet')
    fill()
    with pytest.raises(OSError, match=r'no space left on device writing .*p.parquet \(the earlier file is kept\)'):
        predict(model=str(run), data=str(base), out=str(d/'p.parquet'), cpu=True)
    assert pd.read_parquet(d/'p.parquet')['pred'].tolist() == list(range(100))

def test_09_a_checkpoint_on_a_full_disk_names_the_disk_and_the_file(base, small_disk):
    from fastai_gpu_tabular.distributed import save_checkpoint, load_checkpoint
    d, fill = small_disk
    st = dict(opt=dict(state=[dict(grad_avg=torch.randn(100_000))], hypers=[dict(lr=1e-3)]), epoch=1)
    save_checkpoint(st, d/'checkpoint.pth')
    fill(65_536)
    with pytest.raises(OSError, match=r'no space left on device writing .*checkpoint.pth \(the earlier file is kept\)'):
        save_checkpoint(dict(st, epoch=2), d/'checkpoint.pth')
    assert load_checkpoint(d/'checkpoint.pth')['epoch'] == 1
    with pytest.raises(OSError, match='no space left on device writing'):  # a training run's checkpoint, through `Checkpoint`
        main(data=str(base), out=str(d/'run'), **C, **FAST)

# 4. A run folder owns only its files
@pytest.mark.parametrize('name', ['metrics.json', 'run.json', 'lr.json', 'notes.txt'])
@pytest.mark.parametrize('overwrite', [False, True])
def test_04_a_folder_of_the_users_files_is_not_a_run_folder(base, tmp_path, name, overwrite):
    out = tmp_path/'mine'; out.mkdir(); (out/name).write_text('{"mine": 1}')
    with pytest.raises(FileExistsError, match=rf'holds files that `fgt-train` did not write \({name}\)'):
        main(data=str(base), out=str(out), overwrite=overwrite, **C, **FAST)
    assert tree(out) == {name: b'{"mine": 1}'}

def test_04_overwrite_never_removes_the_users_files_in_model(run, base, tmp_path):
    out = tmp_path/'r'; shutil.copytree(run, out); (out/'model'/'notes.txt').write_text('mine')
    with pytest.raises(FileExistsError, match=r'model/notes.txt'): main(data=str(base), out=str(out), overwrite=True, **C, **FAST)
    assert (out/'model'/'notes.txt').read_text() == 'mine' and (out/'model'/'model.json').exists()

def test_04_save_run_replaces_only_a_run_folder(run, tmp_path):
    learn = load_run(run/'model', device='cpu')
    (tmp_path/'m').mkdir(); (tmp_path/'m'/'notes.txt').write_text('mine')
    with pytest.raises(FileExistsError, match=r'not a run folder \(no model.json\) and holds notes.txt'): save_run(learn, tmp_path/'m')
    assert tree(tmp_path/'m') == {'notes.txt': b'mine'}

# 5
def test_05_predict_refuses_an_out_that_is_a_hard_link_to_data(run, base, tmp_path):
    shutil.copy(base, tmp_path/'in.parquet'); os.link(tmp_path/'in.parquet', tmp_path/'link.parquet')
    with pytest.raises(ValueError, match='is the input `data`'):
        predict(model=str(run), data=str(tmp_path/'in.parquet'), out=str(tmp_path/'link.parquet'), cpu=True)
    assert pd.read_parquet(tmp_path/'in.parquet').equals(pd.read_parquet(base))

# 6, 7. Targets
def test_06_each_regression_target_is_predicted_in_its_own_range(tmp_path, capsys):
    df = base_frame(8_000)
    df['big'] = 1060 + 400*np.tanh(df['x'])  # 650..1470 beside `r` (about -4..4)
    df.to_parquet(tmp_path/'t.parquet')
    main(data=str(tmp_path/'t.parquet'), out=str(tmp_path/'r'), cat_names='u,i', cont_names='x,z', y_names='r,big',
         y_block='regression', **dict(FAST, epochs=2))
    p = predict(model=str(tmp_path/'r'), data=str(tmp_path/'t.parquet'), out=str(tmp_path/'p.parquet'), cpu=True)
    assert p['pred_big'].between(600, 1520).all() and p['pred_big'].std() > 50 and p['pred_r'].between(-6, 6).all()
    m, out = json.loads((tmp_path/'r'/'metrics.json').read_text()), capsys.readouterr().out
    assert re.search(r"baseline \(each target's mean \(r -?0\.\d+, big 10\d\d\)", out), out  # a guess each target
    assert m['baseline']['value'] > 100 and m['_rmse'] < m['baseline']['value']  # the pooled rmse of both, like fastai's `rmse`

def test_07_a_target_near_1e18_reports_a_finite_loss_and_rmse(tmp_path):
    df = base_frame(4_000)
    df['t'] = (10**18 + (df['x']*8.2e17)).astype('int64')
    df.to_parquet(tmp_path/'t.parquet')
    main(data=str(tmp_path/'t.parquet'), out=str(tmp_path/'r'), cat_names='u,i', cont_names='x,z', y_names='t', y_block='regression',
         **FAST)
    m = json.loads((tmp_path/'r'/'metrics.json').read_text())
    assert math.isfinite(m['valid_loss']) and math.isfinite(m['_rmse']) and 1e16 < m['_rmse'] < 1e18

# 8
@pytest.mark.parametrize('dask', [False, True])
def test_08_a_users_na_column_is_not_replaced_by_the_missing_flags(tmp_path, dask):
    df = base_frame(2_000)
    df.loc[::7, 'x'] = np.nan
    df['x_na'] = 1.5
    df.to_parquet(tmp_path/'n.parquet')
    with pytest.raises(ValueError, match=r"continuous column 'x' has missing values, and their flags would replace your column 'x_na'"):
        prep(data=str(tmp_path/'n.parquet'), out=str(tmp_path/'o'), cpu=True, dask=dask, cat_names='u', cont_names='x,x_na', y_names='y')

# 10
@pytest.mark.parametrize('name', ['best.json', 'lr.json', 'run.json'])
def test_10_a_truncated_json_file_of_a_run_is_named(base, tmp_path, name):
    kw = dict(C, **dict(FAST, lr=None, emb_opt='rowwise-adagrad', emb_rule='fixed', epochs=2))  # row-sparse: lr.json, no `lr_find`
    main(data=str(base), out=str(tmp_path/'r'), stop_after=35, **kw)
    fn = tmp_path/'r'/name
    fn.write_text(fn.read_text()[:7])
    with pytest.raises(ValueError, match=rf'{name}: not readable JSON .*cut short'):
        main(data=str(base), out=str(tmp_path/'r'), resume=True, **kw)

# 11
def test_11_predict_ignores_the_target_and_its_nulls(run, base, tmp_path):
    df = pd.read_parquet(base)
    df['y'] = df['y'].astype('float64'); df.loc[::3, 'y'] = np.nan
    df.to_parquet(tmp_path/'n.parquet')
    p = predict(model=str(run), data=str(tmp_path/'n.parquet'), out=str(tmp_path/'p.parquet'), cpu=True)
    q = predict(model=str(run), data=str(base), out=str(tmp_path/'q.parquet'), cpu=True)
    assert len(p) == len(df) and np.allclose(p['prob_1'], q['prob_1'])

# 12, 13, 14: refused before any work, naming the flag
@pytest.mark.parametrize('dask', [False, True])
def test_12_two_classification_targets_are_refused_at_prep(tmp_path, dask):
    df = base_frame(2_000); df['y2'] = 1 - df['y']; df.to_parquet(tmp_path/'t.parquet')
    with pytest.raises(ValueError, match=r"targets 'y', 'y2': a classification .* trains one target column"):
        prep(data=str(tmp_path/'t.parquet'), out=str(tmp_path/'o'), cpu=True, dask=dask, cat_names='u,i', cont_names='x', y_names='y,y2')
    assert not (tmp_path/'o').exists()
    with pytest.raises(ValueError, match=r"targets 'y', 'y2'"):
        main(data=str(tmp_path/'t.parquet'), out=str(tmp_path/'r'), cat_names='u,i', cont_names='x', y_names='y,y2', **FAST)

def test_13_a_continuous_target_as_a_class_names_y_block_regression(base, tmp_path):
    with pytest.raises(ValueError, match=r"target 'r' has labels not seen.*`--y-block regression`"):
        main(data=str(base), out=str(tmp_path/'o'), cat_names='u,i', cont_names='x,z', y_names='r', **FAST)

@pytest.mark.parametrize('kw, match', [(dict(valid_pct=-0.2), r'`valid_pct` must be a share in \[0, 1\), not -0.2'),
    (dict(valid_pct=float('nan')), r'`valid_pct` must be a share in \[0, 1\), not nan'), (dict(valid_pct=1.0), '`valid_pct`'),
    (dict(data='synth', rows=-5), '`rows` must be a positive number of rows, not -5')])
def test_14_argument_ranges_are_checked_before_any_work(base, tmp_path, kw, match):
    with pytest.raises(ValueError, match=match): prep(**{**dict(data=str(base), out=str(tmp_path/'o'), cpu=True, **C), **kw})
    with pytest.raises(ValueError, match=match): main(**{**dict(data=str(base), out=str(tmp_path/'r'), **C, **FAST), **kw})
    assert not (tmp_path/'o').exists() and not (tmp_path/'r').exists()
