#!/usr/bin/python3
"""egress-proxies prefix dialer: each outgoing connection leaves from its own address of a routed IPv6 prefix.

squid stays the proxy users talk to (authentication, client ACLs, port 3128) and hands every request
to this process as its parent peer (`cache_peer 127.0.0.1 parent 3129 ... login=PASSTHRU`). This
process opens the upstream connection bound to a source address picked from the prefix:

  random  a fresh random address of the prefix for every connection;
  sticky  one stable address per client: per proxy user (the Basic credential squid passes on with
          login=PASSTHRU), else per client address (the X-Egress-Prefix-Client header squid adds),
          else per peer address;
  pool    one of the fixed addresses prefix+1 .. prefix+count, picked at random per connection.

The kernel needs no per-address configuration: a `local` route for the whole prefix on lo makes
replies to any of its addresses arrive here, and IP_FREEBIND (beside net.ipv6.ip_nonlocal_bind=1,
which cloud-init sets) lets a socket bind an address no interface carries.

Destinations that have no IPv6 address are reached over IPv4 from the machine's own address: a
prefix of IPv6 addresses cannot give an IPv4 site more than one exit address.

Standard library only, Python 3.9 or newer (cloud-init itself is Python, so every cloud image has
it). Handles CONNECT and absolute-form plain HTTP requests, one request per client connection (squid
is told `server_persistent_connections off`, so it never reuses one). Nothing about a request or a
credential is logged.
"""
import argparse
import asyncio
import base64
import hashlib
import ipaddress
import os
import secrets
import signal
import socket
import sys
from urllib.parse import urlsplit

# Linux's IP_FREEBIND (include/uapi/linux/in.h); Python's socket module does not name it.
IP_FREEBIND = 15
HEAD_LIMIT = 64 * 1024
HEAD_TIMEOUT = 30.0
CLIENT_HEADER = "x-egress-prefix-client"
# Hop-by-hop headers (RFC 9110 section 7.6.1) and ours: never passed to the origin server.
HOP_BY_HOP = {
    "connection",
    "proxy-connection",
    "keep-alive",
    "proxy-authorization",
    "proxy-authenticate",
    "te",
    "trailer",
    "upgrade",
    CLIENT_HEADER,
}
STICKY_SALT = b"egress-proxies prefix dialer sticky v1\0"


class RequestError(Exception):
    """A request this dialer answers itself; the text is safe to show (no credentials in it)."""

    def __init__(self, status, text):
        super().__init__(text)
        self.status = status
        self.text = text


class SourcePicker:
    """Picks the source address of each upstream connection."""

    def __init__(self, prefix, mode, count):
        self.prefix = prefix
        self.mode = mode
        self.count = count
        # Offset 0 is the prefix's Subnet-Router anycast address (RFC 4291 2.6.1): never a source.
        self.offsets = prefix.num_addresses - 1

    def pick(self, client_key):
        if self.mode == "pool":
            offset = secrets.randbelow(self.count) + 1
        elif self.mode == "sticky":
            # Keyed by the prefix too, so two proxies sharing users still exit from their own prefix.
            digest = hashlib.sha256(STICKY_SALT + str(self.prefix).encode() + b"\0" + client_key).digest()
            offset = int.from_bytes(digest[:16], "big") % self.offsets + 1
        else:
            offset = secrets.randbelow(self.offsets) + 1
        return self.prefix.network_address + offset


def client_key(headers, peer):
    """What sticky mode keys on: the proxy user, else the client address squid reports, else the peer."""
    authorization = last_header(headers, "proxy-authorization")
    if authorization is not None:
        scheme, _, credential = authorization.strip().partition(" ")
        if scheme.lower() == "basic":
            try:
                user = base64.b64decode(credential.strip(), validate=True).split(b":", 1)[0]
                return b"user\0" + user
            except ValueError:
                pass
        # Any other scheme: the whole credential, hashed like a user name (never stored or logged).
        return b"credential\0" + authorization.encode("latin-1", "replace")
    # The last copy: squid adds its own after dropping any a client sent.
    client = last_header(headers, CLIENT_HEADER)
    if client is not None and client.strip() != "":
        return b"client\0" + client.strip().encode("latin-1", "replace")
    return b"peer\0" + str(peer).encode()


