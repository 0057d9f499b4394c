"""Every ``>>>`` example in the library's docstrings runs and prints what it shows.

The examples are the first code a reader copies, and their outputs are
numbers (a calibrated epsilon, a grid size, a FLOP count) that move when the
code does. Each module with examples is one test, run by :mod:`doctest` with
the standard flags, so a stale output fails here with doctest's diff.
"""

import doctest
import importlib
import pkgutil

import pytest

import jaxdistill


def _modules_with_examples():
  found = []
  for info in pkgutil.walk_packages(jaxdistill.__path__, "jaxdistill."):
    if info.name.rsplit(".", 1)[-1] == "__main__":  # importing it runs the CLI
      continue
    module = importlib.import_module(info.name)
    if any(t.examples for t in doctest.DocTestFinder().find(module)):
      found.append(info.name)
  return found


MODULES = _modules_with_examples()


def test_the_examples_are_found():
  # 15 modules carried examples when this test was written; a walk that silently finds none would pass below.
  assert len(MODULES) >= 15, MODULES


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_print_what_they_show(name):
  module = importlib.import_module(name)
  runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
  failures = []
  for test in doctest.DocTestFinder().find(module):
    out = []
    result = runner.run(test, out=out.append, clear_globs=True)
    if result.failed:
      failures.append("".join(out))
  assert not failures, "\n".join(failures)


def test_sources_compile_without_invalid_escapes():
  # A docstring's LaTeX written with single backslashes ("\sqrt", "\frac") compiles with a warning only, and
  # "\f" silently becomes a form feed: every source must compile with warnings as errors.
  import pathlib  # pylint: disable=import-outside-toplevel
  import warnings  # pylint: disable=import-outside-toplevel
  root = pathlib.Path(jaxdistill.__file__).parent
  sources = sorted(root.rglob("*.py"))
  assert len(sources) > 40
  for path in sources:
    with warnings.catch_warnings():
      warnings.simplefilter("error")
      compile(path.read_text(), str(path.relative_to(root.parent)), "exec")
