"""``jaxdistill`` entry point: parse arguments, call the library, print."""

from __future__ import annotations

import os
import sys
from typing import Sequence

import jax

from jaxdistill import _validate
from jaxdistill.cli import _fedmd
from jaxdistill.cli import _label
from jaxdistill.cli import _privacy
from jaxdistill.cli import _simulate
from jaxdistill.cli._common import CliError, Parser


def build_parser() -> Parser:
  parser = Parser(prog="jaxdistill", description="Private federated knowledge distillation in JAX.")
  sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
  _privacy.add_parser(sub)
  _simulate.add_parser(sub)
  _label.add_parser(sub)
  _fedmd.add_parser(sub)
  return parser


def main(argv: Sequence[str] | None = None) -> int:
  """Runs the CLI; bad input exits 2 and running out of memory exits 1, each with one line on stderr."""
  args = None
  try:
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # what was asked, for reports
    return int(args.func(args) or 0)
  except (CliError, ValueError) as err:
    msg = _validate.first_line(err) or type(err).__name__
    if not msg.startswith("jaxdistill"):
      msg = f"jaxdistill: error: {msg}"
    sys.stderr.write(msg + "\n")
    return 2
  except ArithmeticError as err:  # backstop: a parameter so large or small that float arithmetic gives up
    sys.stderr.write(f"jaxdistill: error: numeric {type(err).__name__} ({err}); a parameter is out of the range "
                     "this computation supports.\n")
    return 2
  except jax.errors.JaxRuntimeError as err:
    first = _validate.first_line(err)
    if "RESOURCE_EXHAUSTED" not in first and "out of memory" not in first.lower():
      raise  # not a resource problem: the traceback is the useful report
    if getattr(args, "command", None) == "simulate":  # memory ~ chunk x d (the _simulate docstring)
      hint = "use a smaller --chunk-size (working memory grows with it times s*|Y|)"
    else:
      hint = "use smaller models (--student-widths, --width-multiplier, --architectures), batches or data sizes"
    sys.stderr.write(f"jaxdistill: error: out of memory ({first[:200]}); {hint}.\n")
    return 1
  except MemoryError:  # NumPy on the host: the run's host arrays (e.g. simulate's float64 [s, |Y|] results)
    if getattr(args, "command", None) == "simulate":
      hint = ("host memory grows with --buckets x --labels (several float64 arrays of s*|Y| entries), whatever "
              "--chunk-size is; use fewer buckets or labels")
    else:
      hint = "use smaller data sizes, models or batches"
    sys.stderr.write(f"jaxdistill: error: out of host memory; {hint}.\n")
    return 1
  except KeyboardInterrupt:
    sys.stderr.write("jaxdistill: interrupted\n")
    return 130
  except BrokenPipeError:  # `jaxdistill privacy nfdp-paper | head -1`: the reader left; was a traceback
    # Python flushes stdout again at exit, which would raise once more: point it at /dev/null first.
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 128 + 13  # as a process killed by SIGPIPE, which is what the shell expects of `cmd | head`


if __name__ == "__main__":
  sys.exit(main())
