"""Calls the prefix dialer's pure functions and prints what they return, as JSON, for prefix-egress.test.ts.

Usage: /usr/bin/python3 dialer_units.py DIALER_PY
Loads the dialer as a module (its __main__ guard keeps it from serving); then runs it once on a free
loopback port with NOTIFY_SOCKET set, to see it tell systemd it is ready, and stops it.
"""
import base64
import importlib.util
import ipaddress
import json
import os
import socket
import subprocess
import sys
import tempfile

spec = importlib.util.spec_from_file_location("dialer", sys.argv[1])
dialer = importlib.util.module_from_spec(spec)
spec.loader.exec_module(dialer)


def plain(method, target, headers):
    try:
        head, host, port, body = dialer.plain_request(method, target, headers)
        return {"head": head.decode("latin-1").split("\r\n"), "host": host, "port": port, "body": body}
    except dialer.RequestError as error:
        return {"status": error.status, "text": error.text}


basic = "Basic " + base64.b64encode(b"alice:s3cret").decode()
out = {
    "plain": plain(
        "GET",
        "http://example.com:8080/a?b=1",
        [
            ("Host", "example.com:8080"),
            ("Proxy-Authorization", basic),
            ("Connection", "keep-alive, X-Drop"),
            ("X-Drop", "1"),
            ("Keep-Alive", "5"),
            ("X-Egress-Prefix-Client", "10.0.0.7"),
            ("Accept", "*/*"),
        ],
    ),
    "noHost": plain("GET", "http://[2001:db8::1]/", []),
    "post": plain("POST", "http://example.com/", [("Content-Length", "5")]),
    "chunked": plain("POST", "http://example.com/", [("Transfer-Encoding", "chunked")]),
    "twoLengths": plain("POST", "http://example.com/", [("Content-Length", "5"), ("Content-Length", "6")]),
    "https": plain("GET", "https://example.com/", []),
    "keys": [
        dialer.client_key([("Proxy-Authorization", basic), ("X-Egress-Prefix-Client", "10.0.0.7")], "127.0.0.1").decode(),
        dialer.client_key([("X-Egress-Prefix-Client", "6.6.6.6"), ("X-Egress-Prefix-Client", "10.0.0.7")], "127.0.0.1").decode(),
        dialer.client_key([], "127.0.0.1").decode(),
    ],
}
small = dialer.SourcePicker(ipaddress.IPv6Network("2001:db8::10/124"), "random", None)
out["randomSmall"] = sorted({str(small.pick(b"")) for _ in range(2000)})
pool = dialer.SourcePicker(ipaddress.IPv6Network("2001:db8::/64"), "pool", 3)
out["pool"] = sorted({str(pool.pick(b"")) for _ in range(500)})
sticky = dialer.SourcePicker(ipaddress.IPv6Network("2001:db8::/64"), "sticky", None)
other = dialer.SourcePicker(ipaddress.IPv6Network("2001:db8:0:1::/64"), "sticky", None)
out["sticky"] = [str(sticky.pick(b"user\0alice")), str(sticky.pick(b"user\0alice")), str(sticky.pick(b"user\0bob")), str(other.pick(b"user\0alice"))]

with tempfile.TemporaryDirectory() as scratch, socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify:
    notify.bind(os.path.join(scratch, "notify"))
    notify.settimeout(10)
    child = subprocess.Popen(
        [sys.executable, sys.argv[1], "--prefix", "2001:db8::/64", "--listen", "127.0.0.1", "--port", "0"],
        env={**os.environ, "NOTIFY_SOCKET": os.path.join(scratch, "notify")},
        stderr=subprocess.DEVNULL,
    )
    try:
        out["notify"] = notify.recv(64).decode()
    finally:
        child.terminate()
        out["notifyExit"] = child.wait(10)
print(json.dumps(out))
