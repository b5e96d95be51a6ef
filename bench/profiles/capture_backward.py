"""`fgt-train` with `CudaGraph`'s captured backward as it is (`new`) or as it was before 40c33e6 (`old`: `out.backward(g)`, whose
shape check imports sympy inside the capture): the same-run baseline of `cuda_graph_capture_s` and the training phase (issue 54,
session 31). The arguments after the first are fgt-train's.

    CUDA_VISIBLE_DEVICES=0 python bench/profiles/capture_backward.py old --data <processed folder> --epochs 1 --bs 65536 --overwrite --out /tmp/o_old
    CUDA_VISIBLE_DEVICES=0 python bench/profiles/capture_backward.py new --data <processed folder> --epochs 1 --bs 65536 --overwrite --out /tmp/o_new

metrics.json in each `--out` holds `cuda_graph_capture_s` and `phases_s`."""
import sys
import fastai_gpu_tabular.graph as G
if sys.argv[1] not in ('old', 'new'): sys.exit(__doc__)
if sys.argv[1] == 'old': G._backward = lambda out, g: out.backward(g)
from fastcore.script import anno_parser
from fastai_gpu_tabular.train import main
args = anno_parser(main).parse_args(sys.argv[2:]).__dict__
main(**{k: v for k, v in args.items() if k not in ('pdb', 'xtra')})
