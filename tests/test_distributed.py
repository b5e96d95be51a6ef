"""Two processes with the gloo backend on the CPU (the CI check of the multi-GPU path): disjoint shards, equal batch
counts, every validation row counted once with the AUC of a single process, a 2-rank run at batch B/2 ending with the
weights of a 1-process run at batch B, and a run stopped mid-epoch and resumed ending with the weights of a whole run."""
import json, os, re, subprocess, sys
from pathlib import Path
import numpy as np, pytest, torch
from fastai.tabular.all import CategoryBlock, RocAucBinary, ProgressCallback, set_seed, tabular_config, accuracy
from fastai_gpu_tabular.procs import Categorify, FillMissing, Normalize
from fastai_gpu_tabular.tabular import TabularGPU
from fastai_gpu_tabular.learner import tabular_learner
from fastai_gpu_tabular.data import synth_movielens, synth_tabular

ROOT = Path(__file__).parent.parent

def launch(n, *args, timeout=600, accelerate=False):
    "Run `args` (a script or `-m module` and its arguments) in `n` processes with torch's launcher (or `accelerate launch`)"
    env = dict(os.environ, OMP_NUM_THREADS='1', PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get('PYTHONPATH', '')]))
    cmd = ([sys.executable, '-m', 'accelerate.commands.launch', '--num_processes', str(n), '--num_machines', '1', '--mixed_precision', 'no',
            '--dynamo_backend', 'no'] + (['--multi_gpu'] if n > 1 else []) if accelerate else
           [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node', str(n)]) + list(map(str, args))
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    return r.stdout

def train(tmp, name, n, *args, gpu=False):
    "The training entry point on the synthetic data in `n` processes (on the CPU, or `accelerate launch` on GPUs); its output folder"
    out = tmp/name
    launch(n, '-m', 'fastai_gpu_tabular.train', '--data', 'synth', '--rows', 12_000, '--deterministic', '--out', out, *args,
           *([] if gpu else ['--cpu']), accelerate=gpu)
    return out

def weights(out):
    "The saved weights of run folder `out` (or of the .safetensors file `out`)"
    from safetensors.torch import load_file
    return load_file(str(out if out.suffix == '.safetensors' else out/'model'/'model.safetensors'))

def assert_same_weights(a, b, tol=1e-5, rows=0, row_tol=0.):
    """`assert_close` on every weight of runs `a` and `b`, but for at most `rows` rows of a tensor (its first dimension) within
    `row_tol`; a failure names every tensor that differs, with its largest difference"""
    wa, wb = weights(a), weights(b)
    assert list(wa) == list(wb)
    bad = []
    for k in wa:
        x, y = wa[k].float(), wb[k].float()
        if x.shape != y.shape: bad.append(f'{k}: shapes {tuple(x.shape)} and {tuple(y.shape)}'); continue
        d, out = (y - x).abs().nan_to_num(nan=float("inf")), ~torch.isclose(y, x, rtol=tol, atol=tol)
        if rows and x.ndim > 1 and out.any(1).sum() <= rows and d.max() <= row_tol: continue
        if out.any(): bad.append(f'{k}: {int(out.sum())} of {x.numel()} elements beyond {tol:g}, largest difference {d.max():.3g} '
                                 f'at {tuple(int(i) for i in torch.nonzero(d == d.max())[0])}')
    assert not bad, 'weights differ:\n' + '\n'.join(bad)

def test_two_ranks_shard_train_and_gather_validation_exactly(tmp_path):
    launch(2, 'tests/dist_worker.py', tmp_path)
    r0, r1 = [json.loads((tmp_path/f'rank{r}.json').read_text()) for r in (0, 1)]
    assert not set(r0['rows']) & set(r1['rows']) and len(r0['rows']) == len(r1['rows']) == 8 * 500   # 8,006 rows: 8 full batches of 2x500
    assert r0['n_train'] == r1['n_train'] == 8 and r0['n_valid'] == r1['n_valid'] == 3                # 2,001 = 2x1,000 + 1
    assert r0['n_preds'] == r1['n_preds'] == 2001 and r0['preds'] == r1['preds']
    # the same weights in one process: the same predictions, in the same order, and the same metrics
    set_seed(0)
    n = 10_007
    df = synth_movielens(n, n_users=300, n_items=100, gpu=False)
    to = synth_tabular(df)
    learn = tabular_learner(to.dataloaders(bs=500, device='cpu'), layers=[32, 16], metrics=RocAucBinary(),
                            config=tabular_config(use_bn=False, bn_cont=False))
    learn.model.load_state_dict(torch.load(tmp_path/'model.pth', weights_only=True))
    learn.remove_cb(ProgressCallback)
    preds, targs = learn.get_preds()
    assert targs.view(-1).tolist() == r0['targs']
    torch.testing.assert_close(preds[:, 1], torch.tensor(r0['preds']), rtol=1e-5, atol=1e-6)
    loss, auc = learn.validate()
    assert abs(auc - r0['auc']) < 1e-6 and abs(loss - r0['valid_loss']) < 1e-5, (auc, r0['auc'], loss, r0['valid_loss'])

@pytest.mark.parametrize('opt', ['default', 'lamb'])  # LAMB: `ExcludeEmbeddings` leaves tables and 1-D parameters alike on every rank
def test_two_ranks_at_half_batch_match_one_process(tmp_path, opt):
    common = ('--no-bn', '--epochs', 1, '--lr', 1e-2) + (('--opt', opt) if opt != 'default' else ())
    one = train(tmp_path, 'one', 1, '--bs', 600, *common)
    two = train(tmp_path, 'two', 2, '--bs', 300, *common)
    # A ReLU whose input lies within float noise of zero passes the gradient in one run and not the other: on this CPU, LAMB's 6th of
    # 15 steps met one (the batches equal, the weights 7e-9 apart before it, some gradients 1e-4 apart after), and up to 6e-4 of
    # difference spread from it. So with LAMB the first 4 steps must match at 1e-5 and the epoch within a tenth of the learning rate
    # (ranks that step apart, or on other rows, differ by the learning rate from the first step)
    tol = 1e-5 if opt == 'default' else 1e-3
    if opt != 'default':
        cut = [train(tmp_path, f'{k}4', n, '--bs', bs, *common, '--stop-after', 4, '--checkpoint-every', 4)
               for k, n, bs in (('one', 1, 600), ('two', 2, 300))]
        assert_same_weights(*[next(o.glob('checkpoint-*.safetensors')) for o in cut])
    assert_same_weights(one, two, tol=tol)
    m1, m2 = [json.loads((o/'metrics.json').read_text()) for o in (one, two)]
    assert m2['world_size'] == 2 and abs(m1['roc_auc_score'] - m2['roc_auc_score']) < tol

def test_fgt_trains_own_launch_is_torchruns(tmp_path):
    """`fgt-train --num-processes 2` (its entry, `cli.train`, which starts the ranks without importing torch) trains what `torchrun`'s
    2 ranks train; a bad flag fails the launch with the rank named; `--num-processes` other than a launch's processes is refused"""
    common = ('--no-bn', '--epochs', 1, '--lr', 1e-2, '--bs', 300)
    ref = train(tmp_path, 'ref', 2, *common)
    cmd = lambda out, *a: [sys.executable, '-c', 'from fastai_gpu_tabular.cli import train; train()', *map(str, ('--data', 'synth',
                           '--rows', 12_000, '--deterministic', '--cpu', '--out', tmp_path/out, *a))]
    env = {k: v for k, v in os.environ.items() if k != 'PYTHONUNBUFFERED'} | dict(PYTHONPATH=str(ROOT))  # its output buffered, as a user's
    run = lambda *a: subprocess.run(cmd(*a), cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    r = run('own', '--num-processes', 2, *common)
    assert r.returncode == 0, r.stderr[-3000:]
    assert_same_weights(ref, tmp_path/'own', tol=0)
    one = train(tmp_path, 'one', 1, *common)  # one process, `python -m`: what `fgt-train`'s own process trains, and all it prints
    r = run('own1', *common)  # ended at once once saved (`_exit_now`): its output flushed, every file there
    assert r.returncode == 0, r.stderr[-3000:]
    assert_same_weights(one, tmp_path/'own1', tol=0)
    assert 'baseline (the majority class, always)' in r.stdout.splitlines()[-1], r.stdout[-500:]
    assert json.loads((tmp_path/'own1'/'metrics.json').read_text())['world_size'] == 1
    assert json.loads((tmp_path/'own'/'metrics.json').read_text())['world_size'] == 2
    r = run('bad', '--num-processes', 2, '--layers', 'x')
    assert r.returncode != 0 and 'of 2 ended with status' in r.stderr and not (tmp_path/'bad'/'metrics.json').exists()
    from fastai_gpu_tabular.train import check_ranks
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv('WORLD_SIZE', '2')
        with pytest.raises(ValueError, match='`--num-processes 3` in a launch of 2 processes'): check_ranks(3, True)
        check_ranks(1, True); check_ranks(2, True)
        with pytest.raises(ValueError, match='1 or more'): check_ranks(0, True)

def test_two_machines_of_one_process_train_as_two_ranks_of_one(tmp_path):
    """`accelerate launch --num_machines 2 --machine_rank 0|1 --main_process_ip 127.0.0.1`, a process a "machine" (gloo): global ranks
    0 and 1 whose local rank is 0 on both train what two ranks of one machine train; only global rank 0 writes (machine 1's `--out`
    is never made)"""
    from fastai_gpu_tabular.cli import free_port
    common = ('--no-bn', '--epochs', 1, '--lr', 1e-2, '--bs', 300)
    ref, port = train(tmp_path, 'ref', 2, *common), free_port()
    cmd = lambda r: [sys.executable, '-m', 'accelerate.commands.launch', '--multi_gpu', '--num_machines', '2', '--machine_rank', str(r),
                     '--main_process_ip', '127.0.0.1', '--main_process_port', str(port), '--num_processes', '2', '--mixed_precision', 'no',
                     '--dynamo_backend', 'no', '-m', 'fastai_gpu_tabular.train', *map(str, ('--data', 'synth', '--rows', 12_000,
                     '--deterministic', '--cpu', '--out', tmp_path/f'machine{r}', *common))]
    env = dict(os.environ, OMP_NUM_THREADS='1', PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get('PYTHONPATH', '')]))
    ps = [subprocess.Popen(cmd(r), cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    outs = [p.communicate(timeout=600) for p in ps]
    assert all(p.returncode == 0 for p in ps), '\n'.join(o[1][-3000:] for o in outs)
    assert_same_weights(ref, tmp_path/'machine0', tol=0)
    assert json.loads((tmp_path/'machine0'/'metrics.json').read_text())['world_size'] == 2 and not (tmp_path/'machine1').exists()

@pytest.mark.parametrize('emb', [('lazy-adam', 'fixed', '8'), ('adagrad', 'fastai', 'userId=8,movieId=6')])  # one width; three
def test_two_ranks_with_sparse_tables_match_one_process(tmp_path, emb):
    "`--emb-opt`: the tables out of DDP, their touched rows gathered from both ranks by `SparseEmbedOpt` and averaged as DDP does"
    common = ('--no-bn', '--epochs', 1, '--lr', 1e-2, '--emb-opt', emb[0], '--emb-rule', emb[1], '--emb-dim', emb[2])
    one = train(tmp_path, 'one', 1, '--bs', 600, *common)
    two = train(tmp_path, 'two', 2, '--bs', 300, *common)
    assert_same_weights(one, two)
    m1, m2 = [json.loads((o/'metrics.json').read_text()) for o in (one, two)]
    assert m1['sparse_tables'] == m2['sparse_tables'] == [f'embeds.{i}.weight' for i in range(4)]  # users, movies, hour, year_na

@pytest.mark.parametrize('n', [2, 4])
def test_ranks_with_sharded_tables_match_one_process(tmp_path, n):
    """`--shard-tables`: each rank looks up and steps its share of the tables for every rank's rows (all-to-all, no row exchanged):
    n ranks at 1/n of the batch end as one process does (with `exchange='local'`: had a rank looked up its own rows only, its
    tables would have stepped on its own batch alone)"""
    common = ('--no-bn', '--epochs', 1, '--lr', 1e-2, '--emb-opt', 'rowwise-adagrad', '--emb-rule', 'fixed', '--emb-dim', '8')
    one = train(tmp_path, 'one', 1, '--bs', 800, *common)
    many = train(tmp_path, f'n{n}', n, '--bs', 800//n, *common, '--shard-tables')
    assert_same_weights(one, many)
    assert json.loads((many/'run.json').read_text())['shard_tables'] is True
    assert json.loads((many/'metrics.json').read_text())['tables_by_rank'] == [[r*4//n, (r+1)*4//n] for r in range(n)]  # 4 tables

@pytest.mark.parametrize('world', [1, 2])
def test_a_launched_rank_ends_without_the_interpreters_teardown(world):
    """`end_ranks` (what `fgt-train`'s command line runs after its work): on a rank of several, out at once with status 0, no
    teardown (gloo's C++ threads there aborted ranks); on one process, nothing"""
    code = ("import atexit, os; atexit.register(print, 'teardown'); from fastai_gpu_tabular.train import end_ranks; "
            "print('done', flush=True); end_ranks(); print('after')")
    r = subprocess.run([sys.executable, '-c', code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, WORLD_SIZE=str(world), PYTHONPATH=str(ROOT)))
    assert r.returncode == 0 and r.stdout.split() == (['done'] if world > 1 else ['done', 'after', 'teardown']), r.stdout + r.stderr

def test_resumed_sharded_run_ends_like_a_whole_run(tmp_path):
    "`--shard-tables` stopped mid-epoch and resumed: each rank's tables and their optimizer state reach the checkpoint (rank 0's)"
    common = ('--bs', 400, '--epochs', 2, '--checkpoint-every', 5, '--layers', '64,32', '--emb-opt', 'rowwise-adagrad', '--emb-rule',
              'fixed', '--emb-dim', 8, '--shard-tables')
    whole = train(tmp_path, 'whole', 2, *common)
    cut = train(tmp_path, 'cut', 2, *common, '--stop-after', 17)   # stopped after 5 batches of the second epoch
    st = torch.load(cut/'checkpoint.pth', weights_only=False)
    assert (st['epoch'], st['batch']) == (1, 5) and all(s.get('step') for s in st['opt']['state'][:4])  # every table's state
    train(tmp_path, 'cut', 2, *common, '--resume')
    assert_same_weights(whole, cut, tol=1e-6)

def test_four_ranks_with_sparse_tables_match_one_process(tmp_path):
    "Each rank's lookups summed by row, then the rows exchanged: four ranks at a quarter of the batch end as one process does"
    common = ('--no-bn', '--epochs', 1, '--lr', 1e-2, '--emb-opt', 'rowwise-adagrad', '--emb-rule', 'fixed', '--emb-dim', '8')
    one = train(tmp_path, 'one', 1, '--bs', 800, *common)
    four = train(tmp_path, 'four', 4, '--bs', 200, *common)
    assert_same_weights(one, four)

@pytest.mark.parametrize('n', [1, 2])
def test_resumed_run_ends_like_a_whole_run(tmp_path, n):
    # 9,600 rows: 12 batches an epoch
    common = ('--bs', 800 // n, '--epochs', 2, '--checkpoint-every', 5, '--layers', '64,32') + ('--sparse-embeddings',)*(n == 2)
    whole = train(tmp_path, 'whole', n, *common)
    cut = train(tmp_path, 'cut', n, *common, '--stop-after', 17)   # stopped after 5 batches of the second epoch
    assert not (cut/'model').exists() and (cut/'checkpoint.pth').exists()
    st = torch.load(cut/'checkpoint.pth', weights_only=False)
    assert (st['epoch'], st['batch']) == (1, 5)
    train(tmp_path, 'cut', n, *common, '--resume')
    assert_same_weights(whole, cut, tol=1e-6)
    sparse = json.loads((cut/'metrics.json').read_text())['sparse_tables']
    assert sparse == (['embeds.0.weight', 'embeds.1.weight'] if n == 2 else [])  # users and movies row-sparsely across 2 ranks

def check_sparse(out, tol=1e-6):
    "dist_sparse_worker.py's parameters: ours as plain DDP's (bit for bit with the sparse path off), every rank alike"
    tables = json.loads((out/'tables_rank0.json').read_text())
    assert tables == json.loads((out/'tables_rank1.json').read_text())
    # users, movies; hour, year_na, genres
    large, small = ['embeds.0.weight', 'embeds.1.weight'], ['embeds.2.weight', 'embeds.3.weight', 'bags.0.weight']
    assert tables.pop('nosync', large) == large  # GPUs only: trained under `CheckNoSync` with users and movies sparse
    assert {c: large + small if c == 'lamb_all' else [] if c == 'lamb_off' else large for c in tables} == tables
    for case in tables:
        ours, plain = [[torch.load(out/f'{case}_{how}_rank{r}.pt') for r in (0, 1)] for how in ('ours', 'plain')]
        for k in ours[0]:
            assert torch.equal(ours[0][k], ours[1][k]), (case, k)  # the ranks hold the same parameters
            if case == 'lamb_off': assert torch.equal(ours[0][k], plain[0][k]), (case, k)
            else:
                t = 1e-3 if case == 'lamb_bf16' else tol  # bf16 rows added in fp32 here, in bf16 by DDP's hook
                torch.testing.assert_close(ours[0][k], plain[0][k], rtol=t, atol=t*plain[0][k].abs().max().item(),
                                           msg=lambda m: f'{case} {k}: {m}')

def test_sparse_embedding_grads_equal_plain_ddp(tmp_path):
    "LAMB, Adam, 2 batches accumulated, every table sparse, the sparse path off, and bf16 rows, after 5 steps on 2 gloo ranks"
    launch(2, 'tests/dist_sparse_worker.py', tmp_path)
    check_sparse(tmp_path)

def test_ranks_share_rank0s_seed_and_small_shares_follow_one_rule(tmp_path):
    launch(2, 'tests/dist_share_worker.py', tmp_path)
    r0, r1 = [json.loads((tmp_path/f'rank{r}.json').read_text()) for r in (0, 1)]
    assert r0['seed'] == r1['seed']
    for e in (0, 1):  # no seed given: the shards are still disjoint and cover the epoch (drop_last leaves 803 - 8x100 = 3 out)
        a, b = set(r0['orders'][e]), set(r1['orders'][e])
        assert not a & b and len(a | b) == 800
    assert set(r0['orders'][0]) | set(r1['orders'][0]) != set(r0['orders'][1]) | set(r1['orders'][1])  # other rows left out
    assert r0['n_loose'] == r1['n_loose'] == 8 and min(r0['sizes'] + r1['sizes']) >= 2  # shares of 2 and 1: dropped on both
    assert r0['vsizes'] == [50, 50, 1] and r1['vsizes'] == [50, 50, 0]  # every validation row once, an empty share on rank 1
    # validation over the two ranks equals one process's, with no NaN from the empty share
    assert r0['valid'] == r1['valid'] and all(v == v for v in r0['valid'])
    to = synth_tabular(synth_movielens(1_004, n_users=50, n_items=30, gpu=False), splits=(range(803), range(803, 1_004)))
    learn = tabular_learner(to.dataloaders(bs=50, seed=0, device='cpu'), layers=[16], metrics=[accuracy, RocAucBinary()],
                            config=tabular_config(use_bn=False, bn_cont=False))
    learn.model.load_state_dict(torch.load(tmp_path/'model.pth', weights_only=True))
    learn.remove_cb(ProgressCallback)
    np.testing.assert_allclose(r0['valid'], [float(v) for v in learn.validate()], rtol=1e-5)

def test_notebook_launcher_on_two_cpu_processes():
    "The docs' example: `notebook_launcher` forks 2 CPU processes; `distrib_ctx(in_notebook=True)` sets up gloo and DDP"
    env = dict(os.environ, OMP_NUM_THREADS='1', PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get('PYTHONPATH', '')]))
    r = subprocess.run([sys.executable, 'tests/nb_cpu_launch.py'], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    aucs = re.findall(r'rank (\d) of 2: AUC (\d\.\d{4})', r.stdout)  # two processes' lines may interleave on one pipe
    assert sorted(r for r,_ in aucs) == ['0', '1'] and len({a for _,a in aucs}) == 1, r.stdout  # both report the exact, gathered AUC

@pytest.mark.parametrize('placement', ['replicated', 'sharded'])
def test_a_run_resumes_on_another_process_count_from_an_epochs_start(tmp_path, placement):
    """2 processes at bs 400 stopped in their second epoch, resumed from the first epoch's checkpoint at the same rows a step in 1
    process at bs 800 (tables replicated) or in 4 at bs 200 (`--shard-tables`): each ends with the weights of a whole run in 1
    process (n ranks at 1/n of the batch train as 1)"""
    common = ('--no-bn', '--epochs', 2, '--lr', 1e-2, '--layers', '64,32')  # 9,600 rows: 12 steps an epoch
    if placement == 'sharded': common += ('--emb-opt', 'rowwise-adagrad', '--emb-rule', 'fixed', '--emb-dim', '8')
    shard,n = (('--shard-tables',), 4) if placement == 'sharded' else ((), 1)
    whole = train(tmp_path, 'whole', 1, '--bs', 800, *common)
    cut = train(tmp_path, 'cut', 2, '--bs', 400, *common, *shard, '--stop-after', 13)
    st = torch.load(cut/'checkpoint.pth', weights_only=True)
    assert (st['epoch'], st['batch'], st['world_size']) == (1, 0, 2)
    train(tmp_path, 'cut', n, '--bs', 800//n, *common, *shard, '--resume')
    assert_same_weights(whole, cut)
    assert json.loads((cut/'metrics.json').read_text())['world_size'] == n

def test_resuming_on_another_process_count_names_what_stops_it(tmp_path):
    """A run of 2 processes resumed in 1: at other rows a step `run.json`'s check refuses it, naming them; from the middle of an
    epoch (each rank held its share of the epoch's rows) the checkpoint refuses it, naming the batch and the processes"""
    from fastai_gpu_tabular.train import main
    common = ('--bs', 400, '--epochs', 2, '--layers', '64,32', '--checkpoint-every', 5)
    cut = train(tmp_path, 'cut', 2, *common, '--stop-after', 17)
    kw = dict(data='synth', rows=12_000, deterministic=True, out=str(cut), epochs=2, layers='64,32', cpu=True, resume=True,
              checkpoint_every=5)
    with pytest.raises(ValueError, match=r'rows a step of all processes \(`--bs` times the processes\) was 800, now 400'):
        main(bs=400, **kw)
    with pytest.raises(ValueError, match=r'saved at batch 5 of epoch 1 by 2 processes.*resumes there on 2 only'): main(bs=800, **kw)

def check_plain(out, gpu=False):
    """dist_plain_worker.py's ranks: trained without DDP (CUDA graphs replayed on GPUs), the same parameters and BatchNorm buffers on
    both; the tables' rows exchanged whole or touched rows only, the same training"""
    sds = {}
    for ex in ('rows', 'whole'):
        r0, r1 = [json.loads((out/f'plain_{ex}_rank{r}.json').read_text()) for r in (0, 1)]
        assert r0['ddp'] is r1['ddp'] is False and r0['bn'] and r0['valid_loss'] == r1['valid_loss']
        assert (r0['replays'] > 20) == (r1['replays'] > 20) == gpu, (r0['replays'], r1['replays'])  # 25 training batches a rank
        s0, s1 = sds[ex] = [torch.load(out/f'plain_{ex}_rank{r}.pt') for r in (0, 1)]
        for k in s0: assert torch.equal(s0[k], s1[k]), (ex, k)
    if gpu: assert [json.loads((out/f'nosync_rank{r}.json').read_text()) for r in (0, 1)] == [12, 12]  # no host sync a step
    for k,v in sds['rows'][0].items(): torch.testing.assert_close(sds['whole'][0][k], v, rtol=1e-5, atol=1e-6, msg=lambda m: f'{k}: {m}')

def test_ranks_replay_a_captured_step_only_where_every_rank_captured_it(tmp_path):
    "`_ranks_agree`: True on every rank only where each rank's capture succeeded, so that all replay its collectives or none waits"
    launch(2, 'tests/dist_agree_worker.py', tmp_path)
    assert [json.loads((tmp_path/f'agree_rank{r}.json').read_text()) for r in (0, 1)] == [[True, False, False, False]]*2

def test_ranks_with_batches_of_different_sizes_step_the_tables_as_one_process(tmp_path):
    """Rank 0 looks up 60 rows of a table and rank 1 10 others: with each exchange both ranks end with the tables and state that one
    process reaches on both batches' mean loss (the whole exchange once kept only as many rows as this rank's lookups allowed)"""
    launch(2, 'tests/dist_uneven_worker.py', tmp_path)
    r = subprocess.run([sys.executable, 'tests/dist_uneven_worker.py', tmp_path, 'alone'], cwd=ROOT, capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get('PYTHONPATH', '')])), timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    for ex in ('whole', 'rows'):
        one, (s0, s1) = torch.load(tmp_path/f'uneven_{ex}_alone.pt'), [torch.load(tmp_path/f'uneven_{ex}_rank{k}.pt') for k in (0, 1)]
        assert one.keys() == s0.keys() == s1.keys() and 'grad_avg0' in one
        for k in one:
            assert torch.equal(s0[k], s1[k]), (ex, k)
            torch.testing.assert_close(s0[k], one[k], rtol=1e-5, atol=1e-7, msg=lambda m: f'{ex} {k}: {m}')

def test_packed_tables_train_without_ddp_alike_on_every_rank(tmp_path):
    "Packed row-sparse tables: no DDP wrapper; the dense gradients' mean and rank 0's BatchNorm buffers keep the ranks alike"
    launch(2, 'tests/dist_plain_worker.py', tmp_path)
    check_plain(tmp_path)
