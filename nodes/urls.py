from __future__ import annotations

from django.urls import path

from nodes.views import (
    accounts,
    calibrations,
    cleanups,
    exchange,
    inventory,
    launch_log,
    launches,
    metrics,
    profiles,
)

app_name = "nodes"

urlpatterns = [
    path("", inventory.node_list, name="node-list"),
    path("fleet/", inventory.fleet_page, name="fleet"),
    path("nodes/new/", inventory.node_create, name="node-create"),
    path("nodes/<int:pk>/", inventory.node_detail, name="node-detail"),
    path("nodes/<int:pk>/edit/", inventory.node_edit, name="node-edit"),
    path("nodes/<int:pk>/delete/", inventory.node_delete, name="node-delete"),
    path("nodes/<int:pk>/live/", inventory.node_live, name="node-live"),
    path("nodes/<int:pk>/discover/", inventory.node_discover, name="node-discover"),
    path(
        "nodes/<int:pk>/host-key/fetch/", inventory.node_fetch_host_key, name="node-fetch-host-key"
    ),
    path(
        "nodes/<int:pk>/host-key/trust/", inventory.node_trust_host_key, name="node-trust-host-key"
    ),
    path("nodes/<int:pk>/maintenance/", inventory.node_maintenance, name="node-maintenance"),
    path("ssh-keys/", inventory.credential_list, name="credential-list"),
    path("ssh-keys/new/", inventory.credential_create, name="credential-create"),
    path("ssh-keys/<int:pk>/delete/", inventory.credential_delete, name="credential-delete"),
    path("metrics", metrics.metrics, name="metrics"),
    path("launch-profiles/", profiles.profile_list, name="profile-list"),
    path("launch-profiles/new/", profiles.profile_create, name="profile-create"),
    path("launch-profiles/export/", exchange.profiles_export, name="profiles-export"),
    path("launch-profiles/import/", exchange.profiles_import, name="profiles-import"),
    path("launch-profiles/check/", profiles.profile_check, name="profile-check"),
    path("launch-profiles/<int:pk>/", profiles.profile_detail, name="profile-detail"),
    path("launch-profiles/<int:pk>/edit/", profiles.profile_edit, name="profile-edit"),
    path("launch-profiles/<int:pk>/clone/", profiles.profile_clone, name="profile-clone"),
    path(
        "launch-profiles/<int:pk>/ownership/",
        profiles.profile_ownership,
        name="profile-ownership",
    ),
    path("launch-profiles/<int:pk>/diff/", profiles.profile_diff, name="profile-diff"),
    path(
        "launch-profiles/<int:pk>/calibrate/",
        calibrations.profile_calibrate,
        name="profile-calibrate",
    ),
    path(
        "calibrations/<int:pk>/promote/",
        calibrations.calibration_promote,
        name="calibration-promote",
    ),
    path(
        "launch-profiles/<int:pk>/revisions/<int:number>/revert/",
        profiles.profile_revert,
        name="profile-revert",
    ),
    path(
        "launch-profiles/<int:pk>/revisions/<int:number>/save-as-profile/",
        profiles.profile_promote,
        name="profile-promote",
    ),
    path("launches/", launches.launch_list, name="launch-list"),
    path("launches/new/", launches.launch_create, name="launch-create"),
    path("launches/<int:pk>/", launches.launch_detail, name="launch-detail"),
    path("launches/<int:pk>/stop/", launches.launch_stop, name="launch-stop"),
    path("launches/<int:pk>/save-as-profile/", launches.launch_promote, name="launch-promote"),
    path("launches/<int:pk>/capacity/", launches.launch_capacity, name="launch-capacity"),
    path(
        "launches/<int:pk>/capacity/apply/",
        launches.launch_capacity_apply,
        name="launch-capacity-apply",
    ),
    path(
        "launches/<int:pk>/test-request/", launches.launch_test_request, name="launch-test-request"
    ),
    path("launches/<int:pk>/lines/", launch_log.launch_lines, name="launch-lines"),
    path("launches/<int:pk>/search/", launch_log.launch_search, name="launch-search"),
    path("launches/<int:pk>/events/", launch_log.launch_events, name="launch-events"),
    path("launches/<int:pk>/log/", launch_log.launch_log, name="launch-log"),
    path("launches/<int:pk>/bundle/", launches.launch_bundle, name="launch-bundle"),
    path("launches/<int:pk>/apply-fix/", launches.launch_apply_fix, name="launch-apply-fix"),
    path("diagnose/", launches.bundle_diagnose, name="bundle-diagnose"),
    path("diagnose/<uuid:pk>/", launches.bundle_diagnosis, name="bundle-diagnosis"),
    path("nodes/<int:pk>/gpus/", cleanups.node_gpus, name="node-gpus"),
    path("nodes/<int:pk>/cleanup/", cleanups.node_cleanup, name="node-cleanup"),
    path("cleanups/<int:pk>/", cleanups.cleanup_detail, name="cleanup-detail"),
    path("audit/", accounts.audit_list, name="audit-list"),
    path("account/tokens/", accounts.token_list, name="token-list"),
    path("account/tokens/<int:pk>/revoke/", accounts.token_revoke, name="token-revoke"),
]
