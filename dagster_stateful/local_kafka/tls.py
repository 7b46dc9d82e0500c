"""The TLS material of a secured development broker, generated when it is first started.

Owns `TlsMaterial`: a private certificate authority, the broker's certificate (signed by it, valid
for 127.0.0.1 only, so that a client naming the broker otherwise sees a host-name mismatch, as it
would in production), and client certificates for mutual TLS (`client_certificate`), whose common
name the broker maps to the principal `User:<name>`. Everything is PEM, which the broker (its
`PEM` keystore and truststore types) and librdkafka (`ssl.ca.location`, `ssl.certificate.location`,
`ssl.key.location`) both read. Private keys are written readable by their owner only, and the
material of one home is made once and kept, so clients keep trusting a restarted broker.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from dagster_stateful.local_processes import HOST

VALID_DAYS = 825
CA_NAME = "dagster-stateful development CA"


@dataclass(frozen=True)
class ClientCertificate:
    """A mutual-TLS client's certificate and key files (principal `User:<name>`)."""

    name: str
    certificate: Path
    key: Path


class TlsMaterial:
    """The CA, broker and client certificates under `directory`."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    @property
    def ca_certificate(self) -> Path:
        """What a client trusts (librdkafka's `ssl.ca.location`)."""
        return self.directory / "ca.pem"

    @property
    def broker_keystore(self) -> Path:
        """The broker's private key and certificate chain in one PEM file."""
        return self.directory / "broker.pem"

    @property
    def _ca_key(self) -> Path:
        return self.directory / "ca.key"

    def ensure(self) -> TlsMaterial:
        """Make the CA and the broker's certificate unless they exist."""
        if self.ca_certificate.exists() and self.broker_keystore.exists() and self._ca_key.exists():
            return self
        self.directory.mkdir(parents=True, exist_ok=True)
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_name = _name(CA_NAME)
        ca = (
            _builder(ca_name, ca_name, ca_key.public_key())
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
            .sign(ca_key, hashes.SHA256())
        )
        _write_private(self._ca_key, _key_pem(ca_key))
        self.ca_certificate.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
        broker_key = ec.generate_private_key(ec.SECP256R1())
        broker = (
            _builder(_name("broker"), ca_name, broker_key.public_key())
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(HOST))]), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        _write_private(self.broker_keystore, _key_pem(broker_key) + broker.public_bytes(serialization.Encoding.PEM))
        return self

    def client_certificate(self, name: str) -> ClientCertificate:
        """A certificate for mutual TLS with common name `name`, signed by the CA (made once)."""
        files = ClientCertificate(name, self.directory / f"client-{name}.pem", self.directory / f"client-{name}.key")
        if files.certificate.exists() and files.key.exists():
            return files
        ca_key = serialization.load_pem_private_key(self._ca_key.read_bytes(), password=None)
        assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
        key = ec.generate_private_key(ec.SECP256R1())
        certificate = (
            _builder(_name(name), _name(CA_NAME), key.public_key())
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        _write_private(files.key, _key_pem(key))
        files.certificate.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
        return files


def untrusted_ca_certificate(path: Path) -> Path:
    """A CA certificate that signed nothing the broker presents (for testing what an untrusted
    broker certificate looks like to a client)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = _name("an unrelated CA")
    certificate = (
        _builder(name, name, key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(key, hashes.SHA256())
    )
    path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    return path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _builder(subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
    )


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    """Unencrypted PKCS#8, the form the broker's PEM keystore reads without a key password."""
    pkcs8 = serialization.PrivateFormat.PKCS8
    return key.private_bytes(serialization.Encoding.PEM, pkcs8, serialization.NoEncryption())


def _write_private(path: Path, content: bytes) -> None:
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as file:
        file.write(content)
