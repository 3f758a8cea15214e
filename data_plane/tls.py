"""TLS for Orbit's listeners and clients: modes, SSL contexts, and a local certificate authority.

Listeners (name servers, brokers, the HA link, the control plane) take one of RocketMQ's modes:

    disabled    plain TCP only
    permissive  TLS and plain TCP on the same port: a connection whose first byte opens a TLS
                handshake record (0x16) is served over TLS, any other over plain TCP
    enforcing   TLS only (a plain client's first frame fails the handshake; it is closed)

with a certificate chain and key (PEM files). Clients verify the server's certificate by default
(the system's trust store, or a CA file such as ``orbit dev up --tls``'s), with hostname checks.

``make_local_ca`` writes what ``orbit dev up --tls`` uses: a CA (``ca.pem``; its key stays in
``ca-key.pem``, 0600) and a server certificate for 127.0.0.1, ::1 and localhost signed by it
(``server.pem``, ``server-key.pem``, 0600). EC P-256 keys, SHA-256 signatures, made with the
``cryptography`` package.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import ssl
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Literal

if TYPE_CHECKING:
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec

TlsMode = Literal["disabled", "permissive", "enforcing"]
TLS_MODES: Final[tuple[str, ...]] = ("disabled", "permissive", "enforcing")
TLS_RECORD_HANDSHAKE: Final = 0x16  # the first byte of a TLS ClientHello record
CA_FILE: Final = "ca.pem"
CA_KEY_FILE: Final = "ca-key.pem"
CERT_FILE: Final = "server.pem"
KEY_FILE: Final = "server-key.pem"
LOCAL_NAMES: Final = ("localhost",)
LOCAL_IPS: Final = ("127.0.0.1", "::1")


class TlsConfigError(ValueError):
    """TLS settings that cannot be used; the message says which and why."""


@dataclass(frozen=True, slots=True)
class ServerTls:
    """A listener's TLS: its mode and, unless disabled, its certificate chain and key files."""

    mode: TlsMode = "disabled"
    cert_file: str = ""
    key_file: str = ""

    def validate(self) -> ServerTls:
        if self.mode not in TLS_MODES:
            raise TlsConfigError(f"tls mode {self.mode!r} is not one of {', '.join(TLS_MODES)}")
        if self.mode != "disabled" and not (self.cert_file and self.key_file):
            raise TlsConfigError(f"tls mode {self.mode} needs a certificate and a key file")
        return self

    @property
    def enabled(self) -> bool:
        return self.mode != "disabled"

    def context(self) -> ssl.SSLContext | None:
        """The server-side SSLContext (None when disabled); TLS 1.2 at least."""
        if not self.enabled:
            return None
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            ctx.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError) as e:
            raise TlsConfigError(f"cannot load the certificate {self.cert_file} and key {self.key_file}: {e}") from None
        return ctx


class ClientSslContext(ssl.SSLContext):
    """A client's SSLContext that remembers what it trusts (``ca_file``, ``verify``), so that a
    remoting client can build the same trust for its own TLS channel
    (``data_plane.remoting.tls_channel``)."""

    ca_file: str | None = None
    verify: bool = True


def client_context(*, ca_file: str | None = None, verify: bool = True) -> ssl.SSLContext:
    """A client SSLContext: verifies the server's certificate and name against ``ca_file`` (else
    the system's trust store); ``verify=False`` only for a test against a server of one's own."""
    ctx = ClientSslContext(ssl.PROTOCOL_TLS_CLIENT)  # (certificate and name checks on)
    if ca_file:
        ctx.load_verify_locations(cafile=ca_file)
    else:
        ctx.load_default_certs(ssl.Purpose.SERVER_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.ca_file = ca_file or None
    ctx.verify = verify
    if not verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


def client_context_from_env(env: os._Environ[str] | dict[str, str] | None = None) -> ssl.SSLContext | None:
    """``ORBIT_TLS=1`` (system trust store) or ``ORBIT_TLS_CA=<file>`` (that CA): a client
    context; neither: None (plain TCP)."""
    env = os.environ if env is None else env
    ca = env.get("ORBIT_TLS_CA", "")
    if ca:
        return client_context(ca_file=ca)
    if env.get("ORBIT_TLS", "") not in ("", "0", "false"):
        return client_context()
    return None


def http_ssl() -> ssl.SSLContext | bool:
    """aiohttp's ``ssl=`` for HTTPS clients (token endpoint, JWKS, usage reports): the context
    ``ORBIT_TLS_CA`` names, else True (aiohttp's default verification, the system's trust store)."""
    return client_context_from_env() or True


def _write_key(path: str, key: ec.EllipticCurvePrivateKey) -> None:
    from cryptography.hazmat.primitives import serialization

    from data_plane.auth.files import write_atomic  # (data_plane.auth imports this module)

    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    write_atomic(path, pem, mode=0o600)


def _name(common_name: str) -> x509.Name:
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    return x509.Name(
        [x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Orbit"), x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    )


def make_local_ca(directory: str, *, days: int = 825, now: dt.datetime | None = None) -> dict[str, str]:
    """A CA and a server certificate for this machine's loopback names in ``directory`` (made
    once; kept while they are valid for another day). Returns the four files' paths."""
    # Imported here: clients and servers import this module for their TLS contexts only.
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID

    from data_plane.auth.files import write_atomic  # (data_plane.auth imports this module)

    paths = {name: os.path.join(directory, name) for name in (CA_FILE, CA_KEY_FILE, CERT_FILE, KEY_FILE)}
    now = now or dt.datetime.now(dt.UTC)
    if all(os.path.exists(p) for p in paths.values()):
        with open(paths[CERT_FILE], "rb") as f:
            cert = x509.load_pem_x509_certificate(f.read())
        if cert.not_valid_after_utc > now + dt.timedelta(days=1):
            return paths
    os.makedirs(directory, mode=0o700, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("Orbit local CA")
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
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
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    alt = [x509.DNSName(n) for n in LOCAL_NAMES] + [x509.IPAddress(ipaddress.ip_address(a)) for a in LOCAL_IPS]
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("Orbit local server"))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(alt), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    _write_key(paths[CA_KEY_FILE], ca_key)
    _write_key(paths[KEY_FILE], key)
    write_atomic(paths[CA_FILE], ca_cert.public_bytes(serialization.Encoding.PEM), mode=0o644)
    write_atomic(paths[CERT_FILE], cert.public_bytes(serialization.Encoding.PEM), mode=0o644)
    return paths
