"""scripts/fedmd_table.py's command line (the table itself is results/fedmd, produced by the command there)."""

import importlib.util
import pathlib
import sys

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "fedmd_table.py"


def load_script():
  spec = importlib.util.spec_from_file_location("fedmd_table", SCRIPT)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


@pytest.mark.parametrize("flags,named", [(["--rounds", "3"], "--rounds"),
                                         (["--public-subset", "200", "--width-multiplier", "0.25"],
                                          "--public-subset, --width-multiplier")])
def test_quick_refuses_the_settings_it_would_override(flags, named, monkeypatch, tmp_path, capsys):
  # --quick overwrote these silently, while the recorded command showed the user's values.
  module = load_script()
  monkeypatch.setattr(sys, "argv", ["fedmd_table.py", "--quick", "--out", str(tmp_path / "out"), *flags])
  with pytest.raises(SystemExit) as err:
    module.main()
  assert err.value.code == 2
  assert f"--quick sets {named} itself" in capsys.readouterr().err
  assert not (tmp_path / "out").exists()  # refused before anything was written
