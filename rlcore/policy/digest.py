"""A state's digest: what a version's readers check it arrived by, and what a run's final
state and the golden records are named by."""

from __future__ import annotations

import hashlib

import torch

# Bytes one device-to-host copy of `state_digest` carries at most: bounds the memory a
# digest of whole weights adds, while a state of adapters takes one copy per dtype.
DIGEST_COPY_BYTES = 256 * 2**20


def _copy_groups(state: dict[str, torch.Tensor]) -> dict[str, list[str]]:
    """Each tensor's name mapped to the names copied to the host with it: those of its device
    and dtype, in name order, up to `DIGEST_COPY_BYTES` a copy."""
    groups: dict[tuple[torch.device, torch.dtype], list[list[str]]] = {}
    sizes: dict[tuple[torch.device, torch.dtype], int] = {}
    for name in sorted(state):
        t = state[name]
        key, nbytes = (t.device, t.dtype), t.numel() * t.element_size()
        chunks = groups.setdefault(key, [[]])
        if chunks[-1] and sizes.get(key, 0) + nbytes > DIGEST_COPY_BYTES:
            chunks.append([])
            sizes[key] = 0
        chunks[-1].append(name)
        sizes[key] = sizes.get(key, 0) + nbytes
    return {n: chunk for chunks in groups.values() for chunk in chunks for n in chunk}


def _to_host(state: dict[str, torch.Tensor], names: list[str]) -> dict[str, torch.Tensor]:
    """The tensors `names` (one device and dtype) on the CPU, flat, through one copy."""
    with torch.no_grad():
        flat = [state[n].detach().reshape(-1) for n in names]
        host = (torch.cat(flat) if len(flat) > 1 else flat[0]).to("cpu")
    return dict(zip(names, host.split([f.numel() for f in flat]), strict=True))



def state_digest(state: dict[str, torch.Tensor]) -> str:
    """sha256 over the tensors in name order, each as its name, dtype, shape and raw bytes:
    equal exactly when every value is bit-for-bit equal, on any device."""
    digest = hashlib.sha256()
    copies = _copy_groups(state)
    host: dict[str, torch.Tensor] = {}
    for name in sorted(state):
        if name not in host:  # one blocking copy for the tensors that share its device and dtype
            host.update(_to_host(state, copies[name]))
        t, shape = host.pop(name), tuple(state[name].shape)
        digest.update(f"{name}|{t.dtype}|{shape}|".encode())
        digest.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return "sha256:" + digest.hexdigest()
