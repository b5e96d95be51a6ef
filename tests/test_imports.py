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
    names = ('main', 'to_pandas', 'shrink', 'value_counts', 'TabularGPU')
    out = run(f"import fastai_gpu_tabular.all as m; print(*[n for n in {names} if n in m.__all__])")
    assert out == ['TabularGPU']

def test_no_import_cycle_between_modules():
    "The package's modules import each other in one direction, lazy imports inside functions included (a cycle makes order matter)"
    import ast, graphlib, pathlib
    pkg = pathlib.Path(__file__).parents[1]/'fastai_gpu_tabular'
    deps = {}
    for f in pkg.glob('*.py'):
        if f.stem in ('_modidx', 'all', '__init__'): continue
        mods = set()
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module: mods.add(node.module.split('.')[0])
            elif isinstance(node, ast.ImportFrom) and (node.module or '').startswith('fastai_gpu_tabular.'):
                mods.add(node.module.split('.')[1])
            elif isinstance(node, ast.Import):
                mods |= {a.name.split('.')[1] for a in node.names if a.name.startswith('fastai_gpu_tabular.')}
        deps[f.stem] = mods - {f.stem}
    assert deps['loader'] and 'tabular' in deps['tabular_dask']  # the parse found the imports
    graphlib.TopologicalSorter(deps).prepare()  # raises CycleError naming the cycle

def test_graph_capture_backward_imports_no_sympy():
    "`CudaGraph`'s captured backward gives `out.backward(g)`'s gradients without importing sympy (seconds inside the capture batch)"
    out = run("""
import sys, torch
from fastai_gpu_tabular.graph import _backward
lin,x,g,mod = torch.nn.Linear(3, 2),torch.randn(4, 3),torch.randn(4, 2),'torch.fx.experimental.symbolic_shapes'
_backward(lin(x), g); a = lin.weight.grad.clone(); lin.weight.grad = None
print(mod in sys.modules)
lin(x).backward(g); print(torch.equal(a, lin.weight.grad), mod in sys.modules)""")
    assert out == ['False', 'True', 'True']  # the last: autograd's own `backward(g)` imports it, as the capture did
