"""Effective settings and load figures from a server's own answers (sglang.md §5)."""

from __future__ import annotations

import json

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from nodes.domain.redact import mask_text, secret_values
from nodes.domain.server_metrics import ServerInfoError, effective_settings, summarise_metrics


def test_effective_settings_keep_what_the_panel_shows():
    body = json.dumps(
        {
            "tp_size": 8,
            "hicache_size": 37,
            "mem_fraction_static": 0.85,
            "api_key": "sk-secret",
            "internal_states": [
                {"max_total_num_tokens": 271502, "memory_usage": {"weight": 63.3, "kvcache": 17.8}}
            ],
            "version": "0.5.9",
        }
    ).encode()
    settings = effective_settings(body)
    assert settings["tp_size"] == 8 and settings["hicache_size"] == 37
    assert settings["max_total_num_tokens"] == 271502
    assert settings["memory_usage"]["kvcache"] == 17.8
    assert "api_key" not in settings


@pytest.mark.parametrize("body", [b"not json", b"[1, 2]"])
def test_a_broken_answer_is_an_error(body):
    with pytest.raises(ServerInfoError):
        effective_settings(body)


def test_metrics_take_rank_zero_for_requests_and_the_fullest_rank_for_token_usage():
    text = "\n".join(
        [
            "# TYPE sglang:token_usage gauge",
            'sglang:token_usage{model_name="m",tp_rank="0",pp_rank="0"} 0.25',
            'sglang:token_usage{model_name="m",tp_rank="1",pp_rank="0"} 0.5',
            'sglang:num_running_reqs{model_name="m",tp_rank="0",pp_rank="0"} 3.0',
            'sglang:num_running_reqs{model_name="m",tp_rank="1",pp_rank="0"} 3.0',
            'sglang:num_queue_reqs{model_name="m",tp_rank="0",pp_rank="0"} 1.0',
            'sglang:gen_throughput{model_name="m",tp_rank="0",pp_rank="0"} 812.5',
            "other_metric 7",
        ]
    )
    assert summarise_metrics(text) == {
        "token_usage": 0.5,
        "num_running_reqs": 3.0,
        "num_queue_reqs": 1.0,
        "gen_throughput": 812.5,
    }


@pytest.mark.parametrize(
    "text", ["", "not metrics at all", "{{{", "\x00\ufffd", 'sglang:token_usage{tp_rank="0" 0.5']
)
def test_text_that_is_not_metrics_gives_no_figures(text):
    assert summarise_metrics(text) == {}


def test_a_malformed_line_costs_only_itself():
    text = "\n".join(
        [
            "# TYPE sglang:token_usage gauge",
            'sglang:token_usage{tp_rank="0"} 0.25',
            'sglang:num_running_reqs{tp_rank="0"} not-a-number',
            'sglang:num_queue_reqs{tp_rank="1"} 2',
            'sglang:gen_throughput{tp_rank="0",note="a } inside"} 40',
        ]
    )
    assert summarise_metrics(text) == {
        "token_usage": 0.25,
        "num_queue_reqs": 2.0,
        "gen_throughput": 40.0,
    }


@settings(max_examples=300, deadline=None)
@example(["{, =00"])  # prometheus_client 0.26.0 raised IndexError on it (a newcomer's run)
@given(st.lists(st.text(alphabet='{}",= #\\\n\t.:_sglang0123456789eE+-', max_size=40), max_size=8))
def test_any_text_is_summarised_without_raising(lines):
    summary = summarise_metrics("\n".join(["sglang:token_usage 0.5", *lines]))
    assert set(summary) <= {"token_usage", "num_running_reqs", "num_queue_reqs", "gen_throughput"}


def test_secret_values_are_masked_in_log_text():
    secrets = secret_values(["--api-key", "sk-123456", "--port", "30000"], {"HF_TOKEN": "hf_abc"})
    assert secrets == ["sk-123456", "hf_abc"]
    line = "server_args=ServerArgs(api_key='sk-123456', port=30000) token hf_abc"
    assert (
        mask_text(line, secrets) == "server_args=ServerArgs(api_key='****', port=30000) token ****"
    )


@pytest.mark.parametrize("flag", ["--ap", "--api", "--api-k", "--admin", "--ssl-keyfile-pass"])
def test_abbreviated_secret_flags_are_masked(flag):
    from nodes.domain.redact import redact_args

    assert redact_args([flag, "SEKRET"]) == [flag, "****"]
    assert secret_values([f"{flag}=SEKRET"], {}) == ["SEKRET"]


def test_text_before_the_launcher_is_refused_not_dropped():
    from nodes.domain.sglang_flags import split_command

    assert split_command("export HF_TOKEN=x\npython3 -m sglang.launch_server --model-path /m") == (
        ["--model-path", "/m"],
        {"HF_TOKEN": "x"},
    )
    assert split_command("/opt/v/bin/python3.11 -u -m sglang.launch_server --tp 2")[0] == [
        "--tp",
        "2",
    ]
    for pasted in ("rm -rf /x && python3 -m sglang.launch_server --tp 2", "sudo sglang serve"):
        with pytest.raises(ValueError, match="before the launcher would not be run"):
            split_command(pasted)


HISTOGRAM = """# TYPE sglang:time_to_first_token_seconds histogram
sglang:time_to_first_token_seconds_bucket{{model_name="m",le="1.0"}} {count}
sglang:time_to_first_token_seconds_bucket{{model_name="m",le="+Inf"}} {count}
sglang:time_to_first_token_seconds_sum{{model_name="m"}} {total}
sglang:time_to_first_token_seconds_count{{model_name="m"}} {count}
# TYPE sglang:num_requests_total counter
sglang:num_requests_total{{model_name="m"}} {done}
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{{model_name="m"}} {prompt}
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{{model_name="m"}} {made}
"""


def test_time_to_first_token_and_tokens_per_request_come_from_the_interval():
    from nodes.domain.server_metrics import load_sample

    first = summarise_metrics(HISTOGRAM.format(count=10, total=5.0, done=4, prompt=16000, made=800))
    later = summarise_metrics(
        HISTOGRAM.format(count=30, total=65.0, done=14, prompt=56000, made=2800)
    )
    previous = load_sample(None, first, 10.0)
    assert "ttft_s" not in previous  # one reading is no interval
    sample = load_sample(previous, later, 15.0)
    # 20 first tokens took 60 s in all: 3 s each; 10 requests held 42,000 tokens: 4,200 each.
    assert sample["ttft_s"] == 3.0 and sample["request_tokens"] == 4200
    # A server that restarted (its counters went back) gives no interval figure.
    again = load_sample(sample, first, 20.0)
    assert "ttft_s" not in again and "request_tokens" not in again


@pytest.mark.parametrize("value", ["NaN", "+Inf", "-Inf", "-3", "1e308"])
def test_figures_no_server_gives_are_left_out_and_sampling_goes_on(value):
    from nodes.domain.server_metrics import load_sample

    text = HISTOGRAM.format(count=value, total=value, done=value, prompt=value, made=value)
    text += f'sglang:token_usage{{tp_rank="0"}} {value}\nsglang:num_running_reqs{{tp_rank="0"}} 4\n'
    figures = summarise_metrics(text)
    assert figures == {"num_running_reqs": 4.0}
    later = load_sample(load_sample(None, figures, 1.0), figures, 6.0)
    assert json.loads(json.dumps(later, allow_nan=False)) == later
