"""Run by tests/test_ranking.py under `python -m torch.distributed.run --nproc_per_node 2` (gloo): one epoch inside
`distrib_ctx` with the ranking metrics; each rank writes the validation values (loss, MRR, NDCG@10, recall@20, graded
NDCG@5) to OUT/rank{R}.json, rank 0 its weights. A user's rows fall on both ranks (the validation rows are interleaved)."""
import json, sys
from pathlib import Path
import torch
from accelerate import PartialState
from dist_end import end
from fastai.tabular.all import set_seed, tabular_config, get_model, rank_distrib
from fastai_gpu_tabular.learner import tabular_learner
from test_ranking import ranked_data, METRICS

out = Path(sys.argv[1])
state = PartialState(cpu=True)
set_seed(0)
to = ranked_data()
learn = tabular_learner(to.dataloaders(bs=250, extra_names=['user', 'rating_gain'], device='cpu', seed=0), layers=[16], metrics=METRICS(),
                        config=tabular_config(use_bn=False, bn_cont=False))
with learn.distrib_ctx(sync_bn=False): learn.fit(1, 1e-2)
# not the training loss: each rank's own
(out/f'rank{rank_distrib()}.json').write_text(json.dumps(dict(values=[float(v) for v in learn.recorder.values[-1][1:]])))
if rank_distrib() == 0: torch.save(get_model(learn.model).state_dict(), out/'model.pth')
end(state)  # no interpreter teardown: its C++ threads could abort a rank (dist_end.py)
