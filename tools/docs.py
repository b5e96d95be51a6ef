"""Build the docs site and README.md from nbs/ without Quarto (nbdev's notebook processing, then nbconvert).

    python tools/docs.py           # HTML site in _docs/, README.md from nbs/index.ipynb
    python tools/docs.py --check   # the same, but fail if README.md is out of date (CI)

Where Quarto is installed, `nbdev-docs` builds the same notebooks into nbdev's usual site."""
import argparse, html, json, re, sys
from pathlib import Path
import nbformat, yaml
from traitlets.config import Config
from nbconvert import HTMLExporter, MarkdownExporter
from nbdev.config import get_config
from nbdev.quarto import refresh_quarto_yml, nbdev_sidebar
from nbdev.doclinks import _build_modidx
from nbdev.serve import proc_nbs
import fastcore.docments as _fd

_docments = _fd.docments
def whole_docments(elt, full=False, **kwargs):
    "fastcore's `docments`, a function's parameters' comments whole (the lines below each joined on), as `--help` shows them"
    import inspect
    from fastai_gpu_tabular.cli import whole_docments as whole
    res = _docments(elt, full=full, **kwargs)
    if not inspect.isfunction(elt): return res  # the notebooks' functions: defined in the docs build's shell (`__main__`), or ours
    try: docs = whole(elt)
    except (OSError, TypeError): return res
    for k,v in docs.items():
        if k not in res: continue
        if full: res[k]['docment'] = v
        else: res[k] = v
    return res
_fd.docments = whole_docments  # `show_doc`'s tables (fastcore's renderer looks the name up in its module)

_dir = re.compile(r'^\s*#\|\s*([\w-]+)\s*:?\s*(.*)$')

def directives(src):
    "Quarto/nbdev `#|` directives at the top of a cell, and the source without them"
    d, lines = {}, src.splitlines()
    while lines and (m := _dir.match(lines[0])): d[m[1]] = m[2].strip(); lines.pop(0)
    return d, '\n'.join(lines)

def prepare(nb):
    "Apply what Quarto would: front matter to a title, hidden cells and inputs removed, errors fail the build"
    cells, out_file = [], None
    for c in nb.cells:
        if c.cell_type == 'raw' and c.source.startswith('---'):
            fm = yaml.safe_load(c.source.strip().strip('-')) or {}
            out_file = fm.get('output-file')
            title = f"# {fm['title']}\n\n" if fm.get('title') else ''
            cells.append(nbformat.v4.new_markdown_cell(title + (f"> {fm['description']}" if fm.get('description') else '')))
            continue
        if c.cell_type != 'code': cells.append(c); continue
        d, c.source = directives(c.source)
        if d.get('include') == 'false' or 'hide' in d: continue
        for o in c.get('outputs', []):
            if o.get('output_type') == 'error': raise SystemExit(f"a cell's output is an error: {o.get('ename')}: {o.get('evalue')}")
        c.metadata['tags'] = ['remove_input'] if d.get('echo') == 'false' else []
        cells.append(c)
    keep = {'cell_type', 'metadata', 'source', 'outputs', 'execution_count', 'id', 'attachments'}
    for c in cells:
        for k in set(c) - keep: del c[k]
        for k in ('transient', 'execution'): c.metadata.pop(k, None)
    nb.cells = cells
    nb.metadata['language_info'] = {'name': 'python'}
    return nb, out_file

def nav(pages, here):
    links = ' · '.join(f'<b>{html.escape(t)}</b>' if f == here else f'<a href="{f}">{html.escape(t)}</a>' for f, t in pages)
    return f'<nav style="padding:.6em 1em;border-bottom:1px solid #ddd;font-family:sans-serif">{links}</nav>'

README_LINES, README_BYTES = 150, 12*1024  # a user's page: what it is, how to run it, today's figures; history goes to git
NOTES_LINES = 600  # bench/NOTES.md: what is true now, by topic, and what was tried and dropped
LINKED = ('README.md', 'bench/README.md', 'bench/NOTES.md')  # pages whose links and cited results must resolve
_link,_cited = re.compile(r'\]\(([^)#\s]+)(?:#[^)]*)?\)'),re.compile(r'(?<![\w/.-])results/[\w.*-]+\.(?:json|log|txt)')
_hash = re.compile(r'(?<![\w./-])(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![\w.-])')  # a commit, not part of a file name

