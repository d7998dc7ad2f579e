"""Which environment variables a profile may give the SGLang server it launches on a node.

The server runs with the profile's variables on top of the SSH user's environment, often as
root. A variable is *refused* when it makes a program the server starts (the dynamic loader,
the Python interpreter, a shell, a browser or pager Python opens, a compiler Triton or PyTorch
runs, a plug-in CUDA, NCCL or OpenMP loads) run code, or pick the program, that the profile's
command line does not show. Every door that stores or launches a profile asks this module: the
profile form, the API, the import, pasted command lines and the launch itself (a revision saved
before the policy existed cannot run hooked code).

Three outcomes per variable (``decide``):

- ``refused``: a loader or interpreter hook (below), or a name that is not
  ``[A-Za-z_][A-Za-z0-9_]*`` in ASCII, at most 128 characters (``ÄÖ``, ``BASH_FUNC_x%%``,
  ``A-B`` are no variable names a shell would set; one rule at every door). An admin can
  allow a refused (well-formed) name on one node; the refusal says so.
- ``allowed``: a family SGLang and its libraries document (``SGLANG_*``, ``TORCH_*``,
  ``PYTORCH_*``, ``NCCL_*``, ``GLOO_*``, ``CUDA_*``, ``HF_*``, ``TRANSFORMERS_*``, ``VLLM_*``,
  ``OMP_NUM_THREADS``…). A hook inside a family (``CUDA_INJECTION64_PATH``,
  ``NCCL_NET_PLUGIN``) is still refused: refusals win.
- ``accepted``: anything else (the model's own settings, proxies, ``TMPDIR``…). Values of
  secret-looking names are masked wherever they are shown (``nodes.domain.redact``).

Sources for the refused names:

- glibc's ``sysdeps/generic/unsecvars.h`` (``UNSECURE_ENVVARS``): what the loader strips for
  set-user-ID programs because it loads code or redirects files (``LD_PRELOAD``, ``LD_AUDIT``,
  ``LD_LIBRARY_PATH``, ``GCONV_PATH``, ``LOCPATH``, ``NLSPATH``, ``MALLOC_TRACE``,
  ``GLIBC_TUNABLES``, ``HOSTALIASES``, ``RES_OPTIONS``…); ``ld.so(8)`` for every other ``LD_*``.
  ``TMPDIR`` from that list only moves temporary files and stays accepted.
- Python's "Command line and environment" documentation: ``PYTHONSTARTUP``, ``PYTHONPATH``,
  ``PYTHONHOME``, ``PYTHONPLATLIBDIR``, ``PYTHONUSERBASE`` (its ``.pth`` files run at start-up),
  ``PYTHONWARNINGS`` (a ``-W`` filter's category is imported: ``ignore::antigravity.x`` imports
  ``antigravity``, which opens ``$BROWSER``), ``PYTHONBREAKPOINT`` (imports a callable),
  ``PYTHONINSPECT``, ``PYTHONEXECUTABLE``, ``PYTHONPYCACHEPREFIX`` (bytecode read from a
  folder). Python adds such variables often, so every ``PYTHON*`` is refused except a short
  list of switches that load nothing (``PYTHON_SWITCHES``); ``PYTHONOPTIMIZE`` is refused as
  ``-O`` is (it strips SGLang's assertions). ``_PYTHON_SYSCONFIGDATA_NAME``/``_PATH`` (the
  ``sysconfig`` module imports the module they name): every ``_PYTHON*``.
- ``webbrowser`` (``BROWSER`` is a command line), ``pydoc`` (``PAGER``, ``MANPAGER``), git
  (``GIT_*``: ``GIT_SSH_COMMAND``, ``GIT_CONFIG_*`` set ``core.fsmonitor`` and friends),
  ``ssh``/``sudo`` askpass programs, editors.
- bash(1) "INVOCATION" and "Shell Variables": ``BASH_ENV`` and ``ENV`` name files a shell runs
  (zsh's ``ZDOTDIR`` the folder of its start-up files, ``FPATH`` where zsh and ksh load
  functions from, ``XDG_CONFIG_HOME`` where git and fish read configuration that runs commands),
  ``SHELLOPTS``/``BASHOPTS`` with ``PS4`` run command substitutions under ``xtrace``, ``IFS``
  and ``CDPATH`` change how scripts read words and paths, ``PROMPT_COMMAND``; ``PATH`` chooses
  which program every unqualified command is; ``HOME`` moves the user site-packages.
- Other interpreters the server or its tools might start: ``PERL5OPT``/``PERL5LIB``/
  ``PERLLIB``, ``RUBYOPT``/``RUBYLIB``, ``NODE_OPTIONS`` (``--require``)/``NODE_PATH``,
  ``JAVA_TOOL_OPTIONS``/``_JAVA_OPTIONS``/``JDK_JAVA_OPTIONS`` (``-javaagent``).
- Libraries the server loads: OpenSSL's ``OPENSSL_CONF`` (loads engines and providers),
  ``OPENSSL_ENGINES``/``OPENSSL_MODULES``; CUDA's ``CUDA_INJECTION64_PATH`` and NVTX's
  ``NVTX_INJECTION64_PATH`` (a library loaded into every CUDA process); NCCL's plug-in
  libraries (every ``NCCL_*PLUGIN*``: ``NET``, ``TUNER``, ``PROFILER``, ``ENV``…) and its files
  (every ``NCCL_*FILE``: ``NCCL_CONF_FILE`` sets the plug-ins, ``NCCL_DEBUG_FILE`` and
  ``NCCL_TOPO_DUMP_FILE`` are written); OpenMP's ``OMP_TOOL_LIBRARIES``; Triton's knobs
  (``triton/knobs.py``) that name a program, library, module or path (every ``TRITON_*PATH``,
  ``TRITON_*MANAGER``, ``TRITON_*BACKEND``: ``TRITON_PTXAS_BLACKWELL_PATH``,
  ``TRITON_LIBDEVICE_PATH``, ``TRITON_CACHE_MANAGER``, ``TRITON_REMOTE_CACHE_BACKEND``…);
  ``DYLD_*`` (macOS' loader).
- Compilers the server's JIT builds (Triton, PyTorch extensions, FlashInfer, DeepGEMM) run and
  their inputs: ``CC``/``CXX``, ``CUDACXX``/``CUDAHOSTCXX``, ``NVCC_*``
  (``NVCC_PREPEND_FLAGS``, ``NVCC_CCBIN``), ``HIPCC_*``, ``CUDA_HOME``/``CUDA_PATH``/
  ``ROCM_PATH`` (their ``bin/nvcc`` is run; an admin allows them on a node whose toolkit is not
  where the tools look), ``CFLAGS``/``LDFLAGS`` (``-fplugin``), gcc's ``GCC_EXEC_PREFIX``,
  ``COMPILER_PATH``, ``CPATH``, ``LIBRARY_PATH``.
- Files written as the server's user (often root, so any file): glibc's ``MALLOC_TRACE``,
  ``SSLKEYLOGFILE`` (and every ``*LOGFILE``, ``*_LOG_FILE``, ``*_DEBUG_FILE``,
  ``*_DUMP_FILE``, ``*_TRACE_FILE``…), cuBLAS/cuDNN's ``*_LOGDEST_DBG``, PyTorch's
  ``TORCH_LOGS_OUT``.

Folders where the server keeps its own caches (``TRITON_CACHE_DIR``, ``HF_HOME``, ``TMPDIR``)
stay allowed: the server writes them with names of its own, and the profile cannot place code
in them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

NAME_RULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)
MAX_NAME_LENGTH = 128

# Exact names and why each is refused (what it makes run).
REFUSED: dict[str, str] = {
    "PATH": "it chooses which program every command without a path runs",
    "HOME": "it moves the user site-packages, whose .pth files Python runs at start-up",
    "BROWSER": "Python's webbrowser module runs it as a command line",
    "PAGER": "pydoc runs it as a shell command",
    "MANPAGER": "pydoc runs it as a shell command",
    "EDITOR": "programs run it as a command",
    "VISUAL": "programs run it as a command",
    "LESSOPEN": "less runs it as a command",
    "LESSCLOSE": "less runs it as a command",
    "SSH_ASKPASS": "ssh runs it as a program",
    "SUDO_ASKPASS": "sudo runs it as a program",
    "BASH_ENV": "bash runs the file it names before any script",
    "ENV": "sh runs the file it names when it starts",
    "SHELLOPTS": "it turns on shell options (xtrace runs PS4's command substitutions)",
    "BASHOPTS": "it turns on shell options in every bash the server starts",
    "PS4": "bash expands it, command substitutions included, under xtrace",
    "PROMPT_COMMAND": "bash runs it as a command",
    "IFS": "it changes how every shell script splits words",
    "CDPATH": "it changes where every shell script's cd goes",
    "SHELL": "programs start it as the user's shell",
    "GCONV_PATH": "iconv loads conversion modules (shared libraries) from it",
    "GETCONF_DIR": "glibc runs the getconf programs it holds",
    "GLIBC_TUNABLES": "it changes glibc internals (the loader strips it for set-user-ID programs)",
    "HOSTALIASES": "it redirects host name lookups to a file it names",
    "LOCALDOMAIN": "it changes host name resolution",
    "RES_OPTIONS": "it changes host name resolution",
    "RESOLV_HOST_CONF": "it redirects the resolver to a file it names",
    "LOCPATH": "glibc loads locale data (parsed as code tables) from it",
    "NLSPATH": "glibc loads message catalogues (format strings) from it",
    "NIS_PATH": "it redirects NIS lookups",
    "TZDIR": "glibc reads time zone files from it",
    "MALLOC_TRACE": "glibc writes a trace to the file it names (any file the server may write)",
    "OPENSSL_CONF": "OpenSSL loads the engines and providers its file names",
    "OPENSSL_ENGINES": "OpenSSL loads engines (shared libraries) from it",
    "OPENSSL_MODULES": "OpenSSL loads providers (shared libraries) from it",
    "CUDA_INJECTION64_PATH": "CUDA loads the library it names into the server",
    "CUDA_INJECTION32_PATH": "CUDA loads the library it names into the server",
    "NVTX_INJECTION64_PATH": "NVTX loads the library it names into the server",
    "NVTX_INJECTION32_PATH": "NVTX loads the library it names into the server",
    "NCCL_NET_PLUGIN": "NCCL loads the plug-in library it names into every rank",
    "NCCL_TUNER_PLUGIN": "NCCL loads the plug-in library it names into every rank",
    "NCCL_PROFILER_PLUGIN": "NCCL loads the plug-in library it names into every rank",
    "NCCL_CONF_FILE": "it sets any NCCL variable, plug-in libraries included",
    "OMP_TOOL_LIBRARIES": "the OpenMP runtime loads the tool libraries it names",
    "TRITON_PTXAS_PATH": "Triton runs the program it names to build kernels",
    "TRITON_CUOBJDUMP_PATH": "Triton runs the program it names",
    "TRITON_NVDISASM_PATH": "Triton runs the program it names",
    "TRITON_LIBCUDA_PATH": "Triton loads libcuda from it",
    "CC": "Triton and PyTorch run the compiler it names to build kernels",
    "CXX": "PyTorch runs the compiler it names to build extensions",
    "CUDACXX": "CUDA builds run the compiler it names",
    "CUDAHOSTCXX": "nvcc runs the host compiler it names",
    "CUDA_HOME": "JIT kernel builds (PyTorch, FlashInfer, DeepGEMM) run its bin/nvcc",
    "CUDA_PATH": "JIT kernel builds (PyTorch, FlashInfer, DeepGEMM) run its bin/nvcc",
    "CUDA_ROOT": "JIT kernel builds run its bin/nvcc",
    "ROCM_HOME": "JIT kernel builds on ROCm run its compilers",
    "ROCM_PATH": "JIT kernel builds on ROCm run its compilers",
    "HIP_PATH": "JIT kernel builds on ROCm run its compilers",
    "CFLAGS": "kernel builds pass it to the compiler (-fplugin loads a library)",
    "CXXFLAGS": "kernel builds pass it to the compiler (-fplugin loads a library)",
    "CPPFLAGS": "kernel builds pass it to the compiler",
    "LDFLAGS": "kernel builds pass it to the linker (libraries linked into the server)",
    "GCC_EXEC_PREFIX": "gcc runs its sub-programs (cc1, as, ld) from it",
    "COMPILER_PATH": "gcc runs its sub-programs (cc1, as, ld) from it",
    "LIBRARY_PATH": "the linker links libraries from it into what kernel builds load",
    "CPATH": "kernel builds include headers (code) from it",
    "C_INCLUDE_PATH": "kernel builds include headers (code) from it",
    "CPLUS_INCLUDE_PATH": "kernel builds include headers (code) from it",
    "DEPENDENCIES_OUTPUT": "gcc writes a file where it says",
    "SUNPRO_DEPENDENCIES": "gcc writes a file where it says",
    "ZDOTDIR": "zsh runs the start-up files (.zshenv…) in the folder it names",
    "FPATH": "zsh and ksh load shell functions from it",
    "XDG_CONFIG_HOME": "programs (git, fish, pip) read configuration that runs commands from it",
    "TCLLIBPATH": "Tcl loads packages from it",
    "PYTHONOPTIMIZE": "it strips the assertions SGLang checks its memory with (as -O does)",
    "PERL5OPT": "perl reads options, -M modules included, from it",
    "PERL5LIB": "perl loads modules from it",
    "PERLLIB": "perl loads modules from it",
    "PERL5DB": "perl runs it as debugger code",
    "RUBYOPT": "ruby reads options, -r libraries included, from it",
    "RUBYLIB": "ruby loads libraries from it",
    "NODE_OPTIONS": "node reads options, --require included, from it",
    "NODE_PATH": "node loads modules from it",
    "JAVA_TOOL_OPTIONS": "the JVM reads options, -javaagent included, from it",
    "_JAVA_OPTIONS": "the JVM reads options, -javaagent included, from it",
    "JDK_JAVA_OPTIONS": "the java launcher reads options, -javaagent included, from it",
}
# Prefixes refused as a family (after the exact names above).
REFUSED_PREFIXES: tuple[tuple[str, str], ...] = (
    ("LD_", "the dynamic loader reads LD_* variables: they load or redirect shared libraries"),
    ("DYLD_", "the macOS loader reads DYLD_* variables: they load libraries"),
    ("GIT_", "git runs the programs and configuration GIT_* variables name"),
    ("BASH_", "bash reads BASH_* variables (functions, start-up files) when it starts"),
    ("PYTHON", "the Python interpreter reads PYTHON* variables before the server's own code"),
    ("_PYTHON", "Python's sysconfig imports or runs what _PYTHON* variables name"),
    ("NVCC_", "nvcc reads NVCC_* variables: extra flags and the host compiler it runs"),
    ("HIPCC_", "hipcc reads HIPCC_* variables: extra flags and the compilers it runs"),
    ("LUA_", "lua runs LUA_INIT code and loads modules from LUA_PATH/LUA_CPATH"),
)
# Patterns refused wherever they appear in a name (families included): what they name is a
# program, module, library or plug-in the server runs or loads, or a file it writes as its user
# (which can overwrite any file that user may write: root's start-up files, say).
REFUSED_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile(r"TRITON_\w*(PATH|MANAGER|BACKEND)"),
        "Triton runs, loads or imports what its *_PATH, *_MANAGER and *_BACKEND variables name",
    ),
    (re.compile(r"NCCL_\w*PLUGIN\w*"), "NCCL loads the plug-in library it names into every rank"),
    (
        # SGLANG_EXTERNAL_MODEL_PACKAGE, SGLANG_EXTERNAL_MM_PROCESSOR_PACKAGE: SGLang imports the
        # package they name (python/sglang/srt/models/registry.py); any *_PACKAGE, *_MODULE(S),
        # *_PLUGIN(S) or *_CLASS setting names code to import by the same mechanism.
        re.compile(r"\w*_(PACKAGES?|MODULES?|PLUGINS?|CLASS|CLASSES|IMPORTS?)"),
        "the server imports the Python package, module, plug-in or class it names",
    ),
    (
        re.compile(r"NCCL_\w*FILE"),
        "NCCL reads or writes the file it names as the server's user (any file that user may "
        "touch)",
    ),
    (
        re.compile(r"\w*(LOGFILE|LOG_FILE|_(DEBUG|DUMP|TRACE|TEMP|OUT|OUTPUT|COREDUMP)_FILE)"),
        "the server writes the file it names as its user (it can overwrite any file that user "
        "may write)",
    ),
    (
        re.compile(r"\w*(LOGDEST|LOGDEST_DBG|_LOGS_OUT)"),
        "the server writes the file it names as its user (it can overwrite any file that user "
        "may write)",
    ),
)
# PYTHON* switches that load, import or run nothing (Python's "Command line and environment").
PYTHON_SWITCHES = frozenset(
    {
        "PYTHONUNBUFFERED",
        "PYTHONHASHSEED",
        "PYTHONFAULTHANDLER",
        "PYTHONDONTWRITEBYTECODE",
        "PYTHONIOENCODING",
        "PYTHONUTF8",
        "PYTHONDEVMODE",
        "PYTHONTRACEMALLOC",
        "PYTHONNOUSERSITE",
        "PYTHONSAFEPATH",
        "PYTHONINTMAXSTRDIGITS",
        "PYTHONASYNCIODEBUG",
        "PYTHONPROFILEIMPORTTIME",
        "PYTHONMALLOC",
        "PYTHONMALLOCSTATS",
        "PYTHONVERBOSE",
        "PYTHONNODEBUGRANGES",
    }
)
# Families SGLang and its libraries document; exact names for single settings.
ALLOWED_PREFIXES: tuple[str, ...] = (
    "SGLANG_",
    "SGL_",
    "TORCH_",
    "TORCHINDUCTOR_",
    "PYTORCH_",
    "NCCL_",
    "GLOO_",
    "CUDA_",
    "CUBLAS_",
    "CUDNN_",
    "NVIDIA_",
    "HF_",
    "HUGGING_FACE_",
    "TRANSFORMERS_",
    "TOKENIZERS_",
    "VLLM_",
    "TRITON_",
    "FLASHINFER_",
    "OMP_",
    "KMP_",
    "MKL_",
    "OPENBLAS_",
)
ALLOWED_NAMES = frozenset({"TOKENIZERS_PARALLELISM", "OMP_NUM_THREADS", "MALLOC_ARENA_MAX"})


@dataclass(frozen=True)
class Decision:
    """What the policy says of one variable: ``kind`` is ``allowed``, ``refused`` or
    ``accepted``; ``reason`` says why (for a refusal, what the variable makes run)."""

    name: str
    kind: str
    reason: str

    @property
    def refused(self) -> bool:
        return self.kind == "refused"


def check_name(name: str) -> str | None:
    """``None`` for a well-formed variable name, else why not (one rule at every door)."""
    if not isinstance(name, str) or not name:
        return "an environment variable needs a name"
    if len(name) > MAX_NAME_LENGTH or not NAME_RULE.fullmatch(name):
        return (
            f"{name[:40]!r} is not an environment variable name: variable names are ASCII "
            f"letters, digits and _, not starting with a digit, at most {MAX_NAME_LENGTH} long"
        )
    return None


def parse_allowances(text: str) -> tuple[list[str], str | None]:
    """A node's extra allowed names from text (commas, spaces or lines): ``NAME`` or ``PREFIX*``
    (``MY_LIB_*``). Returns ``(names, error)``; the error names the first bad entry."""
    names: list[str] = []
    for word in re.split(r"[\s,]+", text.strip()):
        if not word:
            continue
        stem = word[:-1] if word.endswith("*") else word
        if check_name(stem) is not None:
            return [], f"{word[:40]!r} is not a variable name or a NAME_* prefix"
        if word not in names:
            names.append(word)
    return names, None


def node_allows(name: str, allowances: Iterable[str]) -> bool:
    """Whether one of a node's allowances (``NAME`` or ``PREFIX*``) covers ``name``."""
    for entry in allowances:
        if entry == name or (entry.endswith("*") and name.startswith(entry[:-1])):
            return True
    return False


