import json

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.models import LogEntry
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import GroupAdmin, UserAdmin
from django.contrib.auth.models import Group
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.http import HttpResponseRedirect
from django.urls import reverse

from apps.core.admin_scoping import (
    ChangeRefused,
    DeleteRefused,
    GuardedDeleteAdmin,
    RefusableChangeAdmin,
    SelectionChecked,
    SuperuserOnlyAdmin,
    TeamScopedAdmin,
    TeamScopedInline,
)
from apps.core.errors import FieldErrors

from .models import ApiToken, AuditEntry, Membership, Team
from .services import (
    MANAGING_ROLES,
    last_manager_error,
    last_managers_error,
    membership_remove,
    membership_remove_preview,
    membership_set,
    team_delete_refusal,
    team_managers_lock,
    user_deactivated,
)

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


class MembershipForm(forms.ModelForm):
    """Refuses, on its role field, a change that would leave the team without a manager."""

    def clean(self):
        cleaned = super().clean()
        if self.instance.pk is not None and "role" in cleaned:
            moved = bool({"user", "team"} & set(self.changed_data))  # the old team loses this member
            refused = last_manager_error(membership=self.instance, role=None if moved else cleaned["role"])
            if refused:
                self.add_error("role", refused)
            elif moved and (said := self._left_behind()):
                # A move takes the member out of the old team: what they leave there is what a removal
                # asks about first. It was saved as a plain row change: their queued jobs stayed queued
                # in a team they no longer saw, charged to it (managers' admin week, trial30b).
                field = "team" if "team" in self.changed_data else "user"
                self.add_error(field, f"{' '.join(said)} Moving is removing from the old team: remove them from "
                                      "it in Memberships (which asks first) and add the new membership, or cancel "
                                      "those jobs before.")
        return cleaned

    def _left_behind(self) -> list[str]:
        old = Membership.objects.filter(pk=self.instance.pk).select_related("user", "team").first()
        return membership_remove_preview(membership=old) if old is not None else []


def staying_user_ids(formset) -> set[int]:
    """The users on the team page's rows that are kept (not ticked "Delete?"), as the save leaves them.

    A deleted or replaced row's member who is one of them is no removal: two rows' users swapped, or
    a row given the user of a row deleted in the same save. Both were removed (review32): the swap's
    two members (queued jobs cancelled), "changed successfully"; a 500 where one was the last manager."""
    return {form.cleaned_data["user"].pk for form in formset.forms
            if form.cleaned_data.get("user") is not None
            and not (formset.can_delete and formset._should_delete_form(form))}


class MembershipFormSet(forms.BaseInlineFormSet):
    """The team page's members, saved together: one may be demoted while another is promoted,
    but the team must keep an active manager (trial 14, F13)."""

    def clean(self):
        super().clean()
        if self.instance.pk is None or any(self.errors):
            return
        deleted = [f for f in self.forms if self.can_delete and self._should_delete_form(f)]
        # A row whose user is changed replaces that member: their removal too (save_formset), asked
        # about as a deletion is. It was a plain save: the new user added, the old one kept (review31).
        replaced = [f for f in self.forms if f not in deleted and f.instance.pk and "user" in f.changed_data]
        kept = [f for f in self.forms if f not in deleted and f.cleaned_data]
        staying = staying_user_ids(self)
        # A member with active jobs is removed where the removal asks first (what it cancels):
        # ticking "Delete?" here cancelled three queued jobs with no question (manager trial 15, F2).
        for form in [*deleted, *replaced]:
            old = Membership.objects.filter(pk=form.instance.pk).select_related("user", "team").first()
            if old is not None and old.user_id not in staying and (said := membership_remove_preview(membership=old)):
                raise ValidationError(f"{' '.join(said)} Remove {old.user.get_username()} from "
                                      "Memberships, which asks first, or cancel those jobs before.")
        if any(f.cleaned_data.get("role") in MANAGING_ROLES and getattr(f.cleaned_data.get("user"), "is_active", False)
               for f in kept):
            return
        for form in [*kept, *deleted]:
            refused = form.instance.pk and last_manager_error(
                membership=form.instance, role=None if form in deleted else form.cleaned_data.get("role"))
            if refused and form in deleted:
                raise ValidationError(f"role: {refused}")
            if refused:
                form.add_error("role", refused)


