"""The environment policy: loader and interpreter hooks refused, known families allowed, the
rest accepted; one name rule; a node's admin allowances."""

from __future__ import annotations

import pytest

from nodes.domain.env_policy import check_name, decide, parse_allowances, refusals

ATTACK = {
    "PYTHONWARNINGS": "ignore::antigravity.x",
    "BROWSER": "/bin/sh -c 'id > pwned.txt' #%s",
}


def test_the_reported_attack_is_refused_naming_each_variable_and_how_to_allow_it():
    messages = refusals(ATTACK, node="gpu-a")
    assert len(messages) == 2
    browser, warnings = messages
    assert browser.startswith("BROWSER is refused: Python's webbrowser module runs it")
    assert warnings.startswith("PYTHONWARNINGS is refused: the Python interpreter")
    assert all("ask an admin to allow" in m and "node gpu-a" in m for m in messages)
    assert all("pwned" not in m and "antigravity" not in m for m in messages)  # no values


@pytest.mark.parametrize(
    "name",
    [
        "LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "LD_ANYTHING_NEW", "PYTHONSTARTUP",
        "PYTHONPATH", "PYTHONHOME", "PYTHONWARNINGS", "PYTHONBREAKPOINT", "PYTHONINSPECT",
        "PYTHONUSERBASE", "PYTHONEXECUTABLE", "PYTHONPLATLIBDIR", "PYTHON_FUTURE_HOOK",
        "BROWSER", "PATH", "HOME", "BASH_ENV", "BASH_FUNC_x", "ENV", "SHELLOPTS", "PS4", "IFS",
        "PERL5OPT", "NODE_OPTIONS", "GCONV_PATH", "GLIBC_TUNABLES", "MALLOC_TRACE",
        "OPENSSL_CONF", "CUDA_INJECTION64_PATH", "NCCL_NET_PLUGIN", "OMP_TOOL_LIBRARIES",
        "TRITON_PTXAS_PATH", "GIT_SSH_COMMAND", "JAVA_TOOL_OPTIONS", "CC",
    ],
)  # fmt: skip
def test_hooks_are_refused(name):
    assert decide(name).kind == "refused"


@pytest.mark.parametrize(
    "name",
    [
        "SGLANG_HOST_IP", "TORCH_CUDA_ARCH_LIST", "PYTORCH_CUDA_ALLOC_CONF", "NCCL_DEBUG",
        "NCCL_IB_HCA", "GLOO_SOCKET_IFNAME", "CUDA_LAUNCH_BLOCKING", "HF_HOME", "HF_TOKEN",
        "HUGGING_FACE_HUB_TOKEN", "TRANSFORMERS_OFFLINE", "OMP_NUM_THREADS",
        "TOKENIZERS_PARALLELISM", "VLLM_USE_V1", "PYTHONUNBUFFERED", "PYTHONHASHSEED",
    ],
)  # fmt: skip
def test_known_settings_are_allowed(name):
    assert decide(name).kind == "allowed"


@pytest.mark.parametrize(
    "name",
    [
        # sysconfig imports or runs what these name
        "_PYTHON_SYSCONFIGDATA_NAME", "_PYTHON_SYSCONFIGDATA_PATH", "_PYTHON_HOST_PLATFORM",
        # Triton knobs naming a program, library, module or path
        "TRITON_CACHE_MANAGER", "TRITON_REMOTE_CACHE_BACKEND", "TRITON_PTXAS_BLACKWELL_PATH",
        "TRITON_CUDACRT_PATH", "TRITON_LIBDEVICE_PATH", "TRITON_CUPTI_LIB_PATH",
        "TRITON_DUMP_MANAGER", "TRITON_OVERRIDE_MANAGER",
        # NCCL plug-ins and files
        "NCCL_ENV_PLUGIN", "NCCL_GIN_PLUGIN", "NCCL_DEBUG_FILE", "NCCL_TOPO_DUMP_FILE",
        "NCCL_GRAPH_DUMP_FILE",
        # compilers JIT builds run, and their flags
        "NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS", "NVCC_CCBIN", "CUDAHOSTCXX", "CUDACXX",
        "CUDA_HOME", "CUDA_PATH", "ROCM_PATH", "CFLAGS", "LDFLAGS", "GCC_EXEC_PREFIX", "CPATH",
        # shells' start-up files
        "ZDOTDIR", "FPATH", "XDG_CONFIG_HOME",
        # files written as the server's user
        "SSLKEYLOGFILE", "CUBLAS_LOGDEST_DBG", "CUDNN_LOGDEST_DBG", "CUBLASLT_LOG_FILE",
        "TORCH_LOGS_OUT", "CUDA_COREDUMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE",
        # strips SGLang's assertions, as -O does
        "PYTHONOPTIMIZE",
    ],
)  # fmt: skip
def test_hooks_the_re_run_found_are_refused_by_their_kind(name):
    decision = decide(name)
    assert decision.kind == "refused", decision
    assert decide(name, [name]).kind == "allowed"  # an admin can allow each on a node


