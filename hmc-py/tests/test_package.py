"""The package's surface: the stubs match the extension module, every public name has a
docstring, the names of the issue exist, and the README's examples run."""

import ast
import importlib.resources
import inspect
import re
from pathlib import Path

import hmc
from hmc import _hmc


def stub_classes():
    src = importlib.resources.files("hmc").joinpath("_hmc.pyi").read_text()
    tree = ast.parse(src)
    out = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            members = set()
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    members.add(item.name)
                elif isinstance(item, ast.AnnAssign):
                    members.add(item.target.id)
                elif isinstance(item, ast.Assign):
                    members.update(t.id for t in item.targets)
            out[node.name] = members
    return out


def runtime_classes():
    return {n: c for n, c in vars(_hmc).items() if inspect.isclass(c)}


def public(cls):
    return {
        n
        for n in vars(cls)
        if not n.startswith("_") or n in ("__init__", "__await__", "__enter__", "__exit__", "__len__")
    }


def test_stubs_and_the_extension_module_name_the_same_things():
    stubs, real = stub_classes(), runtime_classes()
    assert set(stubs) == set(real)
    for name, cls in real.items():
        missing = {m for m in public(cls) if m not in stubs[name] and m != "__init__"}
        assert not missing, f"{name}: {missing} not in the stubs"
        extra = {m for m in stubs[name] if m not in dir(cls) and m != "__init__"}
        assert not extra, f"{name}: stubs name {extra}, which the class lacks"
    assert importlib.resources.files("hmc").joinpath("py.typed").is_file()


def test_every_public_name_has_a_docstring():
    modules = [hmc, hmc.kv, hmc.rpc]
    for m in modules:
        assert m.__doc__, m
        for name in m.__all__:
            obj = getattr(m, name)
            if inspect.isclass(obj):
                assert obj.__doc__, f"{m.__name__}.{name}"
                for attr, v in vars(obj).items():
                    if not attr.startswith("_") and callable(v):
                        assert v.__doc__, f"{m.__name__}.{name}.{attr}"


def test_the_issue_names_exist():
    for n in ["Engine", "MemType", "MemHandle", "TransferOp", "TransferOpDesc", "TransferReq",
              "TransferStatus", "HmcError", "TimeoutError", "UnavailableError", "InvalidArgumentError"]:
        assert hasattr(hmc, n), n
    assert [repr(s) for s in (hmc.TransferStatus.WAITING, hmc.TransferStatus.COMPLETED,
                              hmc.TransferStatus.TIMEOUT, hmc.TransferStatus.FAILED)] == [
        "TransferStatus.WAITING", "TransferStatus.COMPLETED", "TransferStatus.TIMEOUT",
        "TransferStatus.FAILED"]
    for n in ["DataDist", "CacheDesc", "CacheKey", "BlocksCacheKey"]:
        assert hasattr(hmc.kv, n), n
    for n in ["allocate_cache", "register_kv_cache", "deallocate_cache", "pull_kv_cache",
              "push_kv_cache", "pull_kv_blocks", "push_kv_blocks", "copy_kv_blocks",
              "link_clusters", "unlink_clusters"]:
        assert hasattr(hmc.kv.DataDist, n), n
    for n in ["call", "echo", "uppercase", "complex"]:
        assert hasattr(hmc.rpc.Client, n), n
    for n in ["register", "serve", "shutdown", "start"]:
        assert hasattr(hmc.rpc.Server, n), n


def readme_python_examples():
    """The ``python`` code blocks of the README's "Python" section."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("\n## Python\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def test_the_readme_examples_run():
    examples = readme_python_examples()
    assert examples, "the README's Python section has no python code block"
    for code in examples:
        exec(compile(code, "README.md", "exec"), {})
