from __future__ import annotations


def test_secrets_a_foreign_log_spells_out_are_masked_without_knowing_them():
    from nodes.domain.redact import mask_assignments

    line = "export HF_TOKEN=hf_abc123; python3 -m sglang.launch_server --api-key sk-x --port 1"
    assert mask_assignments(line) == (
        "export HF_TOKEN=****; python3 -m sglang.launch_server --api-key **** --port 1"
    )
    assert mask_assignments("--ssl-keyfile-password=pw1 ok") == "--ssl-keyfile-password=**** ok"
    assert (
        mask_assignments("Allocating 300.00 GB host memory") == "Allocating 300.00 GB host memory"
    )
