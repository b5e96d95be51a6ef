"""Run by tests/test_distributed.py under `torch.distributed.run --nproc_per_node 2` (gloo): `CudaGraph`'s agreement on a capture
(`_ranks_agree`), each rank with its own outcome. OUT/agree_rank{R}.json: what each call answered."""
import json, sys
from pathlib import Path
from accelerate import PartialState
from dist_end import end
from fastai.tabular.all import rank_distrib
from fastai_gpu_tabular.graph import _ranks_agree

out, state = Path(sys.argv[1]), PartialState(cpu=True)
r = rank_distrib()
(out/f'agree_rank{r}.json').write_text(json.dumps([_ranks_agree(True), _ranks_agree(r == 0), _ranks_agree(r == 1), _ranks_agree(False)]))
end(state)