class MembershipInline(RoleChoicesForManagers, TeamScopedInline, admin.TabularInline):
    model = Membership
    formset = MembershipFormSet  # checks the rows together (not MembershipForm: each row alone)
    extra = 0
    manager_can_add = manager_can_delete = True


@admin.register(Team)
class TeamAdmin(GuardedDeleteAdmin, TeamScopedAdmin, admin.ModelAdmin):
    list_display = ["slug", "name", "shares", "members"]
    search_fields = ["slug", "name"]
    inlines = [MembershipInline]
    team_field = "pk"
    # The fair-share weight decides everyone's priority, the storage quota is a share of the
    # pool's disk (like the GPU quotas, superuser-only): only admins change them.
    superuser_only_fields = ("slug", "shares", "storage_quota_gb")

    def delete_refusal(self, team: Team) -> str | None:
        # A team that owns datasets or model versions keeps them and itself: the cascade left
        # their files in storage, orphaned (left31). Its jobs Django lists itself (PROTECT).
        return team_delete_refusal(team)

    @admin.display(description="members")
    def members(self, team: Team) -> int:
        return team.memberships.count()

    def response_change(self, request, obj):
        # A manager who handed the team over in this save (someone else manager, themself member)
        # may no longer open its list: Django's redirect there was a bare 403 (manager trial 15, F25).
        request._managed_team_ids = None
        if not self.manages(request, obj):
            self.message_user(request, f"saved; you no longer manage {obj.slug}", messages.INFO)
            return HttpResponseRedirect(reverse("admin:index") if self.admin_site.get_app_list(request) else "/")
        return super().response_change(request, obj)

    def save_formset(self, request, form, formset, change):
        if formset.model is not Membership:
            return super().save_formset(request, form, formset, change)
        # Through the service, so role changes are audited.
        # Managers made first, so a hand-over (one promoted, another demoted) never leaves the
        # team without one in between (membership_set refuses that).
        changed = sorted(formset.save(commit=False), key=lambda m: m.role not in MANAGING_ROLES)
        # A row given another user is the old member's removal (after the additions: a manager
        # replaced by a manager leaves the team one in between), as MembershipAdmin's move (review31).
        # Read with a filter: another admin may have removed that member since the form's checks (it was a
        # DoesNotExist, a 500); they are gone already. A member still on a kept row stays (staying_user_ids).
        staying = staying_user_ids(formset)
        replaced = [old for membership, fields in formset.changed_objects if "user" in fields
                    if (old := Membership.objects.select_related("user", "team").filter(pk=membership.pk).first())]
        for membership in changed:
            saved = membership_set(user=membership.user, team=form.instance, role=membership.role, by=request.user)
            membership.pk = saved.pk  # the form's row is the one saved (the admin audit reads it back)
        for membership in [*replaced, *formset.deleted_objects]:
            if membership.user_id in staying:
                continue
            for said in membership_remove(membership=membership, by=request.user):
                self.message_user(request, said, messages.WARNING)


