"The repository's pages as CI checks them (`tools/docs.py --check`): sizes, and links and cited results that resolve"
import importlib.util, shutil
from pathlib import Path
import pytest

ROOT = Path(__file__).parents[1]
spec = importlib.util.spec_from_file_location('docs', ROOT/'tools/docs.py')
docs = importlib.util.module_from_spec(spec); spec.loader.exec_module(docs)

@pytest.fixture
def repo(tmp_path):
    "A copy of the pages `docs.LINKED` with the files they link to, as the repository has them"
    for p in docs.LINKED: (tmp_path/p).parent.mkdir(parents=True, exist_ok=True); shutil.copy(ROOT/p, tmp_path/p)
    for d in ('bench', 'nbs'): shutil.copytree(ROOT/d, tmp_path/d, dirs_exist_ok=True)
    shutil.copy(ROOT/'FORMAT.md', tmp_path/'FORMAT.md')
    return tmp_path

def test_the_repositorys_pages_link_and_cite_only_what_is_there():
    assert docs.dead_links(ROOT) == []
    docs.check_notes(ROOT)
    docs.check_readme((ROOT/'README.md').read_text())

def test_a_dead_link_a_missing_result_and_long_pages_are_refused(repo):
    assert docs.dead_links(repo) == []
    notes = repo/'bench/NOTES.md'
    notes.write_text(notes.read_text() + "\nSee [the old profile](profiles/gone.py) and `results/gone_h200.json`.\n")
    (repo/'bench/README.md').write_text((repo/'bench/README.md').read_text().replace('(bench_e2e.py)', '(bench_e2e2.py)'))
    assert docs.dead_links(repo) == [('bench/README.md', 'bench_e2e2.py'), ('bench/NOTES.md', 'profiles/gone.py'),
                                     ('bench/NOTES.md', 'results/gone_h200.json')]
    notes.write_text('line\n' * (docs.NOTES_LINES + 1))
    with pytest.raises(SystemExit, match='more than 600'): docs.check_notes(repo)
    with pytest.raises(SystemExit, match='bytes, more than'): docs.check_readme('x' * 100 + '\n' + 'y' * docs.README_BYTES)
    with pytest.raises(SystemExit, match='lines, more than 150'): docs.check_readme('x\n' * (docs.README_LINES + 1))
