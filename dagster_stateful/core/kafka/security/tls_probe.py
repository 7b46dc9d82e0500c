"""Why a broker's TLS certificate failed verification: not trusted, or not valid for the host name.

Owns `diagnose_certificate`. librdkafka 2.16 reports both cases alike ("certificate verify failed:
broker certificate could not be verified"), so the engine makes one TLS handshake of its own with
Python's `ssl`, trusting what the client trusts (`ssl.ca.location` or `ssl.ca.pem`, else the
system's CAs) and checking the host name as librdkafka does (unless
`ssl.endpoint.identification.algorithm` is `none`); OpenSSL's verdict says which case it is. Only
after a handshake failed, once per failure, with a short timeout; it sends no credentials (no
client certificate, nothing after the handshake).
"""

from __future__ import annotations

import socket
import ssl
from dataclasses import dataclass
from pathlib import Path

PROBE_TIMEOUT = 3.0
HOSTNAME_MISMATCH = 62
IP_ADDRESS_MISMATCH = 64
"""OpenSSL's X509_V_ERR_HOSTNAME_MISMATCH and X509_V_ERR_IP_ADDRESS_MISMATCH."""


@dataclass(frozen=True)
class TrustSettings:
    """What a client trusts, from its librdkafka settings (CA certificates are public: no secret here)."""

    ca_location: str | None = None
    ca_pem: str | None = None
    check_host: bool = True

    @property
    def source(self) -> str:
        """Where the trusted CAs come from, as a person reads it."""
        if self.ca_pem:
            return "ssl.ca.pem"
        if self.ca_location and self.ca_location != "probe":
            return f"ssl.ca.location ({self.ca_location})"
        return "the system's CA certificates (ssl.ca.location is not set)"


@dataclass(frozen=True)
class CertificateVerdict:
    trusted: bool | None
    """Whether the certificate chain verifies against the client's CAs; None: the probe could not tell."""
    host_matches: bool | None
    """Whether the certificate is valid for the host name connected to; None: not known."""
    detail: str
    """OpenSSL's verification message, or why the probe could not tell."""
    names: tuple[str, ...] = ()
    """What the certificate is valid for (e.g. "IP Address 127.0.0.1"), when it was read."""


def split_address(address: str) -> tuple[str, int]:
    """("host", port) of "host:port" (an IPv6 host in brackets)."""
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def diagnose_certificate(address: str, trust: TrustSettings, timeout: float = PROBE_TIMEOUT) -> CertificateVerdict:
    """Verify the certificate of the TLS listener at `address` ("host:port") as the client would."""
    try:
        host, port = split_address(address)
        _handshake(_context(trust, trust.check_host), host, port, timeout)
    except ssl.SSLCertVerificationError as error:
        detail = str(error.verify_message)
        if error.verify_code in (HOSTNAME_MISMATCH, IP_ADDRESS_MISMATCH):
            return CertificateVerdict(True, False, detail, _names(trust, host, port, timeout))
        return CertificateVerdict(False, None, detail)
    except (OSError, ValueError) as error:  # ssl.SSLError is an OSError
        return CertificateVerdict(None, None, f"the engine's own check could not tell: {error}")
    return CertificateVerdict(True, True, "the engine's own check found the certificate valid")


def _context(trust: TrustSettings, check_host: bool) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = check_host
    if trust.ca_pem:
        context.load_verify_locations(cadata=trust.ca_pem)
    elif trust.ca_location and trust.ca_location != "probe":
        location = Path(trust.ca_location)
        if location.is_dir():
            context.load_verify_locations(capath=str(location))
        else:
            context.load_verify_locations(cafile=str(location))
    else:
        context.load_default_certs()
    return context


def _handshake(context: ssl.SSLContext, host: str, port: int, timeout: float) -> dict | None:
    """The peer's certificate (decoded) after a TLS handshake with host:port."""
    with (
        socket.create_connection((host, port), timeout=timeout) as connection,
        context.wrap_socket(connection, server_hostname=host) as tls,
    ):
        return tls.getpeercert()


def _names(trust: TrustSettings, host: str, port: int, timeout: float) -> tuple[str, ...]:
    """The names a trusted certificate holds (read without the host name check); () if unreadable."""
    try:
        certificate = _handshake(_context(trust, check_host=False), host, port, timeout) or {}
    except (OSError, ValueError):
        return ()
    alternatives = tuple(f"{kind} {value}" for kind, value in certificate.get("subjectAltName", ()))
    if alternatives:
        return alternatives
    subject = dict(pair for entry in certificate.get("subject", ()) for pair in entry)
    return (f"common name {subject['commonName']}",) if "commonName" in subject else ()
