# Copyright 2026 The flax-tieext Authors.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.

"""Sphinx configuration: MyST Markdown pages, autodoc, doctests.

Build with ``nox -s docs`` (HTML and doctest builders, warnings are errors).
"""

import os

os.environ.setdefault('JAX_PLATFORMS', 'cpu')

import flax_tieext  # pylint: disable=g-import-not-at-top,wrong-import-position

project = 'flax-tieext'
author = 'The flax-tieext Authors'
copyright = '2026, The flax-tieext Authors'  # pylint: disable=redefined-builtin
release = flax_tieext.__version__
version = release

extensions = [
    'myst_parser',
    'sphinx.ext.autodoc',
    'sphinx.ext.doctest',
    'sphinx.ext.napoleon',
    'sphinx.ext.viewcode',
    'sphinx_copybutton',
]

source_suffix = {'.md': 'markdown', '.rst': 'restructuredtext'}
root_doc = 'index'
exclude_patterns = ['_build']

# MyST: ```{doctest} blocks are run by the doctest builder; headings up to
# level 3 get anchors that pages can link to.
myst_heading_anchors = 3
myst_enable_extensions = ['colon_fence']

# Google-style docstrings, as in Flax.
napoleon_google_docstring = True
napoleon_numpy_docstring = False
autodoc_member_order = 'bysource'
# Signatures as a user writes the call, as in Flax's own API pages: the types
# are in each docstring's Args, in words (Flax's CollectionFilter, expanded,
# would read `bool | str | Collection[str] | DenyList`).
autodoc_typehints = 'none'
autodoc_preserve_defaults = True

# The copy button of a code block copies what pastes into the REPL: the
# docstrings' examples without their `>>> ` / `... ` prompts and output, a
# blank `...` line as the empty line that ends an indented block
# (tests/test_docs_paste.py pastes them so).
copybutton_prompt_text = r'>>> |\.\.\. |\.\.\.$'
copybutton_prompt_is_regexp = True
copybutton_only_copy_prompt_lines = True

doctest_global_setup = '''
import os
os.environ.setdefault('JAX_PLATFORMS', 'cpu')
'''

html_theme = 'alabaster'
html_title = f'flax-tieext {release}'
html_static_path = ['_static']
html_css_files = ['custom.css']
# Sized for a 1280 px window: the body column is what the sidebar leaves.
html_theme_options = {
    'description': 'Tied variables and static_argnames for Flax',
    'fixed_sidebar': True,
    'page_width': '1240px',
    'sidebar_width': '240px',
}


def _alias_points_to_its_function(app, what, name, obj, options, lines):
  """``remat = checkpoint``, documented as ``remat``: its signature, and a link
  to the function it is instead of a second copy of its docstring."""
  del app, options
  own = getattr(obj, '__name__', None)
  module, _, shown = name.rpartition('.')
  if what == 'function' and own and shown != own:
    lines[:] = [f'An alias of :func:`{module}.{own}`.', '']


def setup(app):
  app.connect('autodoc-process-docstring', _alias_points_to_its_function)
