"""Issue 55: a run stopped mid-epoch and resumed (`fgt-train --resume`) reads the next epoch's first batches as a fresh loader of
the same folder, seed and rank reads them: the check at a billion rows that the tests make on thousands. Two launches, each a
process a GPU (`accelerate launch ...`, or plain `python` for one), the `fgt-train` arguments after `--`:

    A="--data /tmp/billion/processed --epochs 2 --checkpoint-every 300 --out /tmp/rr"
    accelerate launch --multi_gpu --num_processes 4 tests/resume_check.py --stage cut -- $A
    accelerate launch --multi_gpu --num_processes 4 tests/resume_check.py --stage resume --batches 5 -- $A

`cut` trains `--checkpoint-every` batches and stops (a checkpoint mid-epoch 1). `resume` goes on from it through the rest of
epoch 1 into epoch 2, fingerprints (each tensor's sum, on the host) the first `--batches` training batches of epoch 2, stops,
then reads the same batches from `dls.train.new()` set to epoch 2 and compares; each rank writes `resume_check_rank<r>.json`
in `--out` and prints whether they are equal."""
import argparse, json, os, sys, time
p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument('--stage', choices=('cut', 'resume'), required=True)
p.add_argument('--batches', type=int, default=5, help="resume: the second epoch's first batches compared")
a, rest = p.parse_known_args()
import torch
from fastai.learner import Learner
from fastcore.script import anno_parser
from fastai_gpu_tabular.distributed import StopAfter
from fastai_gpu_tabular.train import main

def tensors(x) -> list: return [t for y in x for t in tensors(y)] if isinstance(x, (tuple, list)) else [x] if torch.is_tensor(x) else []
def fingerprint(b) -> list:
    "Each tensor of batch `b` summed in float64 on the host, and its shape"
    return [[float(t.double().sum()), list(t.shape)] for t in tensors(b)]

args = anno_parser(main).parse_args([r for r in rest if r != '--']).__dict__
args = {k: v for k, v in args.items() if k not in ('pdb', 'xtra')}
ce = args.get('checkpoint_every') or 0
if a.stage == 'cut':
    if not ce: sys.exit('--stage cut needs --checkpoint-every N: the checkpoint the run stops after')
    t = time.perf_counter(); main(**dict(args, stop_after=ce, overwrite=True))
    print(f"cut: {ce} batches trained and checkpointed in {time.perf_counter()-t:.1f} s", flush=True); sys.exit()

seen, state = [], {}
one = Learner._do_one_batch
def recorded(self):  # the training batches of the second epoch (epoch 1 counted from 0), as the model gets them
    if self.training and self.epoch == 1 and len(seen) < a.batches:
        seen.append(fingerprint((*self.xb, *self.yb))); state['dl'] = self.dl
        if len(seen) == a.batches:  # stop after this batch, as `--stop-after` would
            for cb in self.cbs:
                if isinstance(cb, StopAfter): cb.n = self.train_iter + 1
    return one(self)
Learner._do_one_batch = recorded
t = time.perf_counter(); main(**dict(args, resume=True, stop_after=10**12))
secs = time.perf_counter() - t
rank = int(os.environ.get('RANK', 0))
if len(seen) < a.batches: sys.exit(f'rank {rank}: the resumed run ended with {len(seen)} batches of epoch 2, not {a.batches}')
fresh = state['dl'].new(); fresh.seed, fresh.epoch, fresh.skip = state['dl'].seed, 1, 0
want = []
for b in fresh:
    want.append(fingerprint(b))
    if len(want) == a.batches: break
same = want == seen
res = dict(rank=rank, same=same, batches=a.batches, resumed_s=round(secs, 1), seen=seen, fresh=want)
out = args.get('out') or 'fgt_run'
os.makedirs(out, exist_ok=True)
with open(f'{out}/resume_check_rank{rank}.json', 'w') as f: json.dump(res, f)
print(f"rank {rank}: the resumed run's first {a.batches} batches of epoch 2 are a fresh loader's: {same} (resumed fit {secs:.1f} s)",
      flush=True)
sys.exit(0 if same else 1)
