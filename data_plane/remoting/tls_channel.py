"""TLS for remoting connections on the OpenSSL that ``cryptography`` ships.

The standard library's ``ssl`` runs on the system's OpenSSL, which may be years older than the
release ``cryptography`` bundles: on the machine the benchmarks run on, the system's 3.0 encrypts
AES-256-GCM at about 3.5 GB/s and the bundled release at 6.5 GB/s (it has the VAES code path),
and the event loop's TLS transport copies every record into and out of Python objects on top.
A ``TlsChannel`` sits between the socket's transport and a connection's protocol and runs the
TLS session through ``cryptography``'s OpenSSL bindings (the ones pyOpenSSL is built on) over
memory BIOs: ciphertext read from the socket goes into OpenSSL, plaintext comes out straight
into the protocol's own buffer (``asyncio.BufferedProtocol.get_buffer``); what the protocol
writes is encrypted where it lies (small pieces of one ``writelines`` joined into one record) and
the records go to the socket's transport in a buffer of their size, handed over, not copied.
``python -m benchmarks.tls_transport`` measures both.

What it promises, as the standard library's transport does:

* the server proves its certificate chain; a client verifies it against its CA file (or the
  system's trust store) and the name or address it connected to, unless told not to verify;
* TLS 1.2 at least, no compression, no renegotiation, forward-secret AEAD suites only;
* the protocol hears of the connection (``connection_made``) only once the handshake is done,
  so a peer that fails or never finishes it costs nothing beyond this object; a handshake has
  ``handshake_timeout_s`` to finish;
* reading is bounded: at most ``READ_BYTES`` of ciphertext is taken from the socket at a time
  (into one buffer per thread, not one per connection) and all of it is decrypted before the
  next read; a protocol that pauses reading pauses the socket, so OpenSSL then holds at most one
  read's worth.

``available()`` is False when ``cryptography`` lacks a binding this needs, or when
``ORBIT_TLS_ENGINE=stdlib`` asks for the standard library's transport; callers then use that.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import ssl
import threading
from collections.abc import Callable
from typing import Any, Final

log = logging.getLogger(__name__)

READ_BYTES: Final = 256 * 1024  # ciphertext taken from the socket at most, a read (a buffer per thread)
SMALL_PIECE_BYTES: Final = 16 * 1024  # writelines joins pieces below this into one record
ENGINE_ENV: Final = "ORBIT_TLS_ENGINE"  # "stdlib": the standard library's transport
# TLS 1.2's suites (TLS 1.3 has only AEAD suites): forward-secret AEAD, as the standard library's default.
CIPHERS_TLS12: Final = b"ECDHE+AESGCM:ECDHE+CHACHA20:!aNULL:!eNULL:!aDSS:!SHA1:!AESCCM"

_NEEDED: Final = (
    "SSL_CTX_new",
    "SSL_CTX_free",
    "SSL_CTX_set_min_proto_version",
    "SSL_CTX_set_options",
    "SSL_CTX_set_mode",
    "SSL_CTX_set_cipher_list",
    "SSL_CTX_set_verify",
    "SSL_CTX_load_verify_locations",
    "SSL_CTX_use_certificate_chain_file",
    "SSL_CTX_use_PrivateKey_file",
    "SSL_CTX_check_private_key",
    "SSL_new",
    "SSL_free",
    "SSL_set_bio",
    "SSL_set_accept_state",
    "SSL_set_connect_state",
    "SSL_set_tlsext_host_name",
    "SSL_get0_param",
    "X509_VERIFY_PARAM_set1_host",
    "X509_VERIFY_PARAM_set1_ip",
    "X509_VERIFY_PARAM_set_hostflags",
    "SSL_do_handshake",
    "SSL_read",
    "SSL_write",
    "SSL_shutdown",
    "SSL_get_error",
    "SSL_get_verify_result",
    "SSL_get_version",
    "SSL_get_current_cipher",
    "SSL_CIPHER_get_name",
    "X509_verify_cert_error_string",
    "BIO_new",
    "BIO_s_mem",
    "BIO_read",
    "BIO_write",
    "BIO_get_mem_data",
    "ERR_get_error",
    "ERR_reason_error_string",
    "ERR_clear_error",
)

_binding: Any = None  # (lib, ffi) once loaded; False when it cannot be
_uncleared: Any = None  # ffi.new without zeroing: buffers OpenSSL fills at once


def _openssl() -> Any:
    """``(lib, ffi)`` of cryptography's OpenSSL, or None when a binding this needs is missing."""
    global _binding, _uncleared
    if _binding is None:
        try:
            from cryptography.hazmat.bindings.openssl.binding import Binding

            b = Binding()
            missing = [name for name in _NEEDED if not hasattr(b.lib, name)]
            if missing:
                log.info("cryptography's OpenSSL lacks %s: TLS runs on the standard library", ", ".join(missing))
                _binding = False
            else:
                _uncleared = b.ffi.new_allocator(should_clear_after_alloc=False)
                _binding = (b.lib, b.ffi)
        except ImportError as e:
            log.info("cryptography's OpenSSL bindings cannot be loaded (%s): TLS runs on the standard library", e)
            _binding = False
    return _binding or None