def last_header(headers, name):
    found = None
    for key, value in headers:
        if key.lower() == name:
            found = value
    return found


def parse_head(raw):
    try:
        text = raw.decode("latin-1")
    except UnicodeDecodeError:  # pragma: no cover - latin-1 decodes every byte
        raise RequestError(400, "bad request head")
    lines = text.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise RequestError(400, "bad request line")
    headers = []
    for line in lines[1:]:
        if line == "":
            continue
        name, colon, value = line.partition(":")
        if colon == "" or name == "" or name != name.strip():
            raise RequestError(400, "bad header line")
        headers.append((name, value.strip()))
    return parts[0], parts[1], headers


def split_host_port(authority, default_port):
    if authority.startswith("["):
        host, _, rest = authority[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
    else:
        host, _, port_text = authority.rpartition(":") if ":" in authority else (authority, "", "")
    if port_text == "":
        port = default_port
    elif port_text.isdigit():
        port = int(port_text)
    else:
        raise RequestError(400, "bad port")
    if host == "" or port is None or not 0 < port < 65536:
        raise RequestError(400, "bad host or port")
    return host, port


class Dialer:
    def __init__(self, picker, connect_timeout, idle_timeout, max_connections):
        self.picker = picker
        self.connect_timeout = connect_timeout
        self.idle_timeout = idle_timeout
        self.slots = asyncio.Semaphore(max_connections)

    async def handle(self, reader, writer):
        peer = writer.get_extra_info("peername")
        peer_address = peer[0] if peer else "unknown"
        upstream = None
        try:
            if self.slots.locked():
                # Bounded: past the limit a client is told to come back, not queued without end.
                raise RequestError(503, "dialer busy")
            async with self.slots:
                try:
                    raw = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT)
                except asyncio.LimitOverrunError:
                    raise RequestError(431, "request head too large")
                except (asyncio.IncompleteReadError, asyncio.TimeoutError):
                    return
                method, target, headers = parse_head(raw[:-4])
                key = client_key(headers, peer_address)
                if method == "CONNECT":
                    host, port = split_host_port(target, None)
                    upstream = await self.open_upstream(host, port, key)
                    writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
                    await writer.drain()
                    await self.relay(reader, writer, upstream, body=None, plain=False)
                else:
                    head, host, port, body = plain_request(method, target, headers)
                    upstream = await self.open_upstream(host, port, key)
                    upstream[1].write(head)
                    await self.relay(reader, writer, upstream, body=body, plain=True)
        except RequestError as error:
            await answer(writer, error.status, error.text)
        except (ConnectionError, OSError):
            pass
        except Exception as error:  # noqa: BLE001 - one bad request must not reach the loop's logger
            # The type only: a message could quote request bytes.
            print("prefix dialer: internal error (%s)" % type(error).__name__, file=sys.stderr)
            await answer(writer, 500, "internal error")
        finally:
            for stream in (writer, upstream[1] if upstream else None):
                if stream is not None:
                    stream.close()

    async def open_upstream(self, host, port, key):
        loop = asyncio.get_running_loop()
        try:
            infos = await asyncio.wait_for(
                loop.getaddrinfo(host, port, type=socket.SOCK_STREAM), self.connect_timeout
            )
        except asyncio.TimeoutError:
            raise RequestError(504, "name lookup timed out")
        except socket.gaierror:
            raise RequestError(502, "name does not resolve")
        addresses = [ipaddress.ip_address(info[4][0].split("%")[0]) for info in infos]
        allowed = [address for address in addresses if self.reachable(address)]
        # IPv6 first: only an IPv6 destination can see the prefix. IPv4-only sites get the machine's
        # address. An IPv6 connection that fails at once (no route, refused) falls back to IPv4 like
        # any client trying a name's next address; a timeout does not, so one request waits once.
        six = [address for address in allowed if address.version == 6][:1]
        four = [address for address in allowed if address.version == 4][:1]
        if not six and not four:
            raise RequestError(403, "destination not allowed")
        for destination in six + four:
            sock = self.source_socket(destination, key)
            try:
                await asyncio.wait_for(loop.sock_connect(sock, (str(destination), port)), self.connect_timeout)
                return await asyncio.open_connection(sock=sock, limit=HEAD_LIMIT)
            except asyncio.TimeoutError:
                sock.close()
                raise RequestError(504, "upstream connect timed out")
            except OSError:
                sock.close()
        raise RequestError(502, "upstream connect failed")

    def source_socket(self, destination, key):
        """An unconnected socket: bound to an address of the prefix for IPv6, the kernel's choice for IPv4."""
        if destination.version == 4:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        else:
            sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
            try:
                # With IP_FREEBIND the bind works even before the sysctl is applied.
                sock.setsockopt(socket.SOL_IP, IP_FREEBIND, 1)
                sock.bind((str(self.picker.pick(key)), 0))
            except OSError:
                sock.close()
                raise RequestError(502, "cannot bind a source address of the prefix")
        sock.setblocking(False)
        return sock

    def reachable(self, address):
        """Never the machine itself: a request back into squid or this dialer would loop."""
        if address.version == 6 and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        if address.is_loopback or address.is_unspecified or address.is_multicast:
            return False
        return not (address.version == 6 and address in self.picker.prefix)

    async def relay(self, client_reader, client_writer, upstream, body, plain):
        """Copies both ways until the upstream side ends (plain HTTP) or both do (CONNECT), or both idle."""
        upstream_reader, upstream_writer = upstream
        loop = asyncio.get_running_loop()
        last = [loop.time()]

        async def pump(reader, writer, limit):
            remaining = limit
            try:
                while remaining is None or remaining > 0:
                    size = 65536 if remaining is None else min(65536, remaining)
                    data = await reader.read(size)
                    if not data:
                        break
                    last[0] = loop.time()
                    if remaining is not None:
                        remaining -= len(data)
                    writer.write(data)
                    await writer.drain()
                if writer.can_write_eof() and limit is None:
                    writer.write_eof()
            except (ConnectionError, OSError):
                pass

        # A plain request's body: exactly Content-Length bytes (any more belongs to no request we
        # serve); a chunked body streams until the response ends. CONNECT: everything.
        upward = asyncio.ensure_future(pump(client_reader, upstream_writer, body))
        downward = asyncio.ensure_future(pump(upstream_reader, client_writer, None))
        tasks = {upward, downward}
        try:
            while True:
                pending = {task for task in tasks if not task.done()}
                # A plain request is over when its response is: the upstream closes after it.
                if not pending or (plain and downward.done()):
                    break
                await asyncio.wait(pending, timeout=self.idle_timeout, return_when=asyncio.FIRST_COMPLETED)
                if loop.time() - last[0] >= self.idle_timeout:
                    break
        finally:
            for task in tasks:
                task.cancel()


