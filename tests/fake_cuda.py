"""A stand-in for the parts of `torch.cuda` that rlcore's CUDA paths call, for CPU tests.

`FakeCuda.install` replaces streams, events, graphs, device contexts, `set_device`,
`set_stream` and `synchronize` with fakes that record which device each call named, in which
thread, and when a capture was under way; the computation itself stays on the CPU. The
checks it makes on the spot are CUDA's rules: a replay or a stream's work on a device other
than the one that is current fails, as two captures at once and a device-wide wait during a
capture do.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from rlcore.policy.device import CAPTURE_LOCK


def index_of(device: Any) -> int:
    d = torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
    assert d.type in ("cuda", "cpu"), d
    return d.index or 0


@dataclass
class Call:
    what: str
    device: int
    thread: str
    capturing: bool  # a capture was under way in the process when it was made


class FakeStream:
    def __init__(self, cuda: FakeCuda, device: int):
        self.cuda, self.device = cuda, device

    def wait_stream(self, other: FakeStream) -> None:
        self.cuda.log("wait_stream", self.device)

    def synchronize(self) -> None:
        self.cuda.log("stream_synchronize", self.device)

    def record_event(self) -> FakeEvent:
        self.cuda.log("record_event", self.device)
        return FakeEvent(self.cuda, self.device)


class FakeEvent:
    def __init__(self, cuda: FakeCuda, device: int):
        self.cuda, self.device = cuda, device

    def synchronize(self) -> None:
        self.cuda.log("event_synchronize", self.device)


class FakeGraph:
    def __init__(self, cuda: FakeCuda):
        self.cuda = cuda
        self.device: int | None = None

    def replay(self) -> None:
        # cudaGraphLaunch goes to the current device's current stream
        current = self.cuda.current()
        self.cuda.log("replay", current)
        assert current == self.device, (
            f"a graph captured on cuda:{self.device} replayed with cuda:{current} current")


@dataclass
class FakeCuda:
    """What the fakes saw; `current` devices are per thread, as CUDA's are."""

    calls: list[Call] = field(default_factory=list)
    captures: list[tuple[float, float, str]] = field(default_factory=list)  # start, end, thread
    capture_pause_s: float = 0.0  # a capture's length: widens the window a race needs
    _local: threading.local = field(default_factory=threading.local)
    _legacy: dict[int, FakeStream] = field(default_factory=dict)  # each device's default
    _capturing: int = 0
    _guard: threading.Lock = field(default_factory=threading.Lock)

    def current(self) -> int:
        return getattr(self._local, "device", 0)

    def log(self, what: str, device: int) -> None:
        with self._guard:
            self.calls.append(Call(what, device, threading.current_thread().name,
                                   self._capturing > 0))

    def devices(self, *what: str) -> set[int]:
        """The devices the calls named (of the kinds `what`, or all)."""
        return {c.device for c in self.calls if not what or c.what in what}

    # --- the replaced functions -----------------------------------------------------------
    def set_device(self, device: Any) -> None:
        self._local.device = index_of(device)
        self.log("set_device", self._local.device)

    @contextlib.contextmanager
    def device(self, device: Any) -> Iterator[None]:
        before = self.current()
        self._local.device = index_of(device)
        self.log("device", self._local.device)
        try:
            yield
        finally:
            self._local.device = before

    def current_stream(self, device: Any = None) -> FakeStream:
        """The thread's stream on `device` (`set_stream`), else the device's legacy default
        stream, which every thread shares."""
        assert device is not None, "current_stream() with no device: the current one's"
        d = index_of(device)
        own = getattr(self._local, "streams", {}).get(d)
        return own if own is not None else self._legacy.setdefault(d, FakeStream(self, d))

    def set_stream(self, s: FakeStream) -> None:
        # torch makes the stream's device current; the fake asks that it already be
        assert s.device == self.current(), (
            f"cuda:{s.device}'s stream made current with cuda:{self.current()} current")
        self.log("set_stream", s.device)
        self._local.streams = {**getattr(self._local, "streams", {}), s.device: s}

    def stream_class(self, device: Any = None, **_: Any) -> FakeStream:
        assert device is not None, "Stream() with no device: on the current one"
        return FakeStream(self, index_of(device))

    @contextlib.contextmanager
    def stream(self, s: FakeStream) -> Iterator[None]:
        assert s.device == self.current(), (
            f"work queued on cuda:{s.device}'s stream with cuda:{self.current()} current")
        self.log("stream", s.device)
        yield

    def synchronize(self, device: Any = None) -> None:
        dev = self.current() if device is None else index_of(device)
        self.log("device_synchronize", dev)
        assert self._capturing == 0, "a device-wide synchronize while a stream captures"

    @contextlib.contextmanager
    def graph(self, g: FakeGraph, pool: Any = None, stream: FakeStream | None = None,
              capture_error_mode: str = "global") -> Iterator[None]:
        assert stream is not None, "a capture on torch's shared default capture stream"
        assert stream.device == self.current(), (
            f"a capture on cuda:{stream.device}'s stream with cuda:{self.current()} current")
        assert CAPTURE_LOCK._is_owned(), "a capture outside CAPTURE_LOCK"  # type: ignore[attr-defined]
        with self._guard:
            assert self._capturing == 0, "two captures at once in one process"
            self._capturing += 1
        t0 = time.perf_counter()
        self.log("capture", stream.device)
        g.device = stream.device
        try:
            time.sleep(self.capture_pause_s)
            yield
        finally:
            with self._guard:
                self._capturing -= 1
            self.captures.append((t0, time.perf_counter(), threading.current_thread().name))

    def install(self, monkeypatch: pytest.MonkeyPatch) -> FakeCuda:
        cuda = torch.cuda
        monkeypatch.setattr(cuda, "set_device", self.set_device)
        monkeypatch.setattr(cuda, "device", self.device)
        monkeypatch.setattr(cuda, "current_stream", self.current_stream)
        monkeypatch.setattr(cuda, "set_stream", self.set_stream)
        monkeypatch.setattr(cuda, "Stream", self.stream_class)
        monkeypatch.setattr(cuda, "stream", self.stream)
        monkeypatch.setattr(cuda, "synchronize", self.synchronize)
        monkeypatch.setattr(cuda, "graph", self.graph)
        monkeypatch.setattr(cuda, "CUDAGraph", lambda: FakeGraph(self))
        monkeypatch.setattr(cuda, "graph_pool_handle", lambda: ("pool", id(self)))
        return self
