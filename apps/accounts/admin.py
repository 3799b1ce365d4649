from django import forms
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied

from apps.core.admin_scoping import SuperuserOnlyAdmin, TeamScopedAdmin, TeamScopedInline

from .models import ApiToken, AuditEntry, Membership, Team
from .services import membership_remove, membership_set

MANAGER_ROLES = [(Membership.Role.MEMBER, "member"), (Membership.Role.MANAGER, "manager")]


class UsernameChoiceField(forms.ModelChoiceField):
    """A user typed by exact username, instead of a list of every account on the system."""

    widget = forms.TextInput
    default_error_messages = {"invalid_choice": "no active account with that username"}

    def __init__(self, **kwargs):
        kwargs.pop("queryset", None)
        kwargs.pop("to_field_name", None)
        super().__init__(queryset=get_user_model().objects.filter(is_active=True), to_field_name="username",
                         **kwargs)

    def prepare_value(self, value):
        # An unbound change form's initial value is the user's primary key (model_to_dict).
        if isinstance(value, int):
            return get_user_model().objects.filter(pk=value).values_list("username", flat=True).first() or ""
        return super().prepare_value(value)


class RoleChoicesForManagers:
    """A manager may make people members or managers; only superusers grant the admin role.
    Managers name a user by their exact username: the chooser lists no accounts."""

    def formfield_for_choice_field(self, db_field, request, **kwargs):
        if db_field.name == "role" and not request.user.is_superuser:
            kwargs["choices"] = MANAGER_ROLES
        return super().formfield_for_choice_field(db_field, request, **kwargs)

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        if db_field.name == "user" and not request.user.is_superuser:
            return UsernameChoiceField(label="User (exact username)", required=not db_field.blank)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)


class MembershipInline(RoleChoicesForManagers, TeamScopedInline, admin.TabularInline):
    model = Membership
    extra = 0
    manager_can_add = manager_can_delete = True


@admin.register(Team)
class TeamAdmin(TeamScopedAdmin, admin.ModelAdmin):
    list_display = ["slug", "name", "shares", "members"]
    search_fields = ["slug", "name"]
    inlines = [MembershipInline]
    team_field = "pk"
    # The fair-share weight decides everyone's priority, the storage quota is a share of the
    # pool's disk (like the GPU quotas, superuser-only): only admins change them.
    superuser_only_fields = ("slug", "shares", "storage_quota_gb")

    @admin.display(description="members")
    def members(self, team: Team) -> int:
        return team.memberships.count()

    def save_formset(self, request, form, formset, change):
        if formset.model is not Membership:
            return super().save_formset(request, form, formset, change)
        # Through the service, so role changes are audited.
        for membership in formset.save(commit=False):
            saved = membership_set(user=membership.user, team=form.instance, role=membership.role, by=request.user)
            membership.pk = saved.pk  # the form's row is the one saved (the admin audit reads it back)
        for membership in formset.deleted_objects:
            membership_remove(membership=membership, by=request.user)


@admin.register(Membership)
class MembershipAdmin(RoleChoicesForManagers, TeamScopedAdmin, admin.ModelAdmin):
    list_display = ["user", "team", "role"]
    list_filter = ["role", "team"]
    search_fields = ["user__username", "team__slug"]
    manager_can_add = manager_can_delete = True

    def save_model(self, request, obj, form, change):
        if not self.manages(request, obj):
            raise PermissionDenied("you do not manage that team")
        if change and {"user", "team"} & set(form.changed_data):
            return super().save_model(request, obj, form, change)
        saved = membership_set(user=obj.user, team=obj.team, role=obj.role, by=request.user)
        obj.pk = saved.pk

    def delete_model(self, request, obj):
        if not self.manages(request, obj):
            raise PermissionDenied("you do not manage that team")
        membership_remove(membership=obj, by=request.user)

    def delete_queryset(self, request, queryset):
        for membership in queryset:
            self.delete_model(request, membership)


@admin.register(ApiToken)
class ApiTokenAdmin(SuperuserOnlyAdmin, admin.ModelAdmin):
    list_display = ["key_prefix", "name", "user", "created_at", "expires_at", "revoked_at", "last_used_at"]
    readonly_fields = ["key_hash", "key_prefix", "created_at", "last_used_at"]


@admin.register(AuditEntry)
class AuditEntryAdmin(TeamScopedAdmin, admin.ModelAdmin):
    """Read-only for everyone, superusers included: the log is append-only (the model refuses too).
    Managers see their teams' entries; user-level entries (tokens) only superusers."""

    list_display = ["created_at", "actor_name", "team", "action", "target_type", "target_id", "message"]
    list_filter = ["action", "team"]
    search_fields = ["actor_name", "message", "target_id"]
    manager_can_change = False

    def has_add_permission(self, request, *args):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