def plain_request(method, target, headers):
    """The origin-form request head for an absolute-form proxy request, and how much body follows."""
    url = urlsplit(target)
    if url.scheme.lower() != "http" or url.netloc == "":
        raise RequestError(400, "only absolute http:// URLs and CONNECT are proxied")
    host, port = split_host_port(url.netloc.rpartition("@")[2], 80)
    path = (url.path or "/") + ("?" + url.query if url.query else "")
    named = set()
    for name, value in headers:
        if name.lower() == "connection":
            named.update(token.strip().lower() for token in value.split(","))
    kept = [(name, value) for name, value in headers if name.lower() not in HOP_BY_HOP | named]
    if not any(name.lower() == "host" for name, _ in kept):
        kept.insert(0, ("Host", url.netloc.rpartition("@")[2]))
    chunked = any(name.lower() == "transfer-encoding" for name, _ in kept)
    lengths = {value for name, value in kept if name.lower() == "content-length"}
    if chunked:
        body = None
    elif len(lengths) > 1 or (lengths and not next(iter(lengths)).isdigit()):
        raise RequestError(400, "bad Content-Length")
    else:
        body = int(next(iter(lengths))) if lengths else 0
    # One request per upstream connection: the next one gets its own source address.
    lines = ["%s %s HTTP/1.1" % (method, path)] + ["%s: %s" % pair for pair in kept] + ["Connection: close", "", ""]
    return "\r\n".join(lines).encode("latin-1"), host, port, body


