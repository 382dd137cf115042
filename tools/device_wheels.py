"""Download, as wheels into .whl/, what a lent GPU machine lacks to run tools/gpu_check.py's
stages: the lock's versions, for CPython 3.12 on manylinux x86-64. Its image (IMAGE) has
torch, pandas, matplotlib and pytest, but neither Snakemake nor math-verify, and transformers
and huggingface_hub at other versions than the lock's.

    python tools/device_wheels.py          # then carry .whl (git-ignored) with the call
    python tools/device_wheels.py --check  # what the stages import that neither holds
    # there: python3 tools/gpu_check.py --wheels .whl ... installs them (docs/setup.md)
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# What the image lacks, or holds at another version than the lock's, that the stages need.
NEEDED = [
    "transformers", "tokenizers", "huggingface_hub", "httpx2", "httpcore2", "truststore",
    "jsonschema",
    "jsonschema-specifications", "referencing", "rpds-py", "snakemake",
    "snakemake-interface-common",
    "snakemake-interface-executor-plugins", "snakemake-interface-logger-plugins",
    "snakemake-interface-report-plugins", "snakemake-interface-scheduler-plugins",
    "snakemake-interface-storage-plugins", "argparse-dataclass", "conda-inject",
    "ConfigArgParse", "connection_pool", "docutils", "dpath", "fastjsonschema", "gitdb",
    "GitPython", "humanfriendly", "immutables", "jupyter_core", "nbformat", "platformdirs",
    "PuLP", "smart_open", "smmap", "throttler", "traitlets", "yte", "tenacity",
    "SQLAlchemy", "sqlmodel", "pydantic", "pydantic_core", "annotated-types",
    "typing-inspection", "greenlet", "tzdata",
    # reward.verifier math and calibrate's math timing: without them each check's worker
    # dies on its import and is respawned
    "math-verify", "latex2sympy2_extended", "antlr4-python3-runtime",
    # `rlcore fetch-model`'s GGUF reader (pure Python, 0.2 MB): no stage runs it, but
    # rlcore/policy/packaged.py imports it
    "gguf",
]
# The Python packages of the GPU machine's image, 'cuda' (/work/.library/device/KINDS.md,
# "Python packages already there", read 2026-11-17).
IMAGE_PACKAGES = """
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs
botorch build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy
coverage cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython
diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools formulaic
frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize
hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib
jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities linear-operator
lineax llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes
mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals networkx
ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc
nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand
nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13
nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript
opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging
pandas pathspec patsy peft pillow pip pluggy portalocker prometheus-client propcache protobuf
psutil pyarrow pybind11 py-cpuinfo pygments pyparsing pyproject-hooks pyre-extensions pytest
pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist python-dateutil
pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core
scikit-image scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools
shellingham simplejson six sortedcontainers statsmodels sympy tabulate tensorboard
tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz
torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers
treescope triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug
wheel wrapt xarray xxhash yarl zipp
"""
IMAGE = IMAGE_PACKAGES.split()
# Versions of some of them, as one session's pip list there read them (KINDS.md).
IMAGE_VERSIONS = {
    "accelerate": "1.15.0", "huggingface-hub": "1.33.0", "numpy": "2.5.2",
    "safetensors": "0.8.0", "tokenizers": "0.23.2", "torch": "2.11.0",
    "transformers": "5.17.0", "triton": "3.6.0",
}
# The machine the wheels are for: requirement markers are read for it.
MARKERS = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
           "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
           "implementation_name": "cpython", "platform_python_implementation": "CPython",
           "extra": ""}
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64", "manylinux_2_34_x86_64",
             "manylinux_2_31_x86_64", "manylinux_2_24_x86_64"]


def canonical(name: str) -> str:
    """A distribution's name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pins() -> dict[str, str]:
    """Package name (canonical) -> the lock's version."""
    out = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==", 1)
            out[canonical(name.strip())] = version.strip()
    return out


