"""Which webhook URLs may be called (SSRF): http or https, a host, no credentials in the URL,
and, unless KOPS_WEBHOOK_ALLOW_PRIVATE is set, every address the host resolves to on the public
internet. A delivery connects to the address that was checked (the Host header and TLS name
stay the URL's), so a name that resolves elsewhere a moment later is not followed there."""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import SplitResult, urlsplit

import httpx

DEFAULT_PORTS = {"http": 80, "https": 443}


class UrlRefused(ValueError):
    """The URL may not be called; the message says why, for a person."""


@dataclass(frozen=True, slots=True)
class Target:
    """Where a delivery goes: the URL as given, and the checked address it connects to."""

    url: str
    host: str
    address: str

    @property
    def pinned_url(self) -> str:
        """The URL with its host replaced by the checked address."""
        parts = urlsplit(self.url)
        address = f"[{self.address}]" if ":" in self.address else self.address
        netloc = address if parts.port is None else f"{address}:{parts.port}"
        return parts._replace(netloc=netloc).geturl()

    @property
    def host_header(self) -> str:
        """The URL's host and port as the Host header carries them (IDNA-encoded)."""
        return httpx.URL(self.url).netloc.decode("ascii")


def parse(url: str) -> SplitResult:
    """The URL's parts, or UrlRefused for one a webhook cannot use."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError as exc:
        raise UrlRefused(f"not a valid URL: {exc}") from None
    if parts.scheme not in DEFAULT_PORTS:
        raise UrlRefused("a webhook URL must start with http:// or https://")
    if not parts.hostname:
        raise UrlRefused("a webhook URL needs a host")
    if parts.username is not None or parts.password is not None:
        raise UrlRefused("a webhook URL may not hold credentials; deliveries are signed instead")
    if port == 0:
        raise UrlRefused("a webhook URL may not use port 0")
    if parts.fragment:
        raise UrlRefused("a webhook URL may not have a #fragment")
    try:  # as a delivery will send it: the host IDNA-encoded
        httpx.URL(url.strip())
        parts.hostname.encode("idna")
    except (httpx.InvalidURL, UnicodeError, ValueError):
        raise UrlRefused(f"{parts.hostname!r} is not a valid host name") from None
    return parts


NAT64 = ipaddress.ip_network("64:ff9b::/96")  # an IPv4 address reached through a NAT64 gateway
NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")  # a network's own translation prefix


def is_public(address: str) -> bool:
    """True for an address on the public internet: not private, loopback, link-local,
    site-local, multicast, reserved or unspecified. An IPv6 address that carries an IPv4 one
    (IPv4-mapped, IPv4-compatible, NAT64, 6to4, Teredo) is judged by the IPv4 address it
    reaches."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.is_site_local or ip in NAT64_LOCAL:
            return False
        carried = _carried_ipv4(ip)
        if carried is not None:
            return all(_public(v4) for v4 in carried)
    return _public(ip)


def _public(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    return ip.is_global and not ip.is_multicast


def _carried_ipv4(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address] | None:
    if ip.ipv4_mapped is not None:
        return [ip.ipv4_mapped]
    if ip.sixtofour is not None:
        return [ip.sixtofour]
    if ip.teredo is not None:
        return list(ip.teredo)
    if ip in NAT64 or (int(ip) >> 32 == 0 and int(ip) > 1):  # NAT64; ::a.b.c.d (compatible)
        return [ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)]
    return None


def resolve(url: str, *, allow_private: bool) -> Target:
    """The address to deliver `url` to. UrlRefused when the URL is not usable or a resolved
    address is not public (and private ones are not allowed); OSError when the name does not
    resolve now."""
    parts = parse(url)
    host = parts.hostname
    assert host is not None
    port = parts.port or DEFAULT_PORTS[parts.scheme]
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (UnicodeError, ValueError):  # a name no resolver takes (parse() lets few through)
        raise UrlRefused(f"{host!r} is not a valid host name") from None
    addresses = list(dict.fromkeys(str(info[4][0]) for info in found))
    if not addresses:
        raise OSError(f"{host} has no address")
    if not allow_private:
        refused = [a for a in addresses if not is_public(a)]
        if refused:
            raise UrlRefused(
                f"{host} resolves to {refused[0]}, a private, loopback or link-local address; "
                "set KOPS_WEBHOOK_ALLOW_PRIVATE=true to deliver inside your network"
            )
    return Target(url=url.strip(), host=host, address=addresses[0])
