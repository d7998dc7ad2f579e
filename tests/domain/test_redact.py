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


import pytest  # noqa: E402

from nodes.domain.redact import (  # noqa: E402
    MASK,
    all_tables,
    is_secret_name,
    mask_text,
    masked_lines,
    redact_args,
    redact_env,
    secret_values,
)


@pytest.mark.parametrize(
    "name",
    [
        "HF_TOKEN",
        "OPENAI_API_KEY",
        "OPENAI_KEY",
        "MY_PASSWD",
        "GOOGLE_APPLICATION_CREDENTIALS",
        "AWS_SECRET_ACCESS_KEY",
        "DB_PASSWORD",
        "SENTRY_DSN",
        "GITHUB_TOKEN_2",
        "apiKey",
        "PRIVATE_KEY_PATH",
        # strong words glued to others, plural last words
        "PGPASSWORD",
        "DBPASSWORD",
        "MYSECRET",
        "GH_TOKENS",
        "HF_TOKENS",
        "AWS_KEYS",
        "mysqlPassword",
    ],
)
def test_common_secret_names_are_secret(name):
    assert is_secret_name(name)
    assert redact_env({name: "value-1"}) == {name: MASK}


@pytest.mark.parametrize(
    "name",
    [
        "TOKENIZERS_PARALLELISM",
        "KEYFRAME_INTERVAL",
        "PWD",
        "CUDA_VISIBLE_DEVICES",
        "NCCL_SOCKET_IFNAME",
        "token_usage",
        "KEYFRAME_X",
        "TOKENIZER_MODE",
        "SSH_AUTH_SOCK",
    ],
)
def test_ordinary_settings_are_not_secret(name):
    assert not is_secret_name(name)
    assert redact_env({name: "value-1"}) == {name: "value-1"}


def test_a_password_inside_a_url_is_masked_and_known():
    env = {"DATABASE_URL": "postgres://rank:pw-4242x@db:5432/x"}
    assert redact_env(env) == {"DATABASE_URL": "postgres://rank:****@db:5432/x"}
    assert secret_values([], env) == ["pw-4242x"]


@pytest.mark.parametrize("table", all_tables(), ids=lambda t: t.version)
@pytest.mark.parametrize(
    "args",
    [
        ["--max-total-tokens", "100000"],
        ["--tokenizer-path", "/models/tok"],
        ["--skip-tokenizer-init", "--tp-size", "8"],
        ["--max-prefill-tokens=16384", "--ssl-keyfile", "/etc/k.pem"],
    ],
)
def test_flags_that_only_mention_tokens_or_keys_hide_nothing(table, args):
    command = ["--model-path", "/m", *args]
    assert redact_args(command, table) == command
    assert redact_args(command) == command  # every version's table
    assert secret_values(command, {}) == []


@pytest.mark.parametrize("table", all_tables(), ids=lambda t: t.version)
def test_secret_flags_come_from_the_table_with_argparse_abbreviations(table):
    args = ["--api-key", "k1", "--admin-api-key=k2", "--ssl-keyfile-password", "k3"]
    args += ["--api-k", "k4"]
    assert "k" not in " ".join(w for w in redact_args(args, table) if not w.startswith("--"))
    # A secret flag followed by another flag has no value to hide.
    assert redact_args(["--api-key", "--port", "1"], table) == ["--api-key", "--port", "1"]


def test_a_short_or_numeric_secret_is_masked_where_named_not_everywhere():
    secrets = secret_values(["--api-key", "100000", "--max-total-tokens", "100000"], {})
    assert secrets == ["100000"]
    log = (
        "server_args=ServerArgs(api_key='100000', max_total_tokens=100000)\n"
        "max_total_num_tokens=100000, chunked_prefill_size=8192\n"
        "launch_server --api-key 100000 --max-total-tokens 100000\n"
    )
    assert mask_text(log, secrets) == (
        "server_args=ServerArgs(api_key='****', max_total_tokens=100000)\n"
        "max_total_num_tokens=100000, chunked_prefill_size=8192\n"
        "launch_server --api-key **** --max-total-tokens 100000\n"
    )


