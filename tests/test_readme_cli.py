"""Every concrete ``python -m jaxdistill ...`` command in the README parses and builds a valid configuration.

The commands themselves take minutes (training), so they are not run here: each is parsed by the CLI's own
parser and, for ``label`` and ``fedmd``, turned into the library's configuration, which validates every setting
(a flag the README still used after its meaning changed, e.g. ``--mechanism none --epsilon 2``, fails here).
Commands with placeholders (``[--json]``, ``{label,...}``, ``E``) are skipped.
"""

import pathlib
import re
import shlex

import pytest

from jaxdistill.cli import _fedmd, _label
from jaxdistill.cli.main import build_parser

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
PREFIX = "python -m jaxdistill "


def readme_commands() -> list[str]:
  """The README's jaxdistill commands: fenced lines (backslash continuations joined) and inline `code`."""
  text = README.read_text(encoding="utf-8")
  found, fenced, inside = [], [], False
  for line in text.splitlines():
    if line.lstrip().startswith("```"):
      inside = not inside
    elif inside:
      fenced.append(line)
  for line in "\n".join(fenced).replace("\\\n", " ").splitlines():
    found += [part.strip() for part in line.split("&&")]
  inline = re.findall(r"`(python -m jaxdistill [^`]+)`", text)
  found += [part.strip() for command in inline for part in command.split("&&")]
  out = []
  for cmd in found:
    cmd = cmd.split(" #")[0].strip()
    cmd = cmd[cmd.find(PREFIX):] if PREFIX in cmd else cmd  # after an environment prefix (XLA_FLAGS=...)
    if cmd.startswith(PREFIX) and not re.search(r"[\[\]{}<>]|\.\.\.|\bE\b|\bR\b", cmd):
      out.append(cmd)
  return sorted(set(out))


COMMANDS = readme_commands()


def test_the_readme_has_commands_of_every_kind():
  kinds = {shlex.split(c)[3] for c in COMMANDS}
  assert kinds == {"label", "simulate", "privacy", "fedmd"} and len(COMMANDS) >= 20, COMMANDS


@pytest.mark.parametrize("cmd", COMMANDS)
def test_readme_command_parses_and_configures(cmd):
  args = build_parser().parse_args(shlex.split(cmd)[3:])
  if args.command == "label":
    config = _label.config_from_args(args)
    assert config.mechanism == args.mechanism
  elif args.command == "fedmd":
    args = _fedmd._check_method_flags(args)  # pylint: disable=protected-access
    samplings = {"wor": [False], "wr": [True], "both": [False, True]}[args.sampling]
    configs = [_fedmd._config(args, k, wr) for wr in samplings for k in args.k]  # pylint: disable=protected-access
    assert configs and all(c.method == args.method for c in configs)
