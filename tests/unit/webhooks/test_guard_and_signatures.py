"""Which webhook addresses are public, how a delivery is pinned to the address that was
checked, and the signature a receiver verifies (sign → verify, and what it refuses)."""

from __future__ import annotations

import pytest

from knowledgeops.client import SignatureInvalid, sign, verify_signature
from knowledgeops.webhooks import guard


@pytest.mark.parametrize(
    ("address", "public"),
    [
        ("93.184.215.14", True),
        ("2606:2800:21f:cb07:6820:80da:af6b:8b2c", True),
        ("127.0.0.1", False),
        ("10.0.0.8", False),
        ("172.16.5.4", False),
        ("192.168.1.1", False),
        ("169.254.169.254", False),  # the cloud metadata service
        ("100.64.0.1", False),  # carrier-grade NAT
        ("0.0.0.0", False),
        ("224.0.0.1", False),  # multicast
        ("::1", False),
        ("fe80::1%eth0", False),
        ("fd00::1", False),
        ("::ffff:10.0.0.1", False),  # IPv4-mapped private
        ("::ffff:93.184.215.14", True),
        ("64:ff9b::a9fe:a9fe", False),  # NAT64 to 169.254.169.254
        ("64:ff9b::5db8:d70e", True),  # NAT64 to a public address
        ("64:ff9b:1::1", False),  # a network's own NAT64 prefix
        ("2002:a00:1::", False),  # 6to4 of 10.0.0.1
        ("::7f00:1", False),  # IPv4-compatible 127.0.0.1
        ("fec0::1", False),  # site-local
        ("2001:0:4136:e378:8000:63bf:3fff:fdd2", False),  # Teredo
        ("::", False),
    ],
)
def test_only_public_addresses_are_public(address: str, public: bool) -> None:
    assert guard.is_public(address) is public


def test_a_private_address_is_allowed_only_when_the_deployment_says_so() -> None:
    with pytest.raises(guard.UrlRefused, match="KOPS_WEBHOOK_ALLOW_PRIVATE"):
        guard.resolve("http://127.0.0.1:8080/hook", allow_private=False)
    target = guard.resolve("http://127.0.0.1:8080/hook?x=1", allow_private=True)
    assert target.address == "127.0.0.1"
    assert target.pinned_url == "http://127.0.0.1:8080/hook?x=1"


def test_a_delivery_connects_to_the_checked_address_under_the_urls_name() -> None:
    target = guard.Target("https://hooks.example.com/in?a=b", "hooks.example.com", "203.0.113.9")
    assert target.pinned_url == "https://203.0.113.9/in?a=b"
    assert target.host_header == "hooks.example.com"
    idna = guard.Target("https://bücher.example/in", "bücher.example", "203.0.113.9")
    assert idna.host_header == "xn--bcher-kva.example"
    six = guard.Target("http://hooks.example.com:8443/x", "hooks.example.com", "2001:db8::5")
    assert six.pinned_url == "http://[2001:db8::5]:8443/x"
    assert six.host_header == "hooks.example.com:8443"


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("hooks.example.com/x", "http:// or https://"),
        ("file:///etc/passwd", "http:// or https://"),
        ("https:///path-only", "needs a host"),
        ("https://me:secret@hooks.example.com/", "credentials"),
        ("https://hooks.example.com:0/", "port 0"),
        ("https://hooks.example.com:99999/", "not a valid URL"),
        ("https://hooks.example.com/#frag", "fragment"),
        ("HTTP://\u0080", "not a valid host name"),  # found by schemathesis: was a 500
        ("https://a..b/", "not a valid host name"),
    ],
)
def test_urls_a_webhook_cannot_use_are_refused_with_the_reason(url: str, reason: str) -> None:
    with pytest.raises(guard.UrlRefused, match=reason):
        guard.parse(url)


def test_a_signature_verifies_for_its_secret_and_body_only_and_not_when_old() -> None:
    body = b'{"id":"e1","type":"job.completed"}'
    header = sign("whsec_abc", body, 1_700_000_000)
    assert header.startswith("t=1700000000,v1=")
    assert verify_signature("whsec_abc", body, header, now=1_700_000_100) == 1_700_000_000
    headers = {"Kops-Signature": header, "Content-Type": "application/json"}
    assert verify_signature("whsec_abc", body, headers, now=1_700_000_000)
    for secret, signed, now, reason in [
        ("whsec_other", body, 1_700_000_000, "does not match"),
        ("whsec_abc", body + b" ", 1_700_000_000, "does not match"),
        ("whsec_abc", body, 1_700_000_301, "tolerance 300 s"),
    ]:
        with pytest.raises(SignatureInvalid, match=reason):
            verify_signature(secret, signed, header, now=now)
    with pytest.raises(SignatureInvalid, match="no Kops-Signature"):
        verify_signature("whsec_abc", body, {"Content-Type": "application/json"})
    with pytest.raises(SignatureInvalid, match="does not match"):
        verify_signature("whsec_abc", body, "t=1700000000,v1=é", now=1_700_000_000)
    with pytest.raises(SignatureInvalid, match="no timestamp"):
        verify_signature("whsec_abc", body, "v1=deadbeef")
