"""Stream tokens (spec 5.4): minted, verified, refused with a reason."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from collector.access.stream_tokens import StreamTokenRefused, key_fingerprint, mint, verify
from storage.env import Storage
from storage.stream_secret import stream_token_secret

SECRET = b"s" * 32
HTTP_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # what a WebSocket subprotocol may hold


def test_a_minted_token_verifies_until_it_expires() -> None:
    token = mint(SECRET, client_id="acme", api_key="cs_live_acme01", now_s=1000, ttl_s=300)
    assert token.startswith("csst_") and HTTP_TOKEN.fullmatch(token)
    assert "cs_live_acme01" not in token  # only a fingerprint of the key travels
    claims = verify(SECRET, token, now_s=1299)
    assert (claims.clientId, claims.keyFingerprint, claims.expiresAt) == ("acme", key_fingerprint("cs_live_acme01"), 1300)
    with pytest.raises(StreamTokenRefused, match="expired"):
        verify(SECRET, token, now_s=1300)


@pytest.mark.parametrize(
    ("mangle", "reason"),
    [
        (lambda t: "", "missing"),
        (lambda t: t.replace("csst_", "cs_live_"), "malformed"),
        (lambda t: t + ".x", "malformed"),
        (lambda t: t[:8] + "!" + t[8:], "malformed"),  # outside the alphabet: not another spelling
        (lambda t: t + "=", "malformed"),  # padded: not another spelling either
        (lambda t: t[:-2] + ("AA" if not t.endswith("AA") else "BB"), "invalid"),  # forged MAC
        # another tenant's claims under this token's MAC
        (lambda t: mint(SECRET, client_id="evil", api_key="k", now_s=1000).split(".")[0] + "." + t.split(".")[1],
         "invalid"),
    ],
)
def test_refusals_name_their_reason(mangle, reason: str) -> None:  # type: ignore[no-untyped-def]
    token = mint(SECRET, client_id="acme", api_key="k", now_s=1000)
    with pytest.raises(StreamTokenRefused) as refused:
        verify(SECRET, mangle(token), now_s=1000)
    assert refused.value.reason == reason


def test_another_directory_s_secret_does_not_verify(tmp_path: Path) -> None:
    first, second = Storage(tmp_path / "a"), Storage(tmp_path / "b")
    try:
        secret = stream_token_secret(first)
        assert stream_token_secret(first) == secret and len(secret) == 32  # created once, then kept
        token = mint(secret, client_id="acme", api_key="k", now_s=1000)
        with pytest.raises(StreamTokenRefused, match="invalid"):
            verify(stream_token_secret(second), token, now_s=1000)
    finally:
        first.close()
        second.close()


def test_ttl_bounds() -> None:
    for ttl in (0, 86_401):
        with pytest.raises(ValueError):
            mint(SECRET, client_id="acme", api_key="k", now_s=0, ttl_s=ttl)


def test_a_token_minted_by_a_clock_far_ahead_is_refused() -> None:
    # helper-108: minted a year fast, a token verified for a year
    year = 365 * 86_400
    token = mint(SECRET, client_id="acme", api_key="k", now_s=1_795_000_000 + year, ttl_s=300)
    with pytest.raises(StreamTokenRefused, match="expired"):
        verify(SECRET, token, now_s=1_795_000_000)
    longest = mint(SECRET, client_id="acme", api_key="k", now_s=1_795_000_000 + 200, ttl_s=86_400)
    assert verify(SECRET, longest, now_s=1_795_000_000).expiresAt == 1_795_086_600  # (a few minutes ahead: fine)