def test_a_distinctive_secret_is_masked_wherever_it_appears():
    secrets = secret_values(["--api-key", "sk-live-4f9a"], {"OPENAI_KEY": "sk-openai-77"})
    line = "auth failed for sk-live-4f9a; upstream said sk-openai-77 is revoked"
    assert mask_text(line, secrets) == "auth failed for ****; upstream said **** is revoked"


def test_masking_a_streamed_log_cuts_lines_anywhere_and_keeps_other_bytes():
    raw = b"api_key='sk-live-4f9a' x\n\xff\xfe sk-live-4f9a\n"
    raw += b"max_total_num_tokens=100000\nHF_TOKEN=z9"
    for size in (1, 5, 4096):
        chunks = [raw[i : i + size] for i in range(0, len(raw), size)]
        assert b"".join(masked_lines(chunks, ["sk-live-4f9a"])) == (
            b"api_key='****' x\n\xff\xfe ****\nmax_total_num_tokens=100000\nHF_TOKEN=****"
        )


def test_a_document_is_masked_string_by_string_and_stays_json():
    import json

    from nodes.domain.redact import mask_doc

    doc = {"messages": ['unrecognized arguments: api_key="sk-live-4f9a"', 3], "n": 100000}
    shown = mask_doc(doc, ["sk-live-4f9a", "100000"])
    assert json.loads(json.dumps(shown)) == {
        "messages": ['unrecognized arguments: api_key="****"', 3],
        "n": 100000,
    }


def test_after_a_bare_colon_only_words_that_are_always_secret_count():
    line = "#new-token: 512, #token: 1234, password: hunter2, secret_key: abc"
    assert mask_text(line, []) == "#new-token: 512, #token: 1234, password: ****, secret_key: ****"


def test_a_count_named_like_tokens_or_keys_keeps_its_number():
    # *_TOKENS is secret by name (GH_TOKENS), but a plain number under it is a count: the log
    # parser reads max_total_num_tokens=100000, and masking it would corrupt the stored log.
    counts = {"MAX_TOKENS": "4096", "max_total_num_tokens": "100000", "NUM_KEYS": "3"}
    assert redact_env(counts) == counts
    assert secret_values([], counts) == []
    assert redact_env({"GH_TOKENS": "ghp_a1,ghp_b2"}) == {"GH_TOKENS": MASK}
    assert redact_env({"MY_PASSWORDS": "1234"}) == {"MY_PASSWORDS": MASK}  # a PIN is a secret
    line = "max_total_num_tokens=100000, num_keys=3, GH_TOKENS=ghp_a1 --max-tokens 512"
    assert mask_text(line, []) == (
        "max_total_num_tokens=100000, num_keys=3, GH_TOKENS=**** --max-tokens 512"
    )
    assert redact_args(["--my-tokens", "12", "--my-tokens=ab12"]) == [
        "--my-tokens", "12", f"--my-tokens={MASK}"
    ]  # fmt: skip


SECRET_VALUES = [
    ("--hicache-storage-backend-extra-config", '{"secret_key":"s3-k3y-x9"}', "s3-k3y-x9"),
    ("--model-loader-extra-config", '{"password": "hunter2-pw"}', "hunter2-pw"),
    ("--tool-server", "http://user:pw-tool-77@tools.local:9000", "pw-tool-77"),
    ("--otlp-traces-endpoint", "http://u:pw-otlp-88@collector:4317", "pw-otlp-88"),
    ("--tool-server", "http://tools.local/mcp?token=tk-91x&x=1", "tk-91x"),
]


@pytest.mark.parametrize(("flag", "value", "secret"), SECRET_VALUES)
def test_secrets_inside_flag_values_are_masked_and_known(flag, value, secret):
    args = ["--model-path", "/m", flag, value, "--port", "30000"]
    shown = redact_args(args)
    assert secret not in " ".join(shown) and MASK in shown[3]
    assert shown[:3] == args[:3] and shown[4:] == args[4:]
    assert shown[3].replace(MASK, secret) == value  # only the secret is hidden
    assert secret_values(args, {}) == [secret]
    assert mask_text(f"server_args={value!r} then {secret} again", [secret]).count(secret) == 0