def top_level_imports(paths: Iterable[Path]) -> dict[str, set[Path]]:
    """The top-level module of every absolute import in these files -> the files: Python
    files parsed; in Snakemake's (Snakefile, *.smk) the import lines read."""
    found: dict[str, set[Path]] = {}
    for path in paths:
        text = path.read_text()
        if path.suffix == ".py":
            names = []
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, ast.Import):
                    names += [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names.append(node.module)
        else:
            names = re.findall(r"^\s*(?:import|from)\s+([\w.]+)", text, re.M)
        for name in names:
            found.setdefault(name.split(".")[0], set()).add(path)
    return found


def _local(module: str, files: set[Path]) -> bool:
    """This tree's own package, or a module beside the file that imports it."""
    return (ROOT / module).is_dir() or any((f.parent / f"{module}.py").is_file() for f in files)


def uncovered(modules: dict[str, set[Path]], needed: Iterable[str] = NEEDED,
              image: Iterable[str] = IMAGE) -> list[str]:
    """What the GPU machine would lack to import `modules` (module -> importing files):
    each distribution they come from, and what those need in turn (as installed here, at the
    lock's versions, for the machine's markers), is in the image or in `needed`; where the
    image's version is known, it meets what a carried package asks. Empty where all is."""
    from packaging.requirements import Requirement

    carried, held = {canonical(n) for n in needed}, {canonical(n) for n in image}
    dists = metadata.packages_distributions()
    problems, todo = [], []
    for module, files in sorted(modules.items()):
        if module in sys.stdlib_module_names or module == "__future__":
            continue
        if module in dists:
            todo += [canonical(d) for d in dists[module]]
        elif not _local(module, files):
            problems.append(f"module {module} (imported by {sorted(map(str, files))[0]}) "
                            "is installed in no distribution here")
    seen: set[str] = set()
    while todo:
        dist = todo.pop()
        if dist in seen:
            continue
        seen.add(dist)
        local = dist == "rlcore"
        if not local and dist not in carried and dist not in held:
            problems.append(f"{dist} is neither in the GPU machine's image nor carried")
        if dist in held and dist not in carried:
            continue  # the image's own, with what it needs
        try:
            requires = metadata.requires(dist) or []
        except metadata.PackageNotFoundError:
            problems.append(f"{dist} is not installed here: its requirements are unread")
            continue
        for text in requires:
            req = Requirement(text)
            if req.marker and not req.marker.evaluate(MARKERS):
                continue
            dep = canonical(req.name)
            version = IMAGE_VERSIONS.get(dep)
            if dep not in carried and version and not req.specifier.contains(version, True):
                problems.append(f"{dist} needs {req.name}{req.specifier}; the image has "
                                f"{version}: carry it")
            todo.append(dep)
    return problems


def stage_modules() -> dict[str, set[Path]]:
    """What tools/gpu_check.py's stages import: its sources' imports and the modules its
    steps run with `python -m`."""
    sys.path.insert(0, str(ROOT / "tools"))
    import gpu_check

    found = top_level_imports(gpu_check.stage_sources())
    for cmd in gpu_check.step_commands():
        if cmd[1] == "-m":  # python -m MODULE ...
            found.setdefault(cmd[2].split(".")[0], set()).add(Path(gpu_check.__file__))
    return found


def main() -> int:
    if sys.argv[1:] == ["--check"]:
        problems = uncovered(stage_modules())
        print("\n".join(problems) or "every module the stages import is in the image or "
              "carried")
        return 1 if problems else 0
    locked = pins()
    out = ROOT / ".whl"
    failed = []
    for name in NEEDED:
        want = f"{name}=={locked[canonical(name)]}"
        got = subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
             "--python-version", "3.12", "--implementation", "cp", "-d", str(out),
             *[a for p in PLATFORMS for a in ("--platform", p)], want],
            capture_output=True, text=True)
        if got.returncode:  # published as source only: pure Python, built into a wheel here
            got = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                                  "-w", str(out), want], capture_output=True, text=True)
        if got.returncode:
            failed.append(want)
    for want in failed:
        print(f"device_wheels: no wheel for {want}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
