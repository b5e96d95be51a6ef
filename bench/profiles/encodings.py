"""The processed format's bytes a row under other parquet codecs and encodings (issue 84: a folder half the bytes): one part
file of a processed folder written again by pyarrow each way, its column chunks' bytes summed by kind (codes, continuous).
The bytes only: a codec's decode speed on the GPU is cuDF's, measured on a device by training from a copy of the folder written
that way (`--rewrite`: every part file, the same row groups and statistics; `dataset.json` and `procs/` copied).

    python bench/profiles/encodings.py --data <processed folder> --name encodings_criteo_10m
    python bench/profiles/encodings.py --data <processed folder> --rewrite /tmp/crp_zstd --way 'zstd 1, dictionary'
    python bench/bench_defaults.py --data /tmp/crp_zstd --configs defaults -- --epochs 1   # beside the folder itself"""
import argparse, collections, glob, json, os, sys, tempfile
from pathlib import Path
import numpy as np, pyarrow as pa, pyarrow.parquet as pq
p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument('--data', required=True)
p.add_argument('--name', default=None, help="write the rows to bench/results/NAME.json")
p.add_argument('--rewrite', default=None, help="a new folder: the processed folder with its part files written `--way`")
p.add_argument('--way', default='zstd 1, dictionary', help="one of the ways below, for `--rewrite`")
a = p.parse_args()
sys.path.insert(0, str(Path(__file__).parents[1]))
from common import report

f = sorted(glob.glob(f'{a.data}/train/*.parquet'))[0]
t = pq.read_table(f)
floats = [c for c in t.column_names if pa.types.is_floating(t.schema.field(c).type)]
kind = lambda c: 'conts' if c in floats else 'codes'
rg = pq.ParquetFile(f).metadata.row_group(0).num_rows
WAYS = {'snappy, dictionary (the format)': dict(compression='snappy'), 'zstd 1, dictionary': dict(compression='zstd', compression_level=1),
        'zstd 3, dictionary': dict(compression='zstd', compression_level=3), 'lz4, dictionary': dict(compression='lz4'),
        'zstd 1, no dictionary': dict(compression='zstd', compression_level=1, use_dictionary=False),
        'zstd 1, all BYTE_STREAM_SPLIT': dict(compression='zstd', compression_level=1, use_dictionary=False,
                                              column_encoding={c: 'BYTE_STREAM_SPLIT' for c in t.column_names}),
        'zstd 1, floats BYTE_STREAM_SPLIT': dict(compression='zstd', compression_level=1, use_dictionary=[c for c in t.column_names if c not in floats],
                                                 column_encoding={c: 'BYTE_STREAM_SPLIT' for c in floats})}
def ranked(c):
    "Column `c`'s values as their ranks by count in the file (0 the commonest), in its type (int32 for floats)"
    v = t[c].to_numpy(zero_copy_only=False); u, inv, n = np.unique(v, return_inverse=True, return_counts=True)
    r = np.empty(len(u), np.int64); r[np.argsort(-n, kind='stable')] = np.arange(len(u))
    return pa.array(r[inv].astype(v.dtype if v.dtype.kind in 'iu' else np.int32)), len(u)*v.dtype.itemsize  # and its table's bytes
# a format that stored each column's values by rank (a table a column in the folder, the loader mapping them back on the GPU):
# parquet's dictionary indices are bit-packed at the row group's width, which zstd then finds little in; ranks split into byte
# streams put the common values' zero high bytes in streams of their own
ys = json.loads(Path(f'{a.data}/procs/procs.json').read_text())['names']['y_names']  # the targets stay as they are
RANKED = {'zstd 1, codes ranked by count, BYTE_STREAM_SPLIT': [c for c in t.column_names if kind(c) == 'codes' and c not in ys],
          'zstd 1, every column ranked by count, BYTE_STREAM_SPLIT': [c for c in t.column_names if c not in ys]}
for way, cs in RANKED.items():
    WAYS[way] = dict(compression='zstd', compression_level=1, use_dictionary=[c for c in t.column_names if c not in cs],
                     column_encoding={c: 'BYTE_STREAM_SPLIT' for c in cs})
if a.rewrite and a.way in RANKED: sys.exit(f"--way {a.way!r}: the bytes only (no reader maps ranks back); --rewrite takes another")
if a.rewrite:  # every part file that way, its row groups as they were; the folder's other files copied
    import shutil
    shutil.copytree(a.data, a.rewrite, ignore=lambda d, fs: [f for f in fs if f.endswith('.parquet') and Path(d).name in ('train', 'valid')])
    for src in sorted(glob.glob(f'{a.data}/train/*.parquet') + glob.glob(f'{a.data}/valid/*.parquet')):
        pf = pq.ParquetFile(src)
        pq.write_table(pf.read(), f'{a.rewrite}/{Path(src).parent.name}/{Path(src).name}', row_group_size=pf.metadata.row_group(0).num_rows,
                       **WAYS[a.way])
    print(f'{a.rewrite}: {sum(os.path.getsize(f) for f in glob.glob(f"{a.rewrite}/*/*.parquet"))/1e9:.2f} GB of part files, written {a.way!r}')
    sys.exit()
rows = []
with tempfile.TemporaryDirectory() as d:
    for way, kw in WAYS.items():
        tw, extra = t, collections.Counter()
        for c in RANKED.get(way, []):
            col, extra[kind(c)] = ranked(c); tw = tw.set_column(tw.column_names.index(c), c, col)
        fn = f'{d}/x.parquet'; pq.write_table(tw, fn, row_group_size=rg, **kw)
        md, per = pq.ParquetFile(fn).metadata, collections.Counter()
        for g in range(md.num_row_groups):
            for k in range(md.row_group(g).num_columns): c = md.row_group(g).column(k); per[c.path_in_schema] += c.total_compressed_size
        rows.append(dict(way=way, bytes_a_row=round((os.path.getsize(fn) + sum(extra.values()))/t.num_rows, 2),  # the rank tables too
                         **{k: round((sum(v for c, v in per.items() if kind(c) == k) + extra[k])/t.num_rows, 2) for k in ('codes', 'conts')}))
        print(rows[-1], flush=True)
# the floor of any coder of single values: each column's order-0 entropy (its values' frequencies in the file)
def _entropy(c):
    _, n = np.unique(t[c].to_numpy(zero_copy_only=False), return_counts=True); p = n/n.sum(); return float(-(p*np.log2(p)).sum()/8)
ent = {c: _entropy(c) for c in t.column_names}
rows.append(dict(way='order-0 entropy (a floor, not a codec)', bytes_a_row=round(sum(ent.values()), 2),
                 **{k: round(sum(v for c, v in ent.items() if kind(c) == k), 2) for k in ('codes', 'conts')}))
print(rows[-1], flush=True)
if a.name: report(a.name, rows, ['way', 'bytes_a_row', 'codes', 'conts'], dict(bench='encodings', data=a.data, file=f, rows=t.num_rows))
