"""Test hosts on one machine: network namespaces joined to it by veth pairs (iproute2, root).

A chaos test puts workers in two of them, then cuts one host's link to see what crosses a
network: :func:`host_pair` makes two hosts for a ``with`` block (the test is skipped where
namespaces cannot be made) and removes them afterwards, whatever happens.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import subprocess
import uuid
from collections.abc import Iterator

import pytest

__all__ = ["Host", "host_pair", "netns_unavailable"]


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


class Host:
    """A network namespace joined to this machine by a veth pair on a /30 of its own."""

    def __init__(self, tag: str, subnet: str) -> None:
        self.netns = f"tf-{tag}"
        self.outer = f"tf{tag}h"  # the host end; ≤ 15 characters
        self.inner = f"tf{tag}n"
        self.outer_ip = f"{subnet}.1"  # subnet: the first three octets of a /30
        self.inner_ip = f"{subnet}.2"

    def create(self) -> None:
        _ip("netns", "add", self.netns)
        _ip("link", "add", self.outer, "type", "veth", "peer", "name", self.inner)
        _ip("link", "set", self.inner, "netns", self.netns)
        _ip("addr", "add", f"{self.outer_ip}/30", "dev", self.outer)
        _ip("link", "set", self.outer, "up")
        _ip("-n", self.netns, "addr", "add", f"{self.inner_ip}/30", "dev", self.inner)
        _ip("-n", self.netns, "link", "set", self.inner, "up")
        _ip("-n", self.netns, "link", "set", "lo", "up")

    def cut(self) -> None:
        _ip("link", "set", self.outer, "down")

    def restore(self) -> None:
        _ip("link", "set", self.outer, "up")

    def destroy(self) -> None:
        # Deleting one end of a veth deletes both; the namespace goes last.
        for args in (("link", "del", self.outer), ("netns", "del", self.netns)):
            subprocess.run(["ip", *args], capture_output=True, timeout=10)


def netns_unavailable() -> str | None:
    """Why network namespaces cannot be made here, or None when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is not installed"
    probe = f"tf-probe-{uuid.uuid4().hex[:6]}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


@contextlib.contextmanager
def host_pair(first: str, second: str) -> Iterator[tuple[Host, Host]]:
    """Two hosts, on /30s in the ``first`` and ``second`` /16 (``"10.213"``): a caller per
    /16, so tests running at once never share an address. Skips the test without netns."""
    reason = netns_unavailable()
    if reason:
        pytest.skip(f"two hosts need network namespaces: {reason}")
    tag = uuid.uuid4().hex[:5]
    octet = random.randrange(1, 250)
    pair = (Host(f"{tag}a", f"{first}.{octet}"), Host(f"{tag}b", f"{second}.{octet}"))
    try:
        for host in pair:
            host.create()
        yield pair
    finally:
        for host in pair:
            host.destroy()
