"Importing one module alone gives the same behaviour as importing the package: no import-order effects."
import subprocess, sys

def run(code): return subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True).stdout.split()

def test_tabular_alone_gives_batch_loader():
    out = run("""
import pandas as pd
from fastai_gpu_tabular.tabular import TabularGPU
from fastai_gpu_tabular.procs import Categorify
df = pd.DataFrame({'a': list('xyzx'), 'y': [0, 1, 0, 1]})
dls = TabularGPU(df, procs=[Categorify], cat_names=['a'], y_names='y', splits=[[0, 1], [2, 3]]).dataloaders(bs=2, device='cpu')
print(type(dls.train).__name__, type(dls).__name__, type(dls.valid).__name__)""")
    assert out == ['BatchDataLoader', 'TabularDataLoaders', 'BatchDataLoader']

def test_all_exports_the_user_api_only():
    out = run("import fastai_gpu_tabular.all as m; print(*[n for n in ('main', 'to_pandas', 'shrink', 'value_counts', 'TabularGPU') if n in m.__all__])")
    assert out == ['TabularGPU']
