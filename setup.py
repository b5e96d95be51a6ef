"Install fastai_gpu_tabular from settings.ini, as nbdev's classic template does; the version comes from the package."
import re
from configparser import ConfigParser
from pathlib import Path
import setuptools

cfg = ConfigParser(delimiters=['='])
cfg.read('settings.ini', encoding='utf-8')
cfg = cfg['DEFAULT']
lib = cfg['lib_path']
version = re.search(r'^__version__\s*=\s*"([^"]+)"', Path(lib, '__init__.py').read_text(), re.M)[1]
licenses = dict(apache2=('Apache Software License 2.0', 'OSI Approved :: Apache Software License'))
statuses = ['Planning', 'Pre-Alpha', 'Alpha', 'Beta', 'Production/Stable', 'Mature', 'Inactive']
reqs = lambda k: cfg.get(k, '').split()

setuptools.setup(
    name=cfg['lib_name'], version=version, license=licenses[cfg['license']][0],
    description=cfg['description'], keywords=cfg['keywords'], author=cfg['author'], author_email=cfg['author_email'],
    url=f"https://github.com/{cfg['user']}/{cfg['repo']}", packages=setuptools.find_packages(include=[lib, f'{lib}.*']),
    include_package_data=True, python_requires=f">={cfg['min_python']}", zip_safe=False,
    long_description=Path('README.md').read_text(encoding='utf-8'), long_description_content_type='text/markdown',
    classifiers=[f"Development Status :: {cfg['status']} - {statuses[int(cfg['status'])]}", 'Intended Audience :: Developers',
                 f"License :: {licenses[cfg['license']][1]}", 'Natural Language :: English',
                 'Programming Language :: Python :: 3'],
    install_requires=reqs('requirements'), extras_require=dict(gpu=reqs('gpu_requirements'), dev=reqs('dev_requirements')),
    entry_points={'console_scripts': reqs('console_scripts'), 'nbdev': [f'{lib}={lib}._modidx:d']})