def _hook(name: str) -> str | None:
    if name in REFUSED:
        return REFUSED[name]
    if name in PYTHON_SWITCHES:
        return None
    for prefix, reason in REFUSED_PREFIXES:
        if name.startswith(prefix):
            return reason
    for pattern, reason in REFUSED_PATTERNS:
        if pattern.fullmatch(name):
            return reason
    return None


def decide(name: str, allowances: Iterable[str] = ()) -> Decision:
    """The policy's word on variable ``name`` on a node that allows ``allowances`` besides."""
    if problem := check_name(name):
        return Decision(name, "refused", problem)
    hook = _hook(name)
    if hook is not None and not node_allows(name, allowances):
        return Decision(name, "refused", hook)
    if hook is not None:
        return Decision(name, "allowed", "allowed on this node by an admin")
    if name in PYTHON_SWITCHES:
        return Decision(name, "allowed", "a Python switch that loads and runs nothing")
    if name in ALLOWED_NAMES or name.startswith(ALLOWED_PREFIXES):
        return Decision(name, "allowed", "a setting SGLang or its libraries read")
    return Decision(name, "accepted", "not known to the panel; passed to the server as given")


#: Linux passes one ``NAME=value`` string of at most this many bytes (its NUL included) to a
#: program: ``MAX_ARG_STRLEN`` (32 pages; include/uapi/linux/binfmts.h). A longer one makes
#: ``execve`` fail with E2BIG ("Argument list too long"), so the server could never start.
MAX_ARG_STRLEN = 32 * 4096
#: All of a profile's variables together, in bytes: the kernel's whole ``argv`` + ``envp``
#: budget is a quarter of the stack limit (``ARG_MAX``, 2 MiB under the usual 8 MiB), shared
#: with the SSH user's own environment and the command line; half of it is left to them.
MAX_ENV_BYTES = 2**20


