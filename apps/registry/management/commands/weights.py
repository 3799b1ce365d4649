"""manage.py weights: base weights for every team, or a team's, from the command line.

    manage.py weights add yolov8s.pt --shared [--name yolov8s.pt] [--replace]
    manage.py weights add yolov8s.pt --team team-a [--user alice]
    manage.py weights list

Every file goes through the same checkpoint check as an upload (a restricted unpickling
pass that loads nothing) before it is stored; a refused file is named with the offending
global. ``model=yolov8s.pt`` in a spec resolves to the team's uploads first, then to the
shared weights.
"""

from __future__ import annotations

from pathlib import Path

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from apps.accounts.models import Team
from apps.accounts.services import StorageQuotaExceeded, operator_named
from apps.core.storage import StorageUnavailable
from apps.registry.checkpoint_scan import member_name_ok
from apps.registry.models import ModelVersion, SharedWeights
from apps.registry.services import WeightsRefused, shared_weights_add, weights_upload


class Command(BaseCommand):
    help = "Add shared or team weights (checked before they are stored), or list them."

    def add_arguments(self, parser):
        verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
        add = verbs.add_parser("add", help="check a .pt and store it as shared or team weights")
        add.add_argument("file", help="a .pt written by Ultralytics (training or model.save())")
        where = add.add_mutually_exclusive_group(required=True)
        where.add_argument("--shared", action="store_true", help="base weights every team may use")
        where.add_argument("--team", help="a team's own weights (a new version of <name>)")
        add.add_argument("--name", help="the file name specs use (default: the file's own name)")
        add.add_argument("--user", help="who uploads it to the team (recorded; default: no one)")
        add.add_argument("--replace", action="store_true", help="replace shared weights of that name")
        verbs.add_parser("list", help="shared weights and every team's uploaded weights")

    def handle(self, *args, verb: str, **options):
        return getattr(self, verb)(**options)

    def add(self, *, file: str, shared: bool, team: str | None, name: str | None, user: str | None,
            replace: bool, **_):
        source = Path(file)
        if not source.is_file():
            raise CommandError(f"{file}: no such file")
        filename = name or source.name
        if name is not None and not member_name_ok(name):  # the refusal named the source file
            raise CommandError(f"--name {name!r}: must be a plain file name ending in .pt, like yolov8s.pt")
        try:
            if shared:
                before = SharedWeights.objects.filter(filename=filename).values_list("sha256", flat=True).first()
                row = shared_weights_add(source=source, filename=filename, replace=replace,
                                         by=operator_named("weights add"))
                done = ("already there with the same bytes: unchanged" if before == row.sha256 else
                        f"replaced (was sha256 {before[:12]}…)" if before else "added")
                self.stdout.write(self.style.SUCCESS(
                    f"shared weights {row.filename} {done} ({row.task or 'task unknown'}, sha256 {row.sha256[:12]}…)"))
                return
            owner = Team.objects.filter(slug=team).first()
            if owner is None:
                raise CommandError(f"no team {team!r}")
            uploader = get_user_model().objects.filter(username=user).first() if user else None
            if user and uploader is None:
                raise CommandError(f"no user {user!r}")
            with source.open("rb") as handle:
                version, created = weights_upload(user=uploader, team=owner, upload=handle, filename=filename,
                                                  size=source.stat().st_size, by=operator_named("weights add"))
            if not created:
                self.stdout.write(self.style.SUCCESS(
                    f"unchanged: {owner.slug}/{version.reference} already holds these bytes; no new version made"))
                return
            self.stdout.write(self.style.SUCCESS(f"{filename} stored for {owner.slug} as {version}"))
        except WeightsRefused as exc:
            raise CommandError(f"{file}: {exc}") from None
        except StorageQuotaExceeded as exc:
            raise CommandError(str(exc)) from None
        except StorageUnavailable as exc:
            raise CommandError(f"{file}: not stored: {exc}") from None

    def list(self, **_):
        for row in SharedWeights.objects.all():
            self.stdout.write(f"shared   {row.filename:<28} {row.task:<9} {row.size / 1024**2:7.1f} MiB  "
                              f"{row.sha256[:12]}")
        for version in ModelVersion.objects.filter(source=ModelVersion.Source.UPLOAD).select_related("team"):
            self.stdout.write(f"{version.team.slug:<8} {version.filename:<28} {version.task:<9} "
                              f"{version.size / 1024**2:7.1f} MiB  {version.sha256[:12]}  v{version.version}")