class _ReadBuffers(threading.local):
    """One ciphertext buffer per thread, shared by its channels: the socket's transport reads into
    it and ``buffer_updated`` hands all of it to OpenSSL at once, so no channel holds one while
    idle (a listener may have thousands of connections)."""

    view: memoryview | None = None
    ptr: Any = None


_read_buffers = _ReadBuffers()


def _read_buffer(ffi: Any) -> tuple[memoryview, Any]:
    if _read_buffers.view is None:
        buf = bytearray(READ_BYTES)
        _read_buffers.view = memoryview(buf)
        _read_buffers.ptr = ffi.from_buffer(buf)
    return _read_buffers.view, _read_buffers.ptr


def available() -> bool:
    return os.environ.get(ENGINE_ENV, "") != "stdlib" and _openssl() is not None


def _errors(lib: Any, ffi: Any) -> str:
    """OpenSSL's queued errors as text (the queue emptied)."""
    reasons = []
    while True:
        code = lib.ERR_get_error()
        if code == 0:
            break
        text = lib.ERR_reason_error_string(code)
        reasons.append(ffi.string(text).decode(errors="replace") if text != ffi.NULL else f"error {code:#x}")
    return "; ".join(reasons) or "unknown error"


class ChannelContext:
    """One SSL_CTX: a server's (its certificate chain and key) or a client's (what it trusts).
    Made once and shared by every connection of a listener or a client."""

    __slots__ = ("ctx", "server_side", "verify")

    def __init__(self, ctx: Any, *, server_side: bool, verify: bool) -> None:
        self.ctx = ctx
        self.server_side = server_side
        self.verify = verify

    @classmethod
    def _new(cls, *, server_side: bool) -> tuple[Any, Any, Any]:
        ob = _openssl()
        if ob is None:
            raise ssl.SSLError("cryptography's OpenSSL bindings are not available")
        lib, ffi = ob
        raw = lib.SSL_CTX_new(lib.TLS_server_method() if server_side else lib.TLS_client_method())
        if raw == ffi.NULL:
            raise ssl.SSLError(f"SSL_CTX_new: {_errors(lib, ffi)}")
        ctx = ffi.gc(raw, lib.SSL_CTX_free)
        lib.SSL_CTX_set_min_proto_version(ctx, lib.TLS1_2_VERSION)
        options = lib.SSL_OP_NO_COMPRESSION | lib.SSL_OP_NO_RENEGOTIATION
        if server_side:
            options |= lib.SSL_OP_CIPHER_SERVER_PREFERENCE
        lib.SSL_CTX_set_options(ctx, options)
        # Idle connections hand their record buffers back (many tenants' clients sit idle).
        lib.SSL_CTX_set_mode(ctx, lib.SSL_MODE_RELEASE_BUFFERS)
        if lib.SSL_CTX_set_cipher_list(ctx, CIPHERS_TLS12) != 1:
            raise ssl.SSLError(f"SSL_CTX_set_cipher_list: {_errors(lib, ffi)}")
        return ctx, lib, ffi

    @classmethod
    def for_server(cls, cert_file: str, key_file: str) -> ChannelContext:
        """A listener's context; ``ssl.SSLError`` when the chain or the key cannot be used."""
        ctx, lib, ffi = cls._new(server_side=True)
        if lib.SSL_CTX_use_certificate_chain_file(ctx, os.fsencode(cert_file)) != 1:
            raise ssl.SSLError(f"cannot load the certificate chain {cert_file}: {_errors(lib, ffi)}")
        if lib.SSL_CTX_use_PrivateKey_file(ctx, os.fsencode(key_file), lib.SSL_FILETYPE_PEM) != 1:
            raise ssl.SSLError(f"cannot load the key {key_file}: {_errors(lib, ffi)}")
        if lib.SSL_CTX_check_private_key(ctx) != 1:
            raise ssl.SSLError(f"the key {key_file} does not match {cert_file}: {_errors(lib, ffi)}")
        lib.SSL_CTX_set_verify(ctx, lib.SSL_VERIFY_NONE, ffi.NULL)
        return cls(ctx, server_side=True, verify=False)

    @classmethod
    def for_client(cls, ca_file: str | None = None, *, verify: bool = True) -> ChannelContext:
        """A client's context: trusts ``ca_file`` (else the system's trust store, as the standard
        library finds it: ``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` or the system OpenSSL's paths);
        ``verify=False`` checks nothing (a test against a server of one's own)."""
        ctx, lib, ffi = cls._new(server_side=False)
        if verify:
            if ca_file:
                cafile, capath = ca_file, None
            else:
                paths = ssl.get_default_verify_paths()
                cafile, capath = paths.cafile, paths.capath
            locations = [ffi.NULL if p is None else os.fsencode(p) for p in (cafile, capath)]
            if (cafile or capath) and lib.SSL_CTX_load_verify_locations(ctx, *locations) != 1:
                raise ssl.SSLError(f"cannot load the CA file {ca_file}: {_errors(lib, ffi)}")
            lib.SSL_CTX_set_verify(ctx, lib.SSL_VERIFY_PEER, ffi.NULL)
        else:
            lib.SSL_CTX_set_verify(ctx, lib.SSL_VERIFY_NONE, ffi.NULL)
        return cls(ctx, server_side=False, verify=verify)


