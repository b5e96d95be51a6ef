"""Two GPUs with NCCL under `accelerate launch --num_processes 2` (`pytest -m gpu2`): the CPU checks of
test_distributed.py again, with SyncBatchNorm for the half-batch equivalence and bf16 for resuming."""
import json, os, subprocess, sys
import pytest, torch
from test_distributed import launch, train, assert_same_weights, check_sparse, check_plain, ROOT

pytestmark = pytest.mark.gpu2

def test_two_gpus_shard_train_and_gather_validation_exactly(tmp_path):
    launch(2, 'tests/dist_worker.py', tmp_path, 'gpu', accelerate=True)
    r0, r1 = [json.loads((tmp_path/f'rank{r}.json').read_text()) for r in (0, 1)]
    assert not set(r0['rows']) & set(r1['rows']) and len(r0['rows']) == len(r1['rows']) == 8 * 500
    assert r0['n_train'] == r1['n_train'] == 8 and r0['n_valid'] == r1['n_valid'] == 3
    assert r0['n_preds'] == r1['n_preds'] == 2001 and r0['preds'] == r1['preds']

def test_sparse_embedding_grads_equal_plain_ddp_over_nccl(tmp_path):
    "dist_sparse_worker.py on two GPUs: the cases of the gloo test plus bf16 rows, then a fit under `CheckNoSync` (one allowed sync a step)"
    launch(2, 'tests/dist_sparse_worker.py', tmp_path, 'gpu', accelerate=True)
    assert 'lamb_bf16' in json.loads((tmp_path/'tables_rank0.json').read_text())
    check_sparse(tmp_path, tol=1e-5)

@pytest.mark.parametrize('bn', ['sync', 'none'])
def test_two_gpus_at_half_batch_match_one(tmp_path, bn):
    # LAMB, as when this test was written (fgt-train picks Adam at 600 rows a step since issue 19)
    common = ('--epochs', 1, '--lr', 1e-2, '--opt', 'lamb') + (('--sync-bn',) if bn == 'sync' else ('--no-bn',))
    one = train(tmp_path, 'one', 1, '--bs', 600, *common, gpu=True)
    two = train(tmp_path, 'two', 2, '--bs', 300, *common, gpu=True)
    # SyncBatchNorm sums the batch's moments in another order: on 2 H200s one row of each of two tables (rows whose gradient
    # nearly cancels, magnified by the normalised step) ended 2.3e-4 and 2.8e-4 from one GPU's, every other weight within 2e-5
    assert_same_weights(one, two, tol=2e-5, **(dict(rows=1, row_tol=1e-3) if bn == 'sync' else {}))
    m1, m2 = [json.loads((o/'metrics.json').read_text()) for o in (one, two)]
    assert m2['world_size'] == 2 and m2['device'].startswith('cuda') and abs(m1['roc_auc_score'] - m2['roc_auc_score']) < 1e-4

@pytest.mark.parametrize('precision', ['fp32', 'fp16'])
def test_two_gpus_resumed_run_ends_like_a_whole_run(tmp_path, precision):
    common = ('--bs', 400, '--epochs', 2, '--checkpoint-every', 5, '--layers', '64,32', '--precision', precision, '--sparse-embeddings')
    whole = train(tmp_path, 'whole', 2, *common, gpu=True)
    cut = train(tmp_path, 'cut', 2, *common, '--stop-after', 17, gpu=True)
    st = torch.load(cut/'checkpoint.pth', weights_only=False)
    assert (st['epoch'], st['batch']) == (1, 5) and ('scaler' in st) == (precision == 'fp16')
    train(tmp_path, 'cut', 2, *common, '--resume', gpu=True)
    assert_same_weights(whole, cut, tol=1e-6)
    assert json.loads((cut/'metrics.json').read_text())['sparse_tables'] == ['embeds.0.weight', 'embeds.1.weight']