@admin.register(Membership)
class MembershipAdmin(GuardedDeleteAdmin, RoleChoicesForManagers, TeamScopedAdmin, RefusableChangeAdmin,
                      admin.ModelAdmin):
    list_display = ["user", "team", "role"]
    list_filter = ["role", "team"]
    search_fields = ["user__username", "team__slug"]
    manager_can_add = manager_can_delete = True
    form = MembershipForm

    def save_model(self, request, obj, form, change):
        if not self.manages(request, obj):
            raise PermissionDenied("you do not manage that team")
        if change and {"user", "team"} & set(form.changed_data):
            # A move is a removal from the old team and an addition to the new one, through the
            # services as each is alone: audited (membership.remove, role.change), the old team's
            # open job sockets of the member closed, a new manager made staff. It was a plain row
            # save (trial30b). The form refused it if the member leaves active jobs behind.
            # The row is read again, locked: another admin may have removed it since the form's checks
            # (a DoesNotExist, a 500), or made it the team's last manager (membership_remove refuses).
            # The teams' managers' locks first (both teams, by id), then the row: the order every removal
            # takes them (team_managers_lock). The row first, a removal in the same team beside it held
            # the managers' rows below it and waited on this one, which waited on them: a deadlock on
            # PostgreSQL, one of the two a 500 (review32).
            with transaction.atomic():
                old_team_id = Membership.objects.filter(pk=obj.pk).values_list("team_id", flat=True).first()
                for team_id in sorted({old_team_id or obj.team_id, obj.team_id}):
                    team_managers_lock(team_id)
                old = Membership.objects.select_for_update().select_related("user", "team").filter(pk=obj.pk).first()
                if old is None:
                    raise ChangeRefused(f"nothing moved: this membership was removed meanwhile (by another admin "
                                        f"or a service); add {obj.user.get_username()} to {obj.team.slug} instead")
                try:
                    for said in membership_remove(membership=old, by=request.user):
                        self.message_user(request, said, messages.WARNING)
                    saved = membership_set(user=obj.user, team=obj.team, role=obj.role, by=request.user)
                except FieldErrors as exc:
                    raise ChangeRefused(f"nothing moved: {exc}") from None
            obj.pk = saved.pk
            return None
        saved = membership_set(user=obj.user, team=obj.team, role=obj.role, by=request.user)
        obj.pk = saved.pk

    def delete_model(self, request, obj):
        if not self.manages(request, obj):
            raise PermissionDenied("you do not manage that team")
        try:
            said = membership_remove(membership=obj, by=request.user)
        except FieldErrors as exc:  # made the last manager meanwhile (read under the lock): was a 500
            raise DeleteRefused("; ".join(exc.errors.values())) from None
        for sentence in said:
            self.message_user(request, sentence, messages.WARNING)

    def delete_queryset(self, request, queryset):
        for membership in queryset:
            self.delete_model(request, membership)

    def get_deleted_objects(self, objs, request):
        # The confirmation (one row's delete page, or "delete selected") says what else the
        # removal does: the member's queued jobs in the team are cancelled (trial 14, F40).
        # Only while asking: the delete itself says what it did (manager trial 15, F3).
        if self.delete_is_asking(request):
            for membership in objs:
                for said in membership_remove_preview(membership=membership):
                    self.message_user(request, said, messages.WARNING)
        deleted, counts, perms_needed, protected = super().get_deleted_objects(objs, request)
        # Each alone passed delete_refusal: two managers of a team selected together (review31).
        return deleted, counts, perms_needed, [*protected, *last_managers_error(memberships=objs)]

    @staticmethod
    def delete_is_asking(request) -> bool:
        """True for the confirmation, False for the delete: Django's delete page deletes on any
        POST (its form's ``post=yes`` is not needed), "delete selected" on a POST with ``post``."""
        if "_selected_action" in request.POST:
            return not request.POST.get("post")
        return not request.POST

    # The last manager is not removed (trial 14, F13): refused with whom to make manager first,
    # on the delete page and in the bulk action alike (GuardedDeleteAdmin).
    refused_words = "not removed"

    def delete_refusal(self, obj) -> str | None:
        return last_manager_error(membership=obj) or None

    def response_change(self, request, obj):
        # A manager who made themselves a member may no longer see this list: say so, and
        # go to the portal instead of a bare 403.
        request._managed_team_ids = None
        if not self.manages(request, obj):
            self.message_user(request, f"you are no longer a manager of {obj.team.slug}", messages.INFO)
            return HttpResponseRedirect("/")
        return super().response_change(request, obj)

    def response_delete(self, request, obj_display, obj_id):
        request._managed_team_ids = None  # as above, for one who removed themselves
        if not self.manages(request):
            self.message_user(request, f"removed {obj_display}; you manage no team any more", messages.INFO)
            return HttpResponseRedirect("/")
        return super().response_delete(request, obj_display, obj_id)


@admin.register(ApiToken)
class ApiTokenAdmin(SuperuserOnlyAdmin, admin.ModelAdmin):
    list_display = ["key_prefix", "name", "user", "created_at", "expires_at", "revoked_at", "last_used_at"]
    readonly_fields = ["key_hash", "key_prefix", "created_at", "last_used_at"]


