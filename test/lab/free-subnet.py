#!/usr/bin/python3
"""Prints the first /24 (as "A.B.C") among the lab's candidates that nothing on this machine already uses.

A lab gives this machine's root namespace a leg on its bridge, and with it a route for the whole /24.
That route must never take traffic meant for a real network: the machines this runs on use
documentation and private ranges for real traffic (a package registry at 203.0.113.80, an uplink on
192.0.2.0/24). So a candidate is taken only when none of these overlaps it:
  - a route of any table, except the default route (a /24 route is more specific and would win);
  - an address of any link;
  - a resolver of /etc/resolv.conf;
  - an address the run itself needs: the npm registry, the apt sources, any proxy in the environment
    (resolved now, every address of each name);
  - a subnet given with --exclude (another lab of the same run).

Usage: free-subnet.py [--exclude A.B.C.0/24]... [--candidates "A.B.C A.B.C ..."]
Exit status 1, with the reason, when every candidate is taken.
"""
import ipaddress
import json
import os
import re
import socket
import subprocess
import sys
from urllib.parse import urlsplit

# Documentation, benchmarking and shared-address ranges first (least likely to be a real LAN here),
# then rarely used private /24s. Any of them may be in use: each is checked, none is assumed free.
DEFAULT_CANDIDATES = (
    ["198.51.100", "203.0.113", "192.0.2"]
    + [f"198.18.{n}" for n in range(0, 256, 17)]
    + [f"198.19.{n}" for n in range(0, 256, 17)]
    + [f"100.127.{n}" for n in range(0, 256, 31)]
    + [f"10.254.{n}" for n in range(0, 256, 31)]
    + [f"172.31.{n}" for n in range(0, 256, 31)]
    + ["192.168.254", "192.168.253"]
)


def ip_json(*args):
    out = subprocess.run(["ip", "-j", *args], check=True, capture_output=True, text=True).stdout
    return json.loads(out or "[]")


def claimed_by_routes():
    nets = []
    for route in ip_json("-4", "route", "show", "table", "all"):
        dst = route.get("dst", "")
        if dst in ("default", "0.0.0.0/0", ""):
            continue
        nets.append((ipaddress.ip_network(dst if "/" in dst else dst + "/32", strict=False), f"route {dst} dev {route.get('dev', '?')}"))
    return nets


def claimed_by_addresses():
    nets = []
    for link in ip_json("-4", "addr"):
        for info in link.get("addr_info", []):
            if info.get("family") == "inet":
                net = ipaddress.ip_network(f"{info['local']}/{info['prefixlen']}", strict=False)
                nets.append((net, f"address {info['local']}/{info['prefixlen']} on {link.get('ifname')}"))
    return nets


def claimed_by_resolvers():
    nets = []
    try:
        with open("/etc/resolv.conf") as handle:
            for line in handle:
                match = re.match(r"\s*nameserver\s+(\S+)", line)
                if match:
                    try:
                        nets.append((ipaddress.ip_network(match.group(1) + "/32"), f"resolver {match.group(1)}"))
                    except ValueError:
                        pass  # an IPv6 resolver cannot collide with an IPv4 /24
    except FileNotFoundError:
        pass
    return nets


def hosts_the_run_needs():
    names = set()
    registry = os.environ.get("npm_config_registry") or os.environ.get("NPM_CONFIG_REGISTRY") or "https://registry.npmjs.org/"
    names.add(urlsplit(registry).hostname)
    for variable in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        value = os.environ.get(variable)
        if value:
            names.add(urlsplit(value if "://" in value else "http://" + value).hostname)
    source_files = ["/etc/apt/sources.list"]
    if os.path.isdir("/etc/apt/sources.list.d"):
        source_files += [os.path.join("/etc/apt/sources.list.d", f) for f in sorted(os.listdir("/etc/apt/sources.list.d"))]
    for path in source_files:
        try:
            with open(path) as handle:
                for url in re.findall(r"\b(?:https?|ftp)://[^\s\]]+", handle.read()):
                    names.add(urlsplit(url).hostname)
        except (FileNotFoundError, IsADirectoryError, PermissionError):
            pass
    return sorted(name for name in names if name)


def claimed_by_needed_hosts():
    nets = []
    for name in hosts_the_run_needs():
        try:
            infos = socket.getaddrinfo(name, None, socket.AF_INET)
        except socket.gaierror:
            continue  # not resolvable now: nothing to collide with
        for address in sorted({info[4][0] for info in infos}):
            nets.append((ipaddress.ip_network(address + "/32"), f"{name} ({address})"))
    return nets


def main(argv):
    excluded, candidates = [], DEFAULT_CANDIDATES
    args = iter(argv)
    for arg in args:
        if arg == "--exclude":
            value = next(args)
            excluded.append((ipaddress.ip_network(value, strict=False), f"another lab of this run ({value})"))
        elif arg == "--candidates":
            candidates = next(args).split()
        else:
            print(f"free-subnet.py: unknown argument {arg}", file=sys.stderr)
            return 2
    claimed = claimed_by_routes() + claimed_by_addresses() + claimed_by_resolvers() + claimed_by_needed_hosts() + excluded
    reasons = []
    for prefix in candidates:
        subnet = ipaddress.ip_network(prefix + ".0/24")
        clash = next((why for net, why in claimed if net.overlaps(subnet)), None)
        if clash is None:
            print(prefix)
            return 0
        reasons.append(f"{subnet}: {clash}")
    print("free-subnet.py: every lab candidate is in use on this machine:\n  " + "\n  ".join(reasons), file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
