"""The simulated nodes' ``pynvml`` offers what the node scripts use of nvidia-ml-py's, alike.

The names come from the scripts themselves (every ``pynvml.<name>`` in ``nodes/remote/*.py``,
read by AST), so a script that starts using another NVML call fails here until the stand-in
has it. Each is checked against the real module (``nvidia-ml-py``, requirements-dev.txt), which
imports without a GPU: functions by their parameters, constants by value, classes by kind. No
root, no GPU, no simulated node needed.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import sys
from pathlib import Path
from types import ModuleType

import pynvml as real
import pytest

ROOT = Path(__file__).resolve().parents[2]
REMOTE = ROOT / "nodes" / "remote"
SIMULATED = ROOT / "simfleet" / "node" / "site" / "pynvml.py"


def _load_simulated() -> ModuleType:
    """The stand-in, imported by path under another name so it does not shadow the real one."""
    spec = importlib.util.spec_from_file_location("simulated_pynvml", SIMULATED)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


sim = _load_simulated()


def _names_used(source: str) -> set[str]:
    """``X`` of every ``pynvml.X`` (any ``import pynvml as alias``) and ``from pynvml import X``."""
    tree = ast.parse(source)
    aliases = {"pynvml"}
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            aliases |= {a.asname or a.name for a in node.names if a.name == "pynvml"}
        elif isinstance(node, ast.ImportFrom) and node.module == "pynvml":
            names |= {a.name for a in node.names}
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
        ):
            names.add(node.attr)
    return names


def _used_by_remote() -> dict[str, list[str]]:
    """Each name the node scripts take from pynvml, with the scripts that take it."""
    used: dict[str, list[str]] = {}
    for script in sorted(REMOTE.glob("*.py")):
        for name in _names_used(script.read_text()):
            used.setdefault(name, []).append(script.name)
    return used


USED = _used_by_remote()
# Whatever the scripts catch, the stand-in must raise as the real module does.
ALWAYS = {"NVMLError"}


def _parameters(function: object) -> list[tuple[str, str, bool]]:
    """(name, kind, has a default) of each parameter: what a caller's arguments bind to."""
    signature = inspect.signature(function)  # type: ignore[arg-type]
    return [
        (p.name, p.kind.name, p.default is not inspect.Parameter.empty)
        for p in signature.parameters.values()
    ]


def _differences(name: str) -> list[str]:
    """What the stand-in's ``name`` lacks or does otherwise than the real one, in words."""
    if not hasattr(real, name):
        return [f"nvidia-ml-py {_real_version()} has no pynvml.{name}"]
    if not hasattr(sim, name):
        return [f"simfleet/node/site/pynvml.py has no {name} (nvidia-ml-py has it)"]
    want, got = getattr(real, name), getattr(sim, name)
    if inspect.isclass(want):
        return _class_differences(name, want, got)
    if callable(want):
        if not callable(got):
            return [f"{name} is callable in nvidia-ml-py, {type(got).__name__} in the stand-in"]
        if _parameters(got) != _parameters(want):
            real_signature = inspect.signature(want)
            return [f"{name}{inspect.signature(got)} but nvidia-ml-py has {real_signature}"]
        return []
    if type(got) is not type(want) or got != want:
        return [f"{name} = {got!r} but nvidia-ml-py has {want!r}"]
    return []


def _class_differences(name: str, want: type, got: object) -> list[str]:
    if not inspect.isclass(got):
        return [f"{name} is a class in nvidia-ml-py, {type(got).__name__} in the stand-in"]
    if issubclass(want, BaseException) and not issubclass(got, BaseException):
        return [f"{name} is an exception in nvidia-ml-py, not in the stand-in"]
    return []


def _real_version() -> str:
    from importlib.metadata import version

    return version("nvidia-ml-py")


def test_the_real_pynvml_is_nvidia_ml_py_s():
    assert Path(str(real.__file__)).resolve() != SIMULATED.resolve(), real.__file__
    assert _real_version()


def test_node_scripts_use_nvml_through_pynvml():
    assert USED, f"no pynvml.<name> found in {REMOTE}/*.py: the probe reads GPUs through NVML"


@pytest.mark.parametrize("name", sorted(set(USED) | ALWAYS))
def test_simulated_pynvml_offers_what_node_scripts_use_as_nvidia_ml_py_does(name):
    where = ", ".join(f"nodes/remote/{script}" for script in USED.get(name, []))
    problems = _differences(name)
    assert not problems, f"pynvml.{name} (used by {where or 'any caller'}): " + "; ".join(problems)


def _public(module: ModuleType) -> list[str]:
    return sorted(
        n
        for n, v in vars(module).items()
        if not n.startswith("_")
        and getattr(v, "__module__", module.__name__) == module.__name__
        and not inspect.ismodule(v)
    )


@pytest.mark.parametrize("name", _public(sim))
def test_every_name_the_simulated_pynvml_offers_is_nvidia_ml_py_s(name):
    """The stand-in invents no API: each public name is the real one's, alike."""
    problems = _differences(name)
    assert not problems, "; ".join(problems)


def _error_codes() -> list[int]:
    return sorted(v for n, v in vars(sim).items() if n.startswith("NVML_ERROR_"))


@pytest.mark.parametrize("code", _error_codes())
def test_simulated_nvml_errors_have_the_real_class_and_words(code):
    want, got = real.NVMLError(code), sim.NVMLError(code)
    assert (type(got).__name__, str(got), got.value) == (type(want).__name__, str(want), code)
    subclass = getattr(sim, type(want).__name__)
    assert isinstance(got, subclass) and isinstance(got, sim.NVMLError)
    # ``raise pynvml.NVMLError_DriverNotLoaded()`` works with no argument, as upstream.
    assert subclass().value == getattr(real, type(want).__name__)().value == code


def _structures() -> list[str]:
    return [
        n for n in _public(sim) if inspect.isclass(getattr(sim, n)) and hasattr(real, n)
        and hasattr(getattr(real, n), "_fields_")
    ]  # fmt: skip


@pytest.mark.parametrize("name", _structures())
def test_simulated_nvml_structures_have_the_real_fields(name):
    fields = set(getattr(sim, name).__dataclass_fields__)
    real_fields = {field[0] for field in getattr(real, name)._fields_}
    assert fields <= real_fields, f"{name}: {sorted(fields - real_fields)} not in nvidia-ml-py"
