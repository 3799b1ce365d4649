from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied

from apps.core.admin_scoping import ChangedFieldsSaveAdmin, GuardedDeleteAdmin, SuperuserOnlyAdmin, TeamScopedAdmin
from apps.core.values import bytes_in_words

from .models import ModelVersion, SharedWeights, Stage
from .services import StageRefused, model_stage_set, model_version_delete


@admin.register(ModelVersion)
class ModelVersionAdmin(GuardedDeleteAdmin, TeamScopedAdmin, ChangedFieldsSaveAdmin, admin.ModelAdmin):
    list_display = ["name", "version", "team", "source", "stage", "task", "job", "size_shown", "created_at"]
    list_select_related = ["team", "job"]  # job is nullable: Django's own skips it (trial30b)
    list_filter = ["team", "source", "stage"]
    manager_can_change = False
    manager_can_delete = True
    # Stages change through the actions below, the portal or the API (managers, audited: the same
    # service and moves everywhere), never by editing the row.
    readonly_fields = ["stage", "stage_changed_at", "size_shown"]
    exclude = ["size"]  # the stored file's, shown in words (size_shown)
    actions = ["to_staging", "to_production", "to_archived"]
    # What a version is, fixed once it exists: a superuser's edit of its task or name made a name's
    # versions two tasks (services.version_number_claim keeps them one, so name:latest never switches
    # task), one of its team moved it under another team's name, one of its number re-issued a number.
    # Nor what its file is and where it came from: weights_key/sha256 could point pcb:v3 at another
    # team's file past the checkpoint checks, and job/dataset/parent offered other teams' rows (review29).
    # Nor what it scored and the file's name: an edited metrics made a version win a comparison or a
    # sweep's ranking it never earned; the filename is the uploaded file's, what a download is named.
    fixed_fields = ("team", "name", "version", "task", "weights_key", "sha256", "source", "job", "dataset",
                    "parent", "lineage", "uploaded_by", "metrics", "filename")

    def get_readonly_fields(self, request, obj=None):
        return [*super().get_readonly_fields(request, obj), *self.fixed_fields]

    def has_add_permission(self, request, *args):
        # Not here, superusers included: an added row skipped what every other way in does (the file's
        # checks, the name's number and task in version_number_claim). Versions come from trainings,
        # sweeps, the weights upload (portal, API, yoloq) and `manage.py weights add FILE --team T`.
        return False

    @admin.display(description="size", ordering="size")
    def size_shown(self, version: ModelVersion) -> str:
        return bytes_in_words(version.size)

    def has_stage_permission(self, request, obj=None) -> bool:
        return self.manages(request, obj)  # managers of the version's team (the queryset is theirs)

    def stage_move(self, request, queryset, stage: str) -> None:
        """Each selected version through ``model_stage_set``; say what moved and what was refused and why
        (trial 14, F16: admin offered only delete)."""
        moved, refused = [], []
        versions = [v for v in queryset.select_related("team") if self.manages(request, v)]
        if stage == Stage.PRODUCTION:
            # One version of a model holds production: two selected made the second archive the
            # first, and the message said otherwise (manager trial 15, F19). Such a group moves not.
            models: dict[tuple, list] = {}
            for version in versions:
                models.setdefault((version.team_id, version.name), []).append(version)
            for group in models.values():
                if len(group) > 1:
                    refused.append(f"{len(group)} versions of {group[0].name} selected "
                                   f"({', '.join(f'v{n}' for n in sorted(v.version for v in group))}): one version holds production, "
                                   "select one")
            versions = [v for v in versions if len(models[(v.team_id, v.name)]) == 1]
        for version in versions:
            try:
                changed = model_stage_set(version=version, stage=stage, by=request.user)
            except StageRefused as exc:
                refused.append(str(exc))
                continue
            if not changed:
                refused.append(f"{version} is already {stage}")
            moved += [f"{v} → {v.stage}" for v in changed]
        if moved:
            self.message_user(request, f"moved: {'; '.join(moved)}", messages.SUCCESS)
        if refused:
            self.message_user(request, f"not changed: {'; '.join(refused)}", messages.WARNING)

    @admin.action(description="Promote to staging", permissions=["stage"])
    def to_staging(self, request, queryset):
        self.stage_move(request, queryset, Stage.STAGING)

    @admin.action(description="Promote to production (archives the version that held it)", permissions=["stage"])
    def to_production(self, request, queryset):
        self.stage_move(request, queryset, Stage.PRODUCTION)

    @admin.action(description="Archive", permissions=["stage"])
    def to_archived(self, request, queryset):
        self.stage_move(request, queryset, Stage.ARCHIVED)

    def delete_model(self, request, obj):
        # Through the service: audited, and the version number is never issued again.
        if not self.manages(request, obj):
            raise PermissionDenied("you do not manage that team")
        model_version_delete(version=obj, by=request.user)

    def delete_queryset(self, request, queryset):
        for version in queryset:
            self.delete_model(request, version)


@admin.register(SharedWeights)
class SharedWeightsAdmin(SuperuserOnlyAdmin, admin.ModelAdmin):
    """Added with ``manage.py weights add FILE --shared`` (checked first); read-only here."""

    list_display = ["filename", "task", "size_shown", "sha256", "created_at"]
    readonly_fields = ["filename", "key", "sha256", "size_shown", "task", "scan", "added_by", "created_at"]
    exclude = ["size"]

    @admin.display(description="size", ordering="size")
    def size_shown(self, weights: SharedWeights) -> str:
        return bytes_in_words(weights.size)
