"""The notifications page as drawn: each checkbox sits on the line of its own words."""

from __future__ import annotations

import pytest

from .conftest import screenshot, sign_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# For each checkbox: its vertical middle, and the top and bottom of the words of its label.
CHECKS_AND_WORDS = """(form) => [...document.querySelectorAll(form + ' input[type=checkbox]')].map(box => {
  const words = document.createRange();
  words.selectNodeContents(box.closest('label'));
  words.setStartAfter(box);
  const text = words.getBoundingClientRect(), b = box.getBoundingClientRect();
  return [words.toString().trim(), b.top + b.height / 2, text.top, text.bottom];
})"""


def test_every_checkbox_is_on_the_line_of_its_label(live_portal, page, alice):
    """The team-event checkboxes sat one row above their words (new-user trial)."""
    _, web = live_portal
    sign_in(page, web.url, "alice", "pw-alice")  # a manager: the team-event boxes are shown
    page.goto(f"{web.url}/notifications/")
    screenshot(page, "40-notifications")
    for form in ("#add-channel", "#preferences"):
        boxes = page.evaluate(CHECKS_AND_WORDS, form)
        assert len(boxes) >= 4, form
        for words, middle, top, bottom in boxes:
            assert words and top <= middle <= bottom, (form, words, middle, top, bottom)
    assert page.errors == []
