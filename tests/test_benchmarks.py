"""The benchmark scripts still run (at tiny sizes). Nothing here asserts a time: timings live in benchmarks/."""

import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_mechanisms_benchmark_runs_and_prints_both_ratios():
  cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_mechanisms.py"), "--clients", "2000", "--big-clients", "0",
         "--mechanisms", "rr", "--host-devices", "1", "--repeats", "1", "--loop-clients", "100"]
  run = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False, cwd=ROOT)
  assert run.returncode == 0, run.stderr[-2000:]
  lines = run.stdout.splitlines()
  header = next(line for line in lines if line.startswith("contender"))
  assert "time / jaxdistill" in header and "CPU / jaxdistill" in header
  rows = {line.split()[0]: line for line in lines if line.split()[:1] in (["jaxdistill"], ["numpy"], ["loop"])}
  assert set(rows) == {"jaxdistill", "numpy", "loop"}, run.stdout
  for row in rows.values():  # a failed contender prints its error instead of the two ratios
    assert len(re.findall(r"\s[0-9.e+-]+x(?=\s|$)", row)) == 2, row
  assert "extrapolated from 100 clients" in rows["loop"]


def test_accelerator_checks_run_and_pass_on_the_cpu_backend():
  # Without an accelerator every check compares XLA:CPU with itself, so all must hold; what this guards is the
  # script (benchmarks/README.md's GPU section was measured with it) and the invariances it checks.
  cmd = [sys.executable, str(ROOT / "benchmarks" / "accelerator_checks.py"), "--mechanisms", "rr,shuffle-multi",
         "--clients", "3000", "--chunk-sizes", "1000", "4096", "--n", "700", "--s", "40", "--d", "16", "--k", "1", "3",
         "--block-sizes", "128"]
  run = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False, cwd=ROOT)
  assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
  rows = [line for line in run.stdout.splitlines() if line.startswith("| ") and not line.startswith("| d ")
          and not line.startswith("| mechanism")]
  assert len(rows) == 2 + 2, run.stdout  # two mechanisms, then (d, k) = (16, 1), (16, 3)
  assert all("False" not in row for row in rows), run.stdout
  assert all(" 0 of 700 " in row for row in rows[2:]), run.stdout  # CPU against itself: no row differs
  assert run.stdout.rstrip().endswith("All checks passed.")


def test_profile_stages_runs_and_every_chunk_gives_the_same_statistics():
  # The script behind benchmarks/README.md's GPU profiles, at a tiny size: two chunk sizes and the default per
  # mechanism, then the reverse k-NN stages. The runner promises the same statistics for every chunk.
  cmd = [sys.executable, str(ROOT / "benchmarks" / "profile_stages.py"), "--clients", "5000", "--chunk-sizes", "1000",
         "4096", "--mechanisms", "shuffle-multi", "rr", "--n", "700", "--s", "40", "--d", "16", "--k", "1", "3",
         "--repeats", "1"]
  run = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False, cwd=ROOT)
  assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
  rows = [line.split("|")[1:-1] for line in run.stdout.splitlines() if line.startswith("| ")]
  chunk_rows = [r for r in rows if r[0].strip() in ("shuffle-multi", "rr")]
  assert [r[1].strip() for r in chunk_rows] == ["1000", "4096", "default (4096)"] * 2, run.stdout
  assert all(r[-1].strip() == "yes" for r in chunk_rows), run.stdout
  stage_rows = [r for r in rows if r[0].strip() == "16"]
  assert [r[1].strip() for r in stage_rows] == ["1", "3"], run.stdout
  assert all(len(r) == 10 for r in stage_rows), run.stdout
