"""Every Python example in the README runs, and gives what the README says it gives.

Expected values are read from the README's own comments (``# 19.11``,
``# False 0.971, then True 1.955``), so a change of the code that moves a
documented number fails here, and an example edited together with its
comment stays in step. Each example runs in a fresh namespace inside an
empty working directory.
"""

import ast
import contextlib
import io
import math
import pathlib
import re
import tokenize

import pytest

README = (pathlib.Path(__file__).parent.parent / "README.md").read_text()
BLOCKS = [(README[:m.start()].count("\n") + 2, m.group(1))  # (line of the code's first line, code)
          for m in re.finditer(r"```python\n(.*?)```", README, re.S)]
# A number, or a bracketed list of numbers, as written in a comment.
NUMBER = re.compile(r"\[[-\d., ]+\]|-?\d[\d,]*(?:\.\d+)?")


def block(marker):
  found = [(line, code) for line, code in BLOCKS if marker in code]
  assert len(found) == 1, f"expected one README example containing {marker!r}; found {len(found)}"
  return found[0]


def run(line, code, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  namespace, out = {}, io.StringIO()
  with contextlib.redirect_stdout(out):
    exec(compile(code, f"README.md:{line}", "exec"), namespace)  # pylint: disable=exec-used
  return namespace, out.getvalue()


def comments(code):
  """{line number in the block: comment text} (tokenize, so '#' inside strings is not a comment)."""
  toks = tokenize.generate_tokens(io.StringIO(code).readline)
  return {t.start[0]: t.string.lstrip("#").strip() for t in toks if t.type == tokenize.COMMENT}


def parse_number(text):
  """(value, half a unit of its last written digit) for a number written in a comment, or lists of
  both for a bracketed list (each item keeps its own precision)."""
  if text.startswith("["):
    items = [parse_number(s.strip()) for s in text[1:-1].split(",")]
    return [v for v, _ in items], [t for _, t in items]
  digits = text.replace(",", "")
  decimals = len(digits.split(".")[1]) if "." in digits else 0
  return float(digits), 0.5 * 10.0**-decimals


def test_the_readme_has_the_examples_these_tests_check():
  assert len(BLOCKS) == 6


def test_labeling_example_reports_accuracy_and_writes_nothing(tmp_path, monkeypatch):
  ns, out = run(*block("labeling.run_labeling(config)"), tmp_path, monkeypatch)
  res = ns["result"].report["results"]
  for key in ("acc_pl", "acc_pc", "noise_free_acc_pl", "noise_free_acc_pc", "supervised_ceiling_acc_pc"):
    assert 0.0 <= res[key] <= 1.0 and key in out
  assert ns["result"].report["privacy"]["budget"]["total_epsilon"] == 4.0
  assert list(tmp_path.iterdir()) == []  # "None: nothing written to disk"


def test_building_blocks_example_labels_the_public_set(tmp_path, monkeypatch):
  ns, out = run(*block("CentralDiscreteLaplace(shape, 1.0)"), tmp_path, monkeypatch)
  acc, eps = map(float, out.split())
  assert eps == 1.0
  # Deterministic (fixed keys); 0.886 here. The README's main job labels the same data set at the
  # same sizes with Acc_pl 0.86, so a floor of 0.8 only fails if the pipeline breaks.
  assert acc > 0.8
  assert ns["votes"].shape == (40, 10) and ns["votes"].dtype == "float64"


def test_simulation_example_error_matches_its_closed_form(tmp_path, monkeypatch):
  # The block itself asserts bitwise equality across chunk sizes. Its RMS over 400 entries of a
  # near-normal estimate has a relative sd of about 1/sqrt(800) = 0.035 around the closed form, so
  # a 20% tolerance (5.7 sd) fails with probability < 1e-8 for a correct closed form.
  _, out = run(*block("chunk_size=1000"), tmp_path, monkeypatch)
  measured, predicted = map(float, out.split())
  assert abs(measured / predicted - 1) < 0.2, (measured, predicted)


def test_accounting_example_returns_the_numbers_in_its_comments(tmp_path, monkeypatch):
  line, code = block("from jaxdistill import accounting as acc")
  monkeypatch.chdir(tmp_path)
  notes = comments(code)
  namespace, checked = {}, 0
  for stmt in ast.parse(code).body:
    if not isinstance(stmt, ast.Expr):
      exec(compile(ast.Module([stmt], []), f"README.md:{line}", "exec"), namespace)  # pylint: disable=exec-used
      continue
    expression = compile(ast.Expression(stmt.value), f"README.md:{line}", "eval")
    value = eval(expression, namespace)  # pylint: disable=eval-used
    match = NUMBER.search(notes.get(stmt.end_lineno, ""))
    if match is None:
      continue
    expected, tol = parse_number(match.group())
    got = [float(v) for v in value] if isinstance(expected, list) else float(value)
    if isinstance(expected, list):
      assert len(got) == len(expected) and all(abs(g - e) <= t + 1e-12 for g, e, t in zip(got, expected, tol)), \
          (ast.unparse(stmt), got, expected)
    else:
      assert math.isclose(got, expected, abs_tol=tol + 1e-12), (ast.unparse(stmt), got, expected)
    checked += 1
  assert checked == 7  # laplace, calibrate, shuffle_epsilon, shuffle_local_epsilon (one release and five), ten
  # releases, privacy_profile


@pytest.mark.parametrize("marker, printed", [
    ("audit.audit_privacy(", r"# (False [\d.]+), then (True [\d.]+)"),         # no alarm, then the planted bug's
    ("M.ConcatenationLiteral(", r"# (concatenation \w+), (concatenation-literal \w+)"),  # the bias is caught
], ids=["audit", "concatenation-bias"])
def test_example_prints_the_lines_its_comment_gives(marker, printed, tmp_path, monkeypatch):
  line, code = block(marker)
  expected = re.search(printed, code)
  assert expected is not None
  _, out = run(line, code, tmp_path, monkeypatch)
  assert out.splitlines() == list(expected.groups())
