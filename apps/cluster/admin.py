from django.contrib import admin

from apps.core.admin_scoping import SuperuserEditAdmin

from .models import GPU, Node


class GPUInline(SuperuserEditAdmin, admin.TabularInline):
    model = GPU
    extra = 0
    readonly_fields = ["index", "uuid", "model", "memory_mb", "memory_used_mb", "utilization", "simulated"]


# Nodes are shared by every team: managers may look, only admins drain or resume them.
@admin.register(Node)
class NodeAdmin(SuperuserEditAdmin, admin.ModelAdmin):
    list_display = ["name", "state", "simulated", "cpu_count", "memory_mb", "last_heartbeat"]
    list_filter = ["state", "simulated"]
    inlines = [GPUInline]
    actions = ["drain", "resume"]

    @admin.action(description="Drain: run what they have, start nothing new", permissions=["change"])
    def drain(self, request, queryset):
        queryset.filter(state=Node.State.ACTIVE).update(state=Node.State.DRAINING)

    @admin.action(description="Resume: accept new jobs", permissions=["change"])
    def resume(self, request, queryset):
        queryset.filter(state=Node.State.DRAINING).update(state=Node.State.ACTIVE)


@admin.register(GPU)
class GPUAdmin(SuperuserEditAdmin, admin.ModelAdmin):
    list_display = ["__str__", "memory_mb", "memory_used_mb", "utilization", "simulated"]
