"""``manage.py changepassword``, Django's, with a one-line refusal where it cannot ask.

Django's command asks through ``getpass``; without a terminal (cron, ``docker exec`` without
``-t``, ``kubectl exec`` without ``-it``) that ended in a traceback (``termios.error``, then
``EOFError``). Listed in INSTALLED_APPS before ``django.contrib.auth`` so this one is found first.
"""

from __future__ import annotations

import os
import sys

from django.contrib.auth.management.commands import changepassword
from django.core.management.base import CommandError


def terminal_available() -> bool:
    """Whether getpass can ask someone: it reads from /dev/tty, else from a terminal on stdin."""
    try:
        os.close(os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY))
    except OSError:
        return sys.stdin is not None and sys.stdin.isatty()
    return True


class Command(changepassword.Command):
    def _get_pass(self, prompt: str = "Password: ") -> str:
        if not terminal_available():
            raise CommandError("changepassword asks for the password on a terminal and there is none here: run it "
                               "in one (docker exec -it, kubectl exec -it, ssh -t), or set the password in admin "
                               "(Users → the user → the password form)")
        try:
            return super()._get_pass(prompt)
        except EOFError:  # Ctrl-D at the prompt
            raise CommandError("aborted") from None
