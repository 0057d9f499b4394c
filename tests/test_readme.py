"""The README's two set-up commands and CI stay in step."""

import pathlib

ROOT = pathlib.Path(__file__).parent.parent


def readme_commands():
  text = (ROOT / "README.md").read_text()
  block = text.split("```bash", 1)[1].split("```", 1)[0]
  return [line.strip() for line in block.strip().splitlines()]


def test_readme_opens_with_two_commands():
  cmds = readme_commands()
  assert len(cmds) == 2
  assert cmds[0].startswith("python -m pip install .") and "python -m jaxdistill" in cmds[0]
  assert "pytest" in cmds[1]


def test_ci_runs_the_readme_test_command_verbatim():
  ci = (ROOT / ".ci" / "run").read_text().splitlines()
  assert readme_commands()[1] in [line.strip() for line in ci]