#: Variables at least this long are named with their size in a failed launch's bundle; shorter
#: ones (a token, a password) are not, so a bundle does not tell a secret's length.
SIZE_SHOWN_FROM = 4096


def entry_bytes(name: str, value: str) -> int:
    """What ``NAME=value`` takes of the kernel's argument space: its UTF-8 bytes and the NUL."""
    return len(f"{name}={value}".encode(errors="surrogatepass")) + 1


def env_sizes(env: Mapping[str, str]) -> dict[str, object]:
    """``{"env_total_bytes": int, "env_sizes": {NAME: bytes}}`` of what ``env`` gives
    ``execve``; only variables of at least ``SIZE_SHOWN_FROM`` bytes are named."""
    sizes = {name: entry_bytes(name, str(value)) for name, value in env.items()}
    return {
        "env_total_bytes": sum(sizes.values()),
        "env_sizes": {n: b for n, b in sorted(sizes.items()) if b >= SIZE_SHOWN_FROM},
    }


def size_refusals(env: Mapping[str, str]) -> list[str]:
    """Why ``env`` could not reach a program at all (too long for ``execve``), one message per
    variable and one for the whole; empty when it fits. Values are never quoted."""
    messages = []
    total = 0
    for name in sorted(env):
        size = entry_bytes(name, env[name])
        total += size
        if size > MAX_ARG_STRLEN:
            messages.append(
                f"{name} is refused: its value is {size - len(name) - 2:,} bytes, and Linux "
                f"passes a program at most {MAX_ARG_STRLEN - len(name) - 2:,} for it "
                "(MAX_ARG_STRLEN): the server could never start"
            )
    if total > MAX_ENV_BYTES and not messages:
        messages.append(
            f"the environment is {total:,} bytes in all; at most {MAX_ENV_BYTES:,} are passed "
            "to the server (the kernel's ARG_MAX is shared with the command line)"
        )
    return messages


def refusals(env: Mapping[str, str], allowances: Iterable[str] = (), node: str = "") -> list[str]:
    """One message per refused variable of ``env`` (in name order), naming it and why, and how
    to get it allowed on ``node``; then what ``size_refusals`` finds. Values are never quoted
    (they may be secrets). Empty: ok."""
    allowances = list(allowances)
    messages = []
    for name in sorted(env):
        decision = decide(name, allowances)
        if not decision.refused:
            continue
        if check_name(name) is not None:
            messages.append(decision.reason)
            continue
        where = f"node {node}" if node else "the node"
        messages.append(
            f"{name} is refused: {decision.reason}. Remove it, or ask an admin to allow {name} "
            f"on {where} (node page → Edit → Allowed environment variables)"
        )
    return messages + size_refusals(env)