def check_readme(md):
    "Fail when README.md (from nbs/index.ipynb) is longer than `README_LINES` or names a commit"
    if (n := len(md.splitlines())) > README_LINES:
        raise SystemExit(f"README.md has {n} lines, more than {README_LINES}: move detail to the docs or bench/NOTES.md")
    if (n := len(md.encode())) > README_BYTES: raise SystemExit(f"README.md is {n:,} bytes, more than {README_BYTES:,}: shorten it")
    if hashes := _hash.findall(md):
        raise SystemExit(f"README.md names commits ({', '.join(hashes[:5])}): it speaks of the project today; history goes to bench/NOTES.md")

def dead_links(root:Path)->list:
    """(page, target) of each markdown link in `LINKED` that names no file or folder of the repository, and of each `results/NAME`
    cited (a glob must match a file) that is not in `bench/results/`"""
    bad = []
    for page in LINKED:
        f = root/page; text = f.read_text()
        bad += [(page, t) for t in _link.findall(text) if '://' not in t and not (f.parent/t).exists()]
        bad += [(page, t) for t in _cited.findall(text) if not list((root/'bench').glob(t))]
    return bad

def check_notes(root:Path):
    "Fail when bench/NOTES.md is longer than `NOTES_LINES` or a page of `LINKED` links or cites a file that is not there"
    if (n := len((root/'bench/NOTES.md').read_text().splitlines())) > NOTES_LINES:
        raise SystemExit(f"bench/NOTES.md has {n} lines, more than {NOTES_LINES}: keep what is true now, by topic; git keeps the diary")
    if bad := dead_links(root): raise SystemExit(f"links to files that are not in the repository: {bad[:10]}")

def main(check=False):
    cfg = get_config()
    refresh_quarto_yml(); _build_modidx(); nbdev_sidebar.__wrapped__()
    proc = Path(proc_nbs(cfg.nbs_path, n_workers=0))
    out = cfg.doc_path; out.mkdir(exist_ok=True)
    nbs = sorted(proc.glob('*.ipynb'), key=lambda p: (p.stem != 'index', p.name))
    built = []
    for p in nbs:
        nb, out_file = prepare(nbformat.read(p, as_version=4))
        title = next((l[2:] for c in nb.cells if c.cell_type == 'markdown' for l in c.source.splitlines() if l.startswith('# ')), p.stem)
        built.append((nb, out_file or re.sub(r'^\d+[a-zA-Z0-9]*_', '', p.stem) + '.html', title))
    pages = [(f, t) for _, f, t in built]
    c = Config(); c.TagRemovePreprocessor.remove_input_tags = {'remove_input'}; c.TagRemovePreprocessor.enabled = True
    c.TemplateExporter.exclude_input_prompt = c.TemplateExporter.exclude_output_prompt = True  # no `In [ ]:` / `Out[4]:`
    exp = HTMLExporter(config=c, template_name='lab')
    for nb, f, t in built:
        body, _ = exp.from_notebook_node(nb)
        (out/f).write_text(re.sub(r'(<body[^>]*>)', lambda m: m[1] + nav(pages, f), body, count=1))
    broken = [(f, h) for _, f, _ in built for h in re.findall(r'href="([^"#:]+\.html)', (out/f).read_text()) if not (out/h).exists()]
    if broken: raise SystemExit(f"broken links in the docs: {broken[:10]}")
    # README.md from the processed index notebook
    nb = next(nb for nb, f, _ in built if f == 'index.html')
    md, _ = MarkdownExporter(config=c).from_notebook_node(nb)
    md = re.sub(r'\n{3,}', '\n\n', md).strip() + '\n'
    readme = cfg.config_path/'README.md'
    check_readme(md)
    if check and (not readme.exists() or readme.read_text() != md):
        raise SystemExit("README.md is out of date with nbs/index.ipynb: run `python tools/docs.py` and commit README.md")
    if not check: readme.write_text(md)
    check_notes(cfg.config_path)
    print(f"built {len(built)} pages in {out}: {', '.join(f for _, f, _ in built)}; README.md {'checked' if check else 'written'}")

if __name__ == '__main__':
    a = argparse.ArgumentParser(); a.add_argument('--check', action='store_true')
    main(a.parse_args().check)
