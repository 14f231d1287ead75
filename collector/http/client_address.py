"""The visitor's address behind trusted proxies (for the datacenter bot rule and logs).

Behind a load balancer every connection comes from the balancer, so the
peer address says nothing about the visitor. When the peer is in
`trusted_proxies`, the address is the right-most entry of X-Forwarded-For that
is not itself a trusted proxy (entries further left can be forged by the
client). Without trusted proxies, or from any other peer, X-Forwarded-For is
ignored and the peer address is the visitor's. An entry may carry a port
(`203.0.113.5:8080`, `[2001:db8::1]:443`, as some balancers write it); an
entry that is no address at all (nginx writes `unknown`) leaves the visitor's
address unknown (None), never the proxy's own.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class TrustedProxies:
    def __init__(self, cidrs: Iterable[str]) -> None:
        self._networks: tuple[Network, ...] = tuple(
            _unmapped(ipaddress.ip_network(cidr, strict=False)) for cidr in cidrs
        )

    def __bool__(self) -> bool:
        return bool(self._networks)

    def trusted(self, address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address.strip())
        except ValueError:
            return False
        # An IPv6 listener sees IPv4 peers as ::ffff:a.b.c.d: compared with IPv4
        # networks as what they are (helper-74), as the datacenter list compares them.
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        return any(ip in network for network in self._networks)

    def client_address(self, peer: str | None, forwarded_for: str | None) -> str | None:
        if not self._networks or peer is None or not forwarded_for or not self.trusted(peer):
            return peer
        for entry in reversed(forwarded_for.split(",")):
            if not entry.strip():
                continue
            hop = address_of(entry)
            if hop is None:
                return None
            if not self.trusted(hop):
                return hop
        return peer


_MAPPED = ipaddress.IPv6Network("::ffff:0:0/96")


def _unmapped(network: Network) -> Network:
    """An IPv4-mapped network (`::ffff:10.0.0.0/104`, as an IPv6 listener's log writes
    peers) as the IPv4 network it stands for, which `trusted` compares addresses with."""
    if isinstance(network, ipaddress.IPv6Network) and network.subnet_of(_MAPPED):
        return ipaddress.IPv4Network((int(network.network_address) & 0xFFFFFFFF, network.prefixlen - 96))
    return network


def address_of(entry: str) -> str | None:
    """The IP address in an X-Forwarded-For entry, with or without a port; None for anything else."""
    text = entry.strip()
    if text.startswith("["):  # [v6] or [v6]:port
        text = text[1:].partition("]")[0]
    elif text.count(":") == 1:  # v4:port (a bare v6 address has several colons)
        text = text.partition(":")[0]
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        return None