@admin.register(AuditEntry)
class AuditEntryAdmin(TeamScopedAdmin, admin.ModelAdmin):
    """Read-only for everyone, superusers included: the log is append-only (the model refuses too).
    Managers see their teams' entries; user-level entries (tokens) only superusers."""

    list_display = ["created_at", "actor_name", "team", "action", "target_type", "target_id", "message"]
    list_select_related = ["team"]  # nullable: Django's own select_related skips it (a query a row, trial30b)
    list_filter = ["action", "team"]
    search_fields = ["actor_name", "message", "target_id"]
    manager_can_change = False

    def has_add_permission(self, request, *args):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class DeactivatingUserAdmin(GuardedDeleteAdmin, SelectionChecked, UserAdmin):
    """Django's user admin; deactivating an account also deals with what it leaves behind
    (:func:`apps.accounts.services.user_deactivated`): its queued jobs would still run, charged
    to its teams, and a team could be left with no active manager (manager trial F40).

    Deleting the last active manager of a team is refused, naming whom to make manager first, as
    removing their membership is: the delete took the membership with it, unguarded, and the team
    was left with nobody to manage it, "deleted successfully" (managers' admin week, trial30b).
    An account with jobs is not deleted either (Job.user is PROTECT: Django lists them)."""

    def delete_refusal(self, user) -> str | None:
        refusals = [refused for membership in Membership.objects.filter(user=user).select_related("user", "team")
                    if (refused := last_manager_error(membership=membership))]
        return "; ".join(refusals) or None

    def delete_model(self, request, obj):
        with transaction.atomic():
            self.managers_locked_check([obj.pk])
            super().delete_model(request, obj)

    def delete_queryset(self, request, queryset):
        with transaction.atomic():
            self.managers_locked_check(list(queryset.values_list("pk", flat=True)))
            super().delete_queryset(request, queryset)

    @staticmethod
    def managers_locked_check(user_ids: list[int]) -> None:
        """Lock the managers of every team these accounts are in (team_managers_lock, by team id), then
        check again what the confirmation checked: the delete takes their memberships with it, a removal
        as membership_remove's. Unlocked, an account's delete and the removal of the team's other manager
        at the same moment each read the other still there, and both went (review32)."""
        memberships = Membership.objects.filter(user__in=user_ids)
        for team_id in sorted(set(memberships.values_list("team_id", flat=True))):
            team_managers_lock(team_id)
        refusals = [refused for membership in memberships.select_related("user", "team")
                    if (refused := last_manager_error(membership=membership))]
        if refusals := refusals or last_managers_error(memberships=memberships):
            raise DeleteRefused("; ".join(refusals))

    def get_deleted_objects(self, objs, request):
        # Each account alone passed: two managers of a team selected together (review31).
        deleted, counts, perms_needed, protected = super().get_deleted_objects(objs, request)
        memberships = Membership.objects.filter(user__in=[user.pk for user in objs])
        return deleted, counts, perms_needed, [*protected, *last_managers_error(memberships=memberships)]

    # The account's history, not settings: the form sent them back without their microseconds,
    # so every save "changed" both (manager trial 15, F6).
    readonly_fields = ("last_login", "date_joined")

    def save_model(self, request, obj, form, change):
        was_active = change and type(obj)._base_manager.filter(pk=obj.pk, is_active=True).exists()
        super().save_model(request, obj, form, change)
        if was_active and not obj.is_active:
            for said in user_deactivated(user=obj, by=request.user):
                self.message_user(request, said, messages.WARNING)

    def construct_change_message(self, request, form, formsets, add=False):
        # History said "Changed Active." for a deactivation and a reactivation alike (manager
        # trial 15, F6): say which. A LogEntry shows a plain-text message as it is.
        message = super().construct_change_message(request, form, formsets, add)
        if add or "is_active" not in form.changed_data:
            return message
        label = str(form.fields["is_active"].label)
        for part in message:
            if "changed" in part:
                part["changed"]["fields"] = [f for f in part["changed"]["fields"] if f != label]
        rest = [p for p in message if p.get("changed", {}).get("fields", True)]
        said = "Reactivated." if form.instance.is_active else "Deactivated."
        return f"{said} {LogEntry(change_message=json.dumps(rest)).get_change_message()}" if rest else said


if admin.site.is_registered(get_user_model()):
    admin.site.unregister(get_user_model())
admin.site.register(get_user_model(), DeactivatingUserAdmin)



class CheckedGroupAdmin(SelectionChecked, GroupAdmin):
    """Django's group admin, with an action's selection checked as every admin of ours (trial28 F7)."""


if admin.site.is_registered(Group):
    admin.site.unregister(Group)
admin.site.register(Group, CheckedGroupAdmin)
