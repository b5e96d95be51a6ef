"""The Criteo-shaped generator on the CPU: files written chunk by chunk are the rows it returns in memory, and the CLI
takes it by name, as a folder of parquet files, and as a glob, with or without `--dask`."""
import json
import numpy as np, pandas as pd, pytest
from fastai_gpu_tabular.data import synth_criteo, CRITEO_SCHEMA, main as prep
from fastai_gpu_tabular.train import main as train

def test_files_written_chunk_by_chunk_are_the_rows_in_memory(tmp_path):
    kw = dict(cap=5_000, gpu=False, seed=3, file_rows=7_000)
    mem = synth_criteo(20_000, **kw)
    path = synth_criteo(20_000, path=tmp_path/'raw', row_group_rows=3_000, **kw)
    files = sorted(path.glob('part.*.parquet'))
    assert [len(pd.read_parquet(f)) for f in files] == [7_000, 7_000, 6_000]
    pd.testing.assert_frame_equal(pd.concat([pd.read_parquet(f) for f in files], ignore_index=True), mem)
    assert not mem.equals(synth_criteo(20_000, **{**kw, 'seed': 4}))
    with pytest.raises(FileExistsError, match='holds part files'): synth_criteo(10, path=path, **kw)
    synth_criteo(10, path=path, overwrite=True, **kw)
    assert len(list(path.glob('part.*.parquet'))) == 1

def test_writers_of_a_shard_each_write_the_one_writers_files(tmp_path):
    "Several processes (`rank` of `world_size`) fill one folder with the files one process writes, keeping each other's"
    kw = dict(cap=5_000, gpu=False, seed=3, file_rows=4_000, row_group_rows=1_500)
    one = synth_criteo(15_000, path=tmp_path/'one', **kw)
    for r in (2, 0, 1): synth_criteo(15_000, path=tmp_path/'three', rank=r, world_size=3, **kw)
    files = sorted(f.name for f in one.glob('*.parquet'))
    assert files == sorted(f.name for f in (tmp_path/'three').glob('*.parquet')) and len(files) == 4
    for f in files: pd.testing.assert_frame_equal(pd.read_parquet(one/f), pd.read_parquet(tmp_path/'three'/f))
    with pytest.raises(FileExistsError, match='holds part files'): synth_criteo(15_000, path=tmp_path/'three', rank=1, world_size=3, **kw)
    synth_criteo(15_000, path=tmp_path/'three', rank=1, world_size=3, overwrite=True, **kw)  # its own files only
    assert len(list((tmp_path/'three').glob('*.parquet'))) == 4
    with pytest.raises(ValueError, match='`rank`'): synth_criteo(10, path=tmp_path/'x', rank=2, world_size=2, **kw)

def test_the_cli_reads_it_by_name_as_a_folder_and_as_a_glob(tmp_path):
    names = {k: ','.join(v) if isinstance(v, tuple) else v for k, v in CRITEO_SCHEMA.items()}
    a = prep(data='synth-criteo', rows=6_000, cpu=True, out=str(tmp_path/'a'))
    assert set(a.cat_names) >= set(CRITEO_SCHEMA['cat_names'])
    assert json.loads((tmp_path/'a'/'dataset.json').read_text())['train']['rows'] > 4_000
    raw = synth_criteo(6_000, cap=3_000, gpu=False, path=tmp_path/'raw', file_rows=2_500)
    b = prep(data=str(raw), cpu=True, out=str(tmp_path/'b'), **names)
    c = prep(data=str(raw/'part.*.parquet'), cpu=True, out=str(tmp_path/'c'), **names)
    d = prep(data=str(raw), cpu=True, dask=True, out=str(tmp_path/'d'), **names)
    for o in (c, d): assert o.classes == b.classes
    with pytest.raises(FileNotFoundError, match='no .parquet files'):
        prep(data=str(tmp_path/'raw'/'x*.parquet'), cpu=True, out=str(tmp_path/'e'), **names)
    learn = train(data=str(tmp_path/'b'), epochs=1, bs=512, cpu=True, out=str(tmp_path/'run'), layers='32', emb_dim='8')
    m = json.loads((tmp_path/'run'/'metrics.json').read_text())
    assert 0.5 < m['roc_auc_score'] < 1 and learn.dls.train.n > 4_000
    assert {e.embedding_dim for e in learn.model.embeds} == {8} and len(learn.model.embeds) == 39
    ph = m['phases_s']  # named by what they are: no 'preprocessing' for a processed folder
    assert list(ph) == ['data', 'model', 'lr_find', 'train', 'validation', 'checkpoints', 'fit_other', 'save']
    assert all(v >= 0 for v in ph.values()) and ph['checkpoints'] > 0  # the epoch's save, timed by `Checkpoint`
    assert abs(sum(ph.values()) - m['total_s']) < 1e-6 and m['saved_bytes'] > 0
    with pytest.raises(ValueError, match="`emb_dim`: 'nope' is not a categorical column"):
        train(data=str(tmp_path/'b'), epochs=1, bs=512, cpu=True, out=str(tmp_path/'run2'), emb_dim='nope=4')

def test_streamed_criteo_batches_are_the_resident_ones(tmp_path):
    from fastai.tabular.all import CategoryBlock
    from fastai_gpu_tabular.procs import Categorify, FillMissing, Normalize
    from fastai_gpu_tabular.tabular import TabularGPU, RandomRowSplit
    from fastai_gpu_tabular.loader import BatchDataLoader
    from fastai_gpu_tabular.stream import ParquetDataLoader
    import torch
    to = TabularGPU(synth_criteo(30_000, cap=2_000, gpu=False), procs=[Categorify, FillMissing, Normalize], splits=RandomRowSplit(0.2, 0),
                    y_block=CategoryBlock(), **CRITEO_SCHEMA)
    assert len(to.cat_names) == 39 and len(to.cont_names) == 13  # 26 ids and 13 `_na` flags
    path = to.to_parquet(tmp_path/'cr', row_group_rows=1_700, part_rows=9_000)
    ref, got = BatchDataLoader(to.train, bs=1000), ParquetDataLoader(path, bs=1000, mem_bytes=2_000_000)
    assert len(got.windows()) > 5 and len(ref) == len(got)
    for a, b in zip(ref, got): torch.testing.assert_close(b, a, rtol=0, atol=0)  # batches straddle windows: the same rows, the same layout
