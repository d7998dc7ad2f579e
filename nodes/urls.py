from __future__ import annotations

from django.urls import path

from nodes import (
    calibration_views,
    cleanup_views,
    launch_views,
    profile_views,
    token_views,
    views,
)

app_name = "nodes"

urlpatterns = [
    path("", views.node_list, name="node-list"),
    path("nodes/new/", views.node_create, name="node-create"),
    path("nodes/<int:pk>/", views.node_detail, name="node-detail"),
    path("nodes/<int:pk>/edit/", views.node_edit, name="node-edit"),
    path("nodes/<int:pk>/delete/", views.node_delete, name="node-delete"),
    path("nodes/<int:pk>/live/", views.node_live, name="node-live"),
    path("nodes/<int:pk>/discover/", views.node_discover, name="node-discover"),
    path("nodes/<int:pk>/host-key/fetch/", views.node_fetch_host_key, name="node-fetch-host-key"),
    path("nodes/<int:pk>/host-key/trust/", views.node_trust_host_key, name="node-trust-host-key"),
    path("nodes/<int:pk>/maintenance/", views.node_maintenance, name="node-maintenance"),
    path("ssh-keys/", views.credential_list, name="credential-list"),
    path("ssh-keys/new/", views.credential_create, name="credential-create"),
    path("ssh-keys/<int:pk>/delete/", views.credential_delete, name="credential-delete"),
    path("launch-profiles/", profile_views.profile_list, name="profile-list"),
    path("launch-profiles/new/", profile_views.profile_create, name="profile-create"),
    path("launch-profiles/check/", profile_views.profile_check, name="profile-check"),
    path("launch-profiles/<int:pk>/", profile_views.profile_detail, name="profile-detail"),
    path("launch-profiles/<int:pk>/edit/", profile_views.profile_edit, name="profile-edit"),
    path("launch-profiles/<int:pk>/clone/", profile_views.profile_clone, name="profile-clone"),
    path(
        "launch-profiles/<int:pk>/ownership/",
        profile_views.profile_ownership,
        name="profile-ownership",
    ),
    path("launch-profiles/<int:pk>/diff/", profile_views.profile_diff, name="profile-diff"),
    path(
        "launch-profiles/<int:pk>/calibrate/",
        calibration_views.profile_calibrate,
        name="profile-calibrate",
    ),
    path(
        "launch-profiles/<int:pk>/revisions/<int:number>/revert/",
        profile_views.profile_revert,
        name="profile-revert",
    ),
    path("launches/", launch_views.launch_list, name="launch-list"),
    path("launches/new/", launch_views.launch_create, name="launch-create"),
    path("launches/<int:pk>/", launch_views.launch_detail, name="launch-detail"),
    path("launches/<int:pk>/stop/", launch_views.launch_stop, name="launch-stop"),
    path("launches/<int:pk>/lines/", launch_views.launch_lines, name="launch-lines"),
    path("launches/<int:pk>/events/", launch_views.launch_events, name="launch-events"),
    path("launches/<int:pk>/log/", launch_views.launch_log, name="launch-log"),
    path("launches/<int:pk>/bundle/", launch_views.launch_bundle, name="launch-bundle"),
    path("launches/<int:pk>/apply-fix/", launch_views.launch_apply_fix, name="launch-apply-fix"),
    path("diagnose/", launch_views.bundle_diagnose, name="bundle-diagnose"),
    path("diagnose/<uuid:pk>/", launch_views.bundle_diagnosis, name="bundle-diagnosis"),
    path("nodes/<int:pk>/gpus/", cleanup_views.node_gpus, name="node-gpus"),
    path("nodes/<int:pk>/cleanup/", cleanup_views.node_cleanup, name="node-cleanup"),
    path("cleanups/<int:pk>/", cleanup_views.cleanup_detail, name="cleanup-detail"),
    path("audit/", views.audit_list, name="audit-list"),
    path("account/tokens/", token_views.token_list, name="token-list"),
    path("account/tokens/<int:pk>/revoke/", token_views.token_revoke, name="token-revoke"),
]
