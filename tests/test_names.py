"Every name `from fastai_gpu_tabular.all import *` shares with fastai keeps fastai's meaning; the ones we replace are listed and tested"
from types import SimpleNamespace
import warnings, numpy as np, pytest, torch
import fastai.tabular.all as fai
import fastai_gpu_tabular.all as ours

# the names `all` replaces, and the tests that hold each to fastai's results
REPLACED = {'Categorify': 'test_parity.py', 'FillMissing': 'test_parity.py', 'FillStrategy': 'test_parity.py',
            'Normalize': 'test_parity.py', 'tabular_learner': 'test_model.py, test_correctness.py',
            'RocAucBinary': 'test_roc_auc_binary_is_fastais (below)'}

def test_no_name_changes_meaning_silently():
    replaced = {n for n in ours.__all__ if hasattr(fai, n) and getattr(fai, n) is not getattr(ours, n)}
    assert replaced == set(REPLACED)
    assert ours.RocAuc is fai.RocAuc  # the multi-class one stays fastai's
    for n in ('roc_auc', 'GroupAuc', 'RocAucBinary', 'MRR', 'NDCGAt', 'RecallAt', 'load_run', 'save_run'): assert n in ours.__all__, n

def value(metric, batches):
    "`metric`'s value after accumulating `batches` of (predictions, targets), as fastai's `Recorder` does"
    metric.reset()
    for p, t in batches:
        y = torch.as_tensor(t)
        metric.accumulate(SimpleNamespace(pred=torch.as_tensor(p), y=y, yb=(y,), dl=None, extras=None, training=False,
                                          to_detach=fai.to_detach))
    return metric.value

rng = np.random.default_rng(0)
logits = lambda n, k=2: torch.tensor(rng.standard_normal((n, k)).round(1), dtype=torch.float32)  # rounded: many tied scores
CASES = {'ties': lambda: [(logits(500), rng.integers(0, 2, 500)), (logits(300), rng.integers(0, 2, 300))],
         'saturated': lambda: [(logits(400) * 60, rng.integers(0, 2, 400))],  # probabilities equal to 1.0 in float32
         'one_output': lambda: [(logits(200, 1), rng.integers(0, 2, 200))],
         'one_class': lambda: [(logits(100), np.zeros(100, dtype=np.int64))],
         'nan_score': lambda: [(torch.cat([logits(99), torch.full((1, 2), float('nan'))]), rng.integers(0, 2, 100))],
         'three_classes': lambda: [(logits(100), rng.integers(0, 3, 100))]}

@pytest.mark.parametrize('case', list(CASES))
def test_roc_auc_binary_is_fastais(case):
    "Same value to 1e-6 (NaN for NaN), or the same error, and the same warnings, as fastai's `RocAucBinary` (sklearn on the host)"
    batches = CASES[case]()
    res = []
    for m in (fai.RocAucBinary(), ours.RocAucBinary()):
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter('always')
            try: res.append((float(value(m, batches)), [type(o.message) for o in w]))
            except ValueError as e: res.append((str(e), [type(o.message) for o in w]))
    assert ours.RocAucBinary().name == fai.RocAucBinary().name == 'roc_auc_score'
    (a, wa), (b, wb) = res
    assert wa == wb, res
    if isinstance(a, float): assert a == b or abs(a - b) < 1e-6 or (np.isnan(a) and np.isnan(b)), res
    else: assert a == b, res  # the same message
    assert (case in ('one_class', 'nan_score', 'three_classes')) == (not isinstance(a, float) or np.isnan(a)), res

def test_roc_auc_binary_passes_sklearn_options_to_fastais():
    m = ours.RocAucBinary(max_fpr=0.5)
    assert isinstance(m, fai.AccumMetric) and m.kwargs['max_fpr'] == 0.5
    b = CASES['ties']()
    assert abs(value(m, b) - value(fai.RocAucBinary(max_fpr=0.5), b)) < 1e-12