async def answer(writer, status, text):
    reasons = {400: "Bad Request", 403: "Forbidden", 431: "Request Header Fields Too Large", 500: "Internal Server Error",
               502: "Bad Gateway", 503: "Service Unavailable", 504: "Gateway Timeout"}
    body = ("prefix dialer: %s\n" % text).encode()
    head = "HTTP/1.1 %d %s\r\nContent-Type: text/plain\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % (
        status, reasons.get(status, "Error"), len(body))
    try:
        writer.write(head.encode() + body)
        await asyncio.wait_for(writer.drain(), 5)
    except (ConnectionError, OSError, asyncio.TimeoutError):
        pass


def parse_arguments(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prefix", required=True, help="the routed IPv6 prefix, e.g. 2001:db8:1:2::/64")
    parser.add_argument("--mode", choices=["random", "sticky", "pool"], default="random")
    parser.add_argument("--count", type=int, help="pool mode: how many addresses (prefix+1 ..)")
    parser.add_argument("--listen", action="append", help="address to listen on (repeatable)")
    parser.add_argument("--port", type=int, default=3129)
    parser.add_argument("--connect-timeout", type=float, default=10.0)
    parser.add_argument("--idle-timeout", type=float, default=300.0)
    parser.add_argument("--max-connections", type=int, default=1024)
    arguments = parser.parse_args(argv)
    try:
        arguments.prefix = ipaddress.IPv6Network(arguments.prefix, strict=True)
    except ValueError as error:
        parser.error("--prefix: %s" % error)
    if arguments.mode == "pool":
        if arguments.count is None or not 1 <= arguments.count <= arguments.prefix.num_addresses - 1:
            parser.error("--count must be from 1 to the prefix's size minus one in pool mode")
    elif arguments.count is not None:
        parser.error("--count applies to pool mode only")
    return arguments


def notify_ready():
    """Tells systemd (Type=notify) that the dialer listens, so squid, ordered after it, finds its parent.

    squid probes its parent once at start and marks it dead when the connection is refused; a
    dialer still importing would cost the first request. The protocol is one datagram (sd_notify(3)).
    """
    path = os.environ.get("NOTIFY_SOCKET")
    if not path:
        return
    if path.startswith("@"):
        path = "\0" + path[1:]  # an abstract socket
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as channel:
        channel.connect(path)
        channel.sendall(b"READY=1")


async def serve(arguments):
    picker = SourcePicker(arguments.prefix, arguments.mode, arguments.count)
    dialer = Dialer(picker, arguments.connect_timeout, arguments.idle_timeout, arguments.max_connections)
    servers = []
    for host in arguments.listen or ["127.0.0.1", "::1"]:
        try:
            servers.append(
                await asyncio.start_server(dialer.handle, host, arguments.port, limit=HEAD_LIMIT, backlog=1024)
            )
        except OSError as error:
            # ::1 is missing when IPv6 is off on lo; one loopback address is enough for squid.
            print("prefix dialer: cannot listen on %s: %s" % (host, error.strerror), file=sys.stderr)
    if not servers:
        raise SystemExit(1)
    stop = asyncio.get_running_loop().create_future()
    for number in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(number, lambda: stop.done() or stop.set_result(None))
    print(
        "prefix dialer: %s mode over %s on port %d" % (arguments.mode, arguments.prefix, arguments.port),
        file=sys.stderr,
        flush=True,
    )
    notify_ready()
    await stop
    for server in servers:
        server.close()


if __name__ == "__main__":
    asyncio.run(serve(parse_arguments(sys.argv[1:])))
