"""Fail when a line of the library or the tests is longer than 140 characters (the generated `_modidx.py` is exempt).

    python tools/check_lines.py"""
import sys
from pathlib import Path

LIMIT, root = 140, Path(__file__).parents[1]
files = [f for d in ('fastai_gpu_tabular', 'tests') for f in sorted((root/d).glob('*.py')) if f.name != '_modidx.py']
long = [f'{f.relative_to(root)}:{i}: {len(l)} characters'
        for f in files for i, l in enumerate(f.read_text().splitlines(), 1) if len(l) > LIMIT]
print(*long, sep='\n')
if long: sys.exit(f'{len(long)} lines over {LIMIT} characters: wrap them (in the notebook for a library module, then nbdev-export)')
print(f'{len(files)} files, no line over {LIMIT} characters')
