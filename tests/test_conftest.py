"""The test configuration's own rule: cases marked ``thorough`` run under the thorough profile only."""

import pytest
from hypothesis import settings

from tests import conftest


class _Item:
  """The two methods of a pytest item that the hook calls."""

  def __init__(self, thorough: bool):
    self.marks = [pytest.mark.thorough.mark] if thorough else []

  def get_closest_marker(self, name):
    return next((m for m in self.marks if m.name == name), None)

  def add_marker(self, marker):
    self.marks.append(marker.mark)


def test_only_the_thorough_profile_runs_thorough_cases():
  active = "thorough" if settings().max_examples >= conftest.THOROUGH_EXAMPLES else "ci"
  try:
    for profile, skipped in (("ci", True), ("thorough", False)):
      settings.load_profile(profile)
      items = [_Item(thorough=True), _Item(thorough=False)]
      conftest.pytest_collection_modifyitems(None, items)
      assert [any(m.name == "skip" for m in item.marks) for item in items] == [skipped, False], profile
  finally:
    settings.load_profile(active)
  assert settings().max_examples == settings.get_profile(active).max_examples