def test_numbers_inside_flag_values_are_left_alone():
    args = [
        "--json-model-override-args", '{"max_tokens": 100, "num_key_value_heads": 8}',
        "--max-total-tokens", "100000", "--model-path", "/m",
    ]  # fmt: skip
    assert redact_args(args) == args
    assert secret_values(args, {}) == []


def test_env_values_that_spell_out_a_secret_are_masked_inside():
    env = {"LOADER_CONFIG": '{"password": "hunter2-pw", "retries": 3}'}
    assert redact_env(env) == {"LOADER_CONFIG": '{"password": "****", "retries": 3}'}
    assert secret_values([], env) == ["hunter2-pw"]


def test_a_revision_diff_masks_secrets_inside_changed_values():
    from nodes.domain.revision_diff import diff
    from nodes.flag_tables import table

    a = ["--model-path", "/m", "--tool-server", "http://u:pw-old-1@h:9"]
    b = ["--model-path", "/m", "--tool-server", "http://u:pw-new-2@h:9", "--api-key", "k-9x"]
    changes = {c.name: c for c in diff(a, b, table("0.5.9"), {"PGPASSWORD": "p"}, {})}
    shown = repr(list(changes.values()))
    assert "pw-old-1" not in shown and "pw-new-2" not in shown and "k-9x" not in shown
    assert changes["--tool-server"].after == "http://u:****@h:9"
    assert changes["env PGPASSWORD"].before == MASK


def test_url_passwords_without_a_user_name_and_short_password_names_are_secret():
    from nodes.domain.redact import redact_args, redact_env

    env = redact_env(
        {"REDIS_URL": "redis://:redispwQ7@h:6379/0", "MY_PW": "hunter22", "X_SIG": "a"}
    )
    assert env == {"REDIS_URL": "redis://:****@h:6379/0", "MY_PW": "****", "X_SIG": "****"}
    shown = redact_args(["--tool-server", "http://:toolpw9@h", "--port", "30000"])
    assert shown == ["--tool-server", "http://:****@h", "--port", "30000"]
    assert redact_env({"LOG_PATH": "/tmp/a:b@c"}) == {"LOG_PATH": "/tmp/a:b@c"}  # no scheme


@pytest.mark.parametrize(
    "secret",
    [
        "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA\n-----END RSA PRIVATE KEY-----",
        "ghp_" + "A1" * 18,
        "github_pat_11ABCDEFG0" + "x" * 40,
        "eyJhbGciOiJSUzI1NiJ9.eyJpc3MiOiJrOHMifQ.TWFueSBoYW5kcyBtYWtlIGxpZ2h0",
        "https://hooks.slack.com/services/T00000000/B00000000/XXXXXXXXXXXXXXXXXXXXXXXX",
        "xoxb-1234567890-abcdefghij",
        "hf_" + "aB3" * 11,
        "sk-proj-" + "Q7" * 12,
        "AKIAIOSFODNN7EXAMPLE",
    ],
)
def test_a_secret_known_by_its_value_is_masked_whatever_it_is_called(secret):
    assert redact_env({"SOMETHING_ELSE": secret}) == {"SOMETHING_ELSE": "****"}
    assert mask_text(f"connecting with {secret} now", []) == "connecting with **** now"
    assert secret in secret_values([], {"SOMETHING_ELSE": secret})


@pytest.mark.parametrize(
    "ordinary",
    [
        "task-0123456789abcdefghijklmno",
        "/models/hf_cache/Qwen2.5-7B",
        "BEGIN of batch",
        "eyJustAWord",
        "mask-abcdefghijklmnopqrstuvwxyz",
    ],
)
def test_ordinary_values_that_share_a_prefix_stay(ordinary):
    assert redact_env({"SOMETHING_ELSE": ordinary}) == {"SOMETHING_ELSE": ordinary}
    assert mask_text(ordinary, []) == ordinary
