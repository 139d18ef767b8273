"""Certificates made in the test run: a CA, server certificates for 127.0.0.1/localhost,
client certificates, all written as PEM files (the broker reads files, as in production).

``Pki(directory)`` makes one CA; ``server()`` and ``client()`` issue leaf certificates
signed by it. EC P-256 keys keep generation fast on a loaded machine.
"""

from __future__ import annotations

import datetime
import ipaddress
import itertools
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_names = itertools.count(1)


@dataclass(frozen=True, slots=True)
class Issued:
    """A certificate and its key on disk, and its serial number."""

    cert: str
    key: str
    serial: int


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    """Most general first, as CAs write them (so RFC 4514 reads ``CN=..,O=..``)."""
    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization is not None:
        attributes.insert(0, x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(attributes)


class Pki:
    """One certificate authority writing its files under ``directory``."""

    def __init__(self, directory: Path, name: str = "topiary test CA") -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self._key = _key()
        self._name = _name(name)
        now = datetime.datetime.now(datetime.UTC)
        self._certificate = (
            x509.CertificateBuilder()
            .subject_name(self._name)
            .issuer_name(self._name)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self._key, hashes.SHA256())
        )
        stem = f"ca{next(_names)}"
        self.ca = str(directory / f"{stem}.crt")
        Path(self.ca).write_bytes(self._certificate.public_bytes(serialization.Encoding.PEM))

    def _issue(
        self,
        subject: x509.Name,
        usages: list[x509.ObjectIdentifier],
        names: list[x509.GeneralName],
        stem: str,
    ) -> Issued:
        key = _key()
        serial = x509.random_serial_number()
        now = datetime.datetime.now(datetime.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self._name)
            .public_key(key.public_key())
            .serial_number(serial)
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        )
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        certificate = builder.sign(self._key, hashes.SHA256())
        stem = f"{stem}{next(_names)}"
        cert = self.directory / f"{stem}.crt"
        key_path = self.directory / f"{stem}.key"
        cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
        _write_key(key_path, key)
        return Issued(str(cert), str(key_path), serial)

    def server(self, *, hosts: tuple[str, ...] = ("127.0.0.1", "localhost")) -> Issued:
        """A server certificate naming ``hosts`` (IP addresses as IP SANs)."""
        names: list[x509.GeneralName] = []
        for host in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        return self._issue(_name(hosts[0]), [ExtendedKeyUsageOID.SERVER_AUTH], names, "server")

    def client(self, common_name: str, organization: str | None = None) -> Issued:
        """A client certificate whose subject is ``CN=common_name[,O=organization]``."""
        return self._issue(
            _name(common_name, organization), [ExtendedKeyUsageOID.CLIENT_AUTH], [], "client"
        )

    def both(self, common_name: str, hosts: tuple[str, ...] = ("127.0.0.1",)) -> Issued:
        """A certificate usable as server and client (a broker in a mesh dials and listens)."""
        names: list[x509.GeneralName] = [x509.IPAddress(ipaddress.ip_address(h)) for h in hosts]
        usages = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
        return self._issue(_name(common_name), usages, names, "peer")