def test_the_refusals_say_what_the_variable_does():
    assert "assertions" in decide("PYTHONOPTIMIZE").reason
    assert "sysconfig" in decide("_PYTHON_SYSCONFIGDATA_NAME").reason
    assert "nvcc" in decide("CUDA_HOME").reason
    assert "writes the file" in decide("SSLKEYLOGFILE").reason
    assert "plug-in" in decide("NCCL_ENV_PLUGIN").reason


@pytest.mark.parametrize(
    "name",
    [
        "TRITON_CACHE_DIR", "TRITON_PRINT_AUTOTUNING", "TRITON_F32_DEFAULT", "NCCL_DEBUG_SUBSYS",
        "NCCL_SOCKET_IFNAME", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_MAX_CONNECTIONS",
        "TORCHINDUCTOR_CACHE_DIR", "PYTHONFAULTHANDLER",
    ],
)  # fmt: skip
def test_settings_next_to_the_hooks_stay_allowed(name):
    assert decide(name).kind == "allowed"


def test_other_variables_are_accepted():
    assert decide("MY_MODEL_SETTING").kind == "accepted"
    assert decide("TMPDIR").kind == "accepted"
    assert refusals({"MY_PASSWD": "x", "http_proxy": "http://p:3128"}) == []


@pytest.mark.parametrize("name", ["ÄÖ", "A-B", "1A", "BASH_FUNC_x%%", "", "A B", "A" * 129])
def test_one_name_rule_refuses_what_no_shell_would_set(name):
    assert check_name(name) is not None
    assert decide(name).kind == "refused"
    assert len(refusals({name: "1"})) == 1


def test_a_node_can_allow_a_refused_name_or_prefix():
    allowances, error = parse_allowances("LD_LIBRARY_PATH, NCCL_*\nMY_HOOK")
    assert error is None and allowances == ["LD_LIBRARY_PATH", "NCCL_*", "MY_HOOK"]
    assert decide("LD_LIBRARY_PATH", allowances).kind == "allowed"
    assert decide("NCCL_NET_PLUGIN", allowances).kind == "allowed"
    assert decide("LD_PRELOAD", allowances).kind == "refused"
    assert refusals({"LD_LIBRARY_PATH": "/opt/x", "LD_PRELOAD": "/x.so"}, allowances) == [
        refusals({"LD_PRELOAD": "/x.so"})[0]
    ]
    assert decide("ÄÖ", ["*"]).kind == "refused"  # an allowance never bends the name rule


def test_bad_allowances_are_named():
    assert parse_allowances("OK, ÄÖ")[1] == "'ÄÖ' is not a variable name or a NAME_* prefix"
    assert parse_allowances("A*B")[1] is not None


@pytest.mark.parametrize(
    "name",
    ["SGLANG_EXTERNAL_MODEL_PACKAGE", "SGLANG_EXTERNAL_MM_PROCESSOR_PACKAGE", "VLLM_PLUGINS",
     "TORCH_SOME_MODULE", "HF_LOADER_CLASS"],
)  # fmt: skip
def test_settings_that_name_code_to_import_are_refused(name):
    decision = decide(name)
    assert decision.kind == "refused" and "imports" in decision.reason, decision