def test_notebook_launcher_trains_on_both_gpus(tmp_path):
    import subprocess, sys, os
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get('PYTHONPATH', '')]))
    r = subprocess.run([sys.executable, 'tests/nb_launch.py', str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    r0, r1 = [json.loads((tmp_path/f'rank{r}.json').read_text()) for r in (0, 1)]
    assert (r0['device'], r1['device']) == ('cuda:0', 'cuda:1') and (r0['loader_device'], r1['loader_device']) == ('cuda:0', 'cuda:1')
    assert not set(r0['rows']) & set(r1['rows']) and len(r0['rows']) == len(r1['rows']) == 8 * 500
    assert r0['n_preds'] == r1['n_preds'] == 2001 and r0['auc'] == r1['auc'] > 0.55

def test_two_gpus_train_packed_tables_without_ddp_in_cuda_graphs(tmp_path):
    "dist_plain_worker.py over NCCL: row-sparse packed tables, no DDP, each rank replays CUDA graphs; the ranks stay alike"
    launch(2, 'tests/dist_plain_worker.py', tmp_path, 'gpu', accelerate=True)
    check_plain(tmp_path, gpu=True)

def test_two_gpus_replay_the_whole_step_with_its_collectives_in_the_graph(tmp_path):
    """`CudaGraph(ranks=True)` on two GPUs: the whole step replayed, the dense mean's all-reduce and the tables' exchange (whole rows,
    or `ShardTables`' all-to-alls) captured in it; the weights of the forward and backward's graphs with the rest eager, and no host
    sync in a step after the capture"""
    launch(2, 'tests/dist_ranks_graph_worker.py', tmp_path, accelerate=True)
    for ex in ('whole', 'local'):
        for r in (0, 1):
            m = json.loads((tmp_path/f'ranks_{ex}_rank{r}.json').read_text())
            assert m['whole'] == [True, False] and m['why'][0] is None, (ex, r, m)
            assert min(m['replays']) >= 20, (ex, r, m)  # 25 training batches a rank, 2 before the capture
            assert m['max_diff'] <= 1e-6, (ex, r, m)
    assert [json.loads((tmp_path/f'ranks_nosync_rank{r}.json').read_text()) for r in (0, 1)] == [dict(iters=12, whole=True)]*2

def test_two_gpus_with_row_sparse_tables_and_graphs_match_one(tmp_path):
    "`fgt-train --emb-opt ... --cuda-graph` on Criteo-shaped rows: two GPUs at half the batch end with one GPU's weights, graphs replayed"
    def run(name, n, bs):
        launch(n, '-m', 'fastai_gpu_tabular.train', '--data', 'synth-criteo', '--rows', 40_000, '--deterministic', '--out', tmp_path/name,
               '--bs', bs, '--epochs', 1, '--lr', 1e-2, '--no-bn', '--emb-opt', 'rowwise-adagrad', '--emb-rule', 'fixed', '--emb-dim', 8,
               '--cuda-graph', accelerate=True)
        return tmp_path/name
    one, two = run('one', 1, 1000), run('two', 2, 500)
    assert_same_weights(one, two, tol=2e-5)
    m = json.loads((two/'metrics.json').read_text())
    assert m['world_size'] == 2 and m['cuda_graph'] and m['cuda_graph_replays'] >= 28, m  # 32 batches, 2 before the capture

def test_two_gpus_with_sharded_tables_and_graphs_match_one(tmp_path):
    """`fgt-train --shard-tables --cuda-graph` on Criteo-shaped rows: each GPU looks up and steps half the tables for both GPUs' rows
    (NCCL all-to-alls inside the graphs); two GPUs at half the batch end with one GPU's weights"""
    def run(name, n, bs, *extra):
        launch(n, '-m', 'fastai_gpu_tabular.train', '--data', 'synth-criteo', '--rows', 40_000, '--deterministic', '--out', tmp_path/name,
               '--bs', bs, '--epochs', 1, '--lr', 1e-2, '--no-bn', '--emb-opt', 'rowwise-adagrad', '--emb-rule', 'fixed', '--emb-dim', 8,
               '--cuda-graph', *extra, accelerate=True)
        return tmp_path/name
    one, two = run('one', 1, 1000), run('two', 2, 500, '--shard-tables')
    assert_same_weights(one, two, tol=2e-5)
    m = json.loads((two/'metrics.json').read_text())
    assert m['world_size'] == 2 and m['cuda_graph'] and m['cuda_graph_replays'] >= 28, m
    assert json.loads((two/'run.json').read_text())['shard_tables'] is True

def test_fgt_trains_own_launch_on_two_gpus_is_accelerates(tmp_path):
    "`fgt-train --num-processes 2` (ranks started by `launch_ranks`, NCCL from torchrun's environment) trains what `accelerate launch` does"
    args = ('--data', 'synth-criteo', '--rows', 40_000, '--deterministic', '--bs', 500, '--epochs', 1, '--lr', 1e-2, '--no-bn', '--emb-opt',
            'rowwise-adagrad', '--emb-rule', 'fixed', '--emb-dim', 8, '--cuda-graph', '--shard-tables')
    launch(2, '-m', 'fastai_gpu_tabular.train', '--out', tmp_path/'acc', *args, accelerate=True)
    r = subprocess.run([sys.executable, '-c', 'from fastai_gpu_tabular.cli import train; train()', '--num-processes', '2',
                        '--out', str(tmp_path/'own'), *map(str, args)], cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert_same_weights(tmp_path/'acc', tmp_path/'own', tol=1e-6)
    m = json.loads((tmp_path/'own'/'metrics.json').read_text())
    assert m['world_size'] == 2 and m['device'].startswith('cuda') and m['cuda_graph'], m