class TlsChannel(asyncio.BufferedProtocol, asyncio.Transport):
    """A TLS session between a socket's transport (this is its protocol) and a connection's
    protocol (this is its transport). ``app_factory`` makes that protocol once the handshake is
    done; ``waiter`` (a client's) gets None then, or the handshake's error."""

    def __init__(
        self,
        context: ChannelContext,
        app_factory: Callable[[], asyncio.BaseProtocol],
        *,
        server_hostname: str | None = None,
        handshake_timeout_s: float = 10.0,
        waiter: asyncio.Future[None] | None = None,
        on_handshake_end: Callable[[TlsChannel], None] | None = None,
    ) -> None:
        lib, ffi = _openssl()
        self._lib = lib
        self._ffi = ffi
        self._context = context
        self._app_factory = app_factory
        self._app: Any = None  # the connection's protocol, once the handshake is done
        self._buffered = False  # the protocol reads through get_buffer / buffer_updated
        self._server_hostname = server_hostname
        self._handshake_timeout_s = handshake_timeout_s
        self._waiter = waiter
        self._on_handshake_end = on_handshake_end
        self._raw: Any = None  # the socket's transport
        self._ssl: Any = None
        self._rbio: Any = None  # ciphertext in (OpenSSL reads the peer's records from it)
        self._wbio: Any = None  # ciphertext out
        self._in_view, self._in_ptr = _read_buffer(ffi)
        self._scratch: Any = None  # a plain protocol's plaintext buffer (data_received)
        self._timer: asyncio.TimerHandle | None = None
        self._ready = False
        self._closing = False
        self._reading_paused = False
        self._read_scheduled = False
        self._failure: Exception | None = None  # why the channel failed, for connection_lost

    # --- the socket's side ------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        lib, ffi = self._lib, self._ffi
        self._raw = transport
        raw_ssl = lib.SSL_new(self._context.ctx)
        if raw_ssl == ffi.NULL:
            self._fail(ssl.SSLError(f"SSL_new: {_errors(lib, ffi)}"))
            return
        self._ssl = ffi.gc(raw_ssl, lib.SSL_free)
        self._rbio = lib.BIO_new(lib.BIO_s_mem())
        self._wbio = lib.BIO_new(lib.BIO_s_mem())
        lib.SSL_set_bio(self._ssl, self._rbio, self._wbio)  # (the SSL object owns and frees both)
        self._timer = asyncio.get_running_loop().call_later(self._handshake_timeout_s, self._handshake_timed_out)
        if self._context.server_side:
            lib.SSL_set_accept_state(self._ssl)
            return
        lib.SSL_set_connect_state(self._ssl)
        name = self._server_hostname
        if name:
            try:
                packed = ipaddress.ip_address(name).packed
            except ValueError:
                packed = None
            if packed is None:
                lib.SSL_set_tlsext_host_name(self._ssl, name.encode("idna"))
            if self._context.verify:
                param = lib.SSL_get0_param(self._ssl)
                if packed is None:
                    lib.X509_VERIFY_PARAM_set_hostflags(param, lib.X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS)
                    ok = lib.X509_VERIFY_PARAM_set1_host(param, name.encode("idna"), 0)
                else:
                    ok = lib.X509_VERIFY_PARAM_set1_ip(param, packed, len(packed))
                if ok != 1:
                    self._fail(ssl.SSLError(f"cannot check the server's name {name!r}: {_errors(lib, ffi)}"))
                    return
        self._handshake()

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._in_view

    def buffer_updated(self, nbytes: int) -> None:
        if self._ssl is None or (self._closing and self._app is None):
            return
        self._lib.BIO_write(self._rbio, self._in_ptr, nbytes)  # (a memory BIO takes all of it)
        if self._ready:
            self._decrypt()
        else:
            self._handshake()

    def eof_received(self) -> bool | None:
        if not self._ready:
            self._fail(ConnectionResetError("the peer closed the connection during the TLS handshake"))
            return False
        self._decrypt()  # what came before the end
        if self._app is not None and not self._closing:
            self._app.eof_received()
        return False  # the transport closes; a half-open TLS session is not kept

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()
        self._end_handshake()
        self._closing = True
        if self._app is not None:
            app, self._app = self._app, None
            app.connection_lost(exc or self._failure)
        elif self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(exc or ConnectionResetError("the connection closed during the TLS handshake"))
        self._raw = None

    def pause_writing(self) -> None:
        if self._app is not None:
            self._app.pause_writing()

    def resume_writing(self) -> None:
        if self._app is not None:
            self._app.resume_writing()

    # --- the handshake ----------------------------------------------------------------------------
    def _handshake(self) -> None:
        lib, ffi = self._lib, self._ffi
        lib.ERR_clear_error()  # (SSL_get_error reads the queue: it must hold only this call's errors)
        r = lib.SSL_do_handshake(self._ssl)
        err = 0 if r == 1 else lib.SSL_get_error(self._ssl, r)  # (asked before anything else runs)
        self._flush()
        if r == 1:
            self._handshake_done()
            return
        if err == lib.SSL_ERROR_WANT_READ:
            return
        verified = lib.SSL_get_verify_result(self._ssl)
        if verified != lib.X509_V_OK and self._context.verify:
            lib.ERR_clear_error()
            why = ffi.string(lib.X509_verify_cert_error_string(verified)).decode(errors="replace")
            exc: Exception = ssl.SSLCertVerificationError(
                f"[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: {why}"
            )
        else:
            exc = ssl.SSLError(f"TLS handshake failed: {_errors(lib, ffi)}")
        self._fail(exc)

    def _handshake_done(self) -> None:
        self._cancel_timer()
        self._ready = True
        self._end_handshake()
        try:
            app = self._app_factory()
        except Exception as e:  # a refused connection (a listener's limits)
            self._fail(e)
            return
        self.set_protocol(app)
        app.connection_made(self)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)
        if not self._closing:
            self._decrypt()  # records that came with the handshake's last flight

    def _handshake_timed_out(self) -> None:
        self._timer = None
        if not self._ready:
            self._fail(TimeoutError(f"TLS handshake not finished in {self._handshake_timeout_s:g} s"))

    def _end_handshake(self) -> None:
        done, self._on_handshake_end = self._on_handshake_end, None
        if done is not None:
            done(self)

    def _fail(self, exc: Exception) -> None:
        self._cancel_timer()
        self._end_handshake()
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(exc)
        elif self._context.server_side and not self._ready:
            log.info("a connection's TLS handshake failed: %s", exc)
        else:
            log.warning("TLS connection failed: %s", exc)
        self._closing = True
        self._failure = exc
        if self._raw is not None:
            self._raw.abort()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # --- reading ----------------------------------------------------------------------------------
    def _decrypt(self) -> None:
        """Decrypt what OpenSSL holds into the protocol until it wants more or pauses."""
        self._read_scheduled = False
        lib = self._lib
        ssl_obj = self._ssl
        lib.ERR_clear_error()
        while not self._reading_paused and self._app is not None and not self._closing:
            if self._buffered:
                buf = self._app.get_buffer(-1)
            else:
                if self._scratch is None:
                    self._scratch = bytearray(READ_BYTES)
                buf = self._scratch
            size = len(buf)
            if size == 0:
                raise RuntimeError("get_buffer() returned an empty buffer")
            ptr = self._ffi.from_buffer(buf, require_writable=True)
            got = 0
            err = 0  # SSL_get_error's answer for the read that stopped (asked at once: a write resets it)
            while got < size:
                r = lib.SSL_read(ssl_obj, ptr + got, size - got)
                if r <= 0:
                    err = lib.SSL_get_error(ssl_obj, r)
                    break
                got += r
            if got:
                if self._buffered:
                    self._app.buffer_updated(got)
                else:
                    self._app.data_received(bytes(memoryview(buf)[:got]))
            if not err:
                continue  # the buffer filled: there may be more
            if err == lib.SSL_ERROR_WANT_READ:
                self._flush()  # (a key update's answer, if OpenSSL made one)
                return
            if err == lib.SSL_ERROR_ZERO_RETURN:  # the peer's close_notify
                if self._app is not None and not self._closing:
                    self._app.eof_received()
                self.close()
                return
            self._fail(ssl.SSLError(f"TLS read failed: {_errors(lib, self._ffi)}"))
            return

    # --- the protocol's side: asyncio.Transport ---------------------------------------------------
    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._encrypt(data):
            self._flush()

    def writelines(self, list_of_data: Any) -> None:
        """Small pieces are joined (one TLS record for several), large ones encrypted as they are."""
        small: list[Any] = []
        for data in list_of_data:
            n = len(data)
            if n < SMALL_PIECE_BYTES:
                small.append(data)
                continue
            if small:
                if not self._encrypt(b"".join(small)):
                    return
                small.clear()
            if not self._encrypt(data):
                return
        if small and not self._encrypt(b"".join(small)):
            return
        self._flush()

    def _encrypt(self, data: Any) -> bool:
        """``data`` into OpenSSL as TLS records (not yet handed to the socket); False: closed."""
        if self._closing or not self._ready:
            return False
        n = len(data)
        if n == 0:
            return True
        lib = self._lib
        lib.ERR_clear_error()
        if lib.SSL_write(self._ssl, self._ffi.from_buffer(data), n) <= 0:
            self._fail(ssl.SSLError(f"TLS write failed: {_errors(lib, self._ffi)}"))
            return False
        return True

    def _flush(self) -> None:
        """Hand what OpenSSL encrypted to the socket's transport: read into a buffer of its size
        that is handed over, not copied (a memory BIO answers how much it holds)."""
        raw = self._raw
        if raw is None:
            return
        lib, ffi = self._lib, self._ffi
        wbio = self._wbio
        while (pending := lib.BIO_get_mem_data(wbio, ffi.NULL)) > 0:
            out = _uncleared("char[]", pending)
            k = lib.BIO_read(wbio, out, pending)
            if k <= 0:
                return
            raw.write(memoryview(ffi.buffer(out, k)))  # (the view keeps ``out`` alive)

    def can_write_eof(self) -> bool:
        return False

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        self._cancel_timer()
        if self._ready and self._ssl is not None:
            self._lib.SSL_shutdown(self._ssl)  # close_notify
            self._lib.ERR_clear_error()
            self._flush()
        if self._raw is not None:
            self._raw.close()

    def abort(self) -> None:
        self._closing = True
        self._cancel_timer()
        if self._raw is not None:
            self._raw.abort()

    def is_closing(self) -> bool:
        return self._closing or self._raw is None or self._raw.is_closing()

    def pause_reading(self) -> None:
        if self._reading_paused:
            return
        self._reading_paused = True
        if self._raw is not None:
            self._raw.pause_reading()

    def resume_reading(self) -> None:
        if not self._reading_paused:
            return
        self._reading_paused = False
        if self._raw is not None:
            self._raw.resume_reading()
        if not self._read_scheduled:  # what OpenSSL still holds, without waiting for the socket
            self._read_scheduled = True
            asyncio.get_running_loop().call_soon(self._decrypt)

    def is_reading(self) -> bool:
        return not self._reading_paused and not self.is_closing()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        if self._raw is not None:
            self._raw.set_write_buffer_limits(high=high, low=low)

    def get_write_buffer_size(self) -> int:
        return self._raw.get_write_buffer_size() if self._raw is not None else 0

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._raw.get_write_buffer_limits() if self._raw is not None else (0, 0)

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._app = protocol
        self._buffered = isinstance(protocol, asyncio.BufferedProtocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._app  # type: ignore[no-any-return]

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "ssl_object":
            return self if self._ready else default
        if name == "cipher":
            return self.cipher()
        if self._raw is None:
            return default
        return self._raw.get_extra_info(name, default)

    def version(self) -> str | None:
        """The TLS version negotiated ("TLSv1.3"), as ``ssl.SSLObject.version``."""
        if not self._ready or self._ssl is None:
            return None
        return self._ffi.string(self._lib.SSL_get_version(self._ssl)).decode()  # type: ignore[no-any-return]

    def cipher(self) -> str | None:
        """The suite negotiated ("TLS_AES_256_GCM_SHA384")."""
        if not self._ready or self._ssl is None:
            return None
        c = self._lib.SSL_get_current_cipher(self._ssl)
        return None if c == self._ffi.NULL else self._ffi.string(self._lib.SSL_CIPHER_get_name(c)).decode()


async def open_connection(
    app_factory: Callable[[], asyncio.BaseProtocol],
    host: str,
    port: int,
    context: ChannelContext,
    *,
    server_hostname: str | None = None,
    local_addr: tuple[str, int] | None = None,
    handshake_timeout_s: float = 10.0,
) -> TlsChannel:
    """Connect to ``host:port`` and finish the TLS handshake (its errors raise, as ``ssl.SSLError``
    or ``OSError``); the protocol ``app_factory`` makes is connected by then."""
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[None] = loop.create_future()
    channel = TlsChannel(
        context,
        app_factory,
        server_hostname=server_hostname if server_hostname is not None else host,
        handshake_timeout_s=handshake_timeout_s,
        waiter=waiter,
    )
    transport, _ = await loop.create_connection(lambda: channel, host, port, local_addr=local_addr)
    try:
        await waiter
    except BaseException:
        transport.abort()
        raise
    return channel
