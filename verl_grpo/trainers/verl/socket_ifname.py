"""`python -m verl_grpo.trainers.verl.socket_ifname IP`: the name of this machine's network interface that holds the
IPv4 address IP, for NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME on a multi-node run. Prints it and exits 0; exits 1
with one line on stderr when no interface holds IP (the collectives then pick their own). Standard library only:
node images need not ship iproute2."""

from __future__ import annotations

import fcntl
import socket
import struct
import sys

SIOCGIFADDR = 0x8915
"""Linux ioctl: an interface's IPv4 address."""


def interface_address(name: str) -> str | None:
    """The IPv4 address of interface `name`, or None when it has none."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])


def interface_of(ip: str) -> str | None:
    """The interface holding `ip`, else None."""
    return next((name for _, name in socket.if_nameindex() if interface_address(name) == ip), None)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m verl_grpo.trainers.verl.socket_ifname IP", file=sys.stderr)
        return 2
    name = interface_of(args[0])
    if name is None:
        print(f"socket_ifname: no interface holds {args[0]}; NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME left unset",
              file=sys.stderr)
        return 1
    print(name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
