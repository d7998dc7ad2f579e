from __future__ import annotations

from django.urls import path

from nodes import views

app_name = "nodes"

urlpatterns = [
    path("", views.node_list, name="node-list"),
    path("nodes/new/", views.node_create, name="node-create"),
    path("nodes/<int:pk>/", views.node_detail, name="node-detail"),
    path("nodes/<int:pk>/edit/", views.node_edit, name="node-edit"),
    path("nodes/<int:pk>/delete/", views.node_delete, name="node-delete"),
    path("audit/", views.audit_list, name="audit-list"),
]
