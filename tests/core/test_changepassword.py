"""``manage.py changepassword`` without a terminal says so in one line (it ended in a traceback:
termios.error, then EOFError)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from django.conf import settings
from django.db import connection


@pytest.mark.django_db(transaction=True)
def test_changepassword_without_a_terminal_refuses_in_one_line_and_keeps_the_password():
    from apps.accounts.services import user_ensure

    if connection.vendor != "sqlite":
        pytest.skip("the child process reaches the test database through its SQLite file")
    user = user_ensure(username="zed", password="pw-zed")
    env = os.environ | {"DATABASE_URL": f"sqlite:///{connection.settings_dict['NAME']}"}
    # A new session has no controlling terminal, so /dev/tty cannot be opened, as under cron.
    out = subprocess.run([sys.executable, "manage.py", "changepassword", "zed"], cwd=settings.BASE_DIR, env=env,
                         stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120,
                         start_new_session=True)
    assert out.returncode == 1
    assert "Traceback" not in out.stderr, out.stderr[-2000:]
    assert out.stderr.strip().splitlines() == [
        "CommandError: changepassword asks for the password on a terminal and there is none here: run it in one "
        "(docker exec -it, kubectl exec -it, ssh -t), or set the password in admin (Users → the user → the "
        "password form)"], out.stderr
    user.refresh_from_db()
    assert user.check_password("pw-zed")
