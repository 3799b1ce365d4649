from django.contrib import admin, messages

from apps.core.admin_scoping import GuardedDeleteAdmin, SuperuserEditAdmin

from .models import GPU, Node
from .services import node_delete, node_delete_refusal


class GPUInline(SuperuserEditAdmin, admin.TabularInline):
    model = GPU
    extra = 0
    readonly_fields = ["index", "uuid", "model", "memory_mb", "memory_used_mb", "utilization", "simulated"]


# Nodes are shared by every team: managers may look, only admins drain or resume them.
@admin.register(Node)
class NodeAdmin(GuardedDeleteAdmin, SuperuserEditAdmin, admin.ModelAdmin):
    list_display = ["name", "state", "simulated", "cpu_count", "memory_mb", "last_heartbeat"]
    list_filter = ["state", "simulated"]
    inlines = [GPUInline]
    actions = ["drain", "resume"]

    # Deleting a live node, or one holding jobs, strands them (trial 14, F28): refused with the
    # reason, on its own delete page and in the bulk "delete selected" action alike.
    def delete_refusal(self, obj) -> str | None:
        return node_delete_refusal(obj)

    def delete_model(self, request, obj):
        node_delete(node=obj)

    def delete_queryset(self, request, queryset):
        for node in queryset:
            node_delete(node=node)

    @admin.action(description="Drain: run what they have, start nothing new", permissions=["change"])
    def drain(self, request, queryset):
        self.report(request, queryset, Node.State.ACTIVE, Node.State.DRAINING,
                    "draining: they run what they have and start nothing new")

    @admin.action(description="Resume: accept new jobs", permissions=["change"])
    def resume(self, request, queryset):
        self.report(request, queryset, Node.State.DRAINING, Node.State.ACTIVE, "active again: they accept new jobs")

    def report(self, request, queryset, from_state: str, to_state: str, what: str) -> None:
        """Move the selected nodes in ``from_state`` and say which moved and which did not (trial 14, F5:
        both actions said nothing)."""
        chosen = list(queryset.values_list("name", "state"))
        movable = [name for name, state in chosen if state == from_state]
        moved = queryset.filter(name__in=movable, state=from_state).update(state=to_state)
        if moved:
            self.message_user(request, f"{moved} node(s) {what} ({', '.join(movable)})", messages.SUCCESS)
        skipped = [f"{name} ({state})" for name, state in chosen if state != from_state]
        if skipped:
            self.message_user(request, f"not changed, not {from_state}: {', '.join(skipped)}", messages.WARNING)


@admin.register(GPU)
class GPUAdmin(SuperuserEditAdmin, admin.ModelAdmin):
    list_display = ["__str__", "memory_mb", "memory_used_mb", "utilization", "simulated"]
