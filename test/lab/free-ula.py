#!/usr/bin/python3
"""Prints a unique-local IPv6 /64 for the lab (as "fdxx:xxxx:xxxx:1", without "::/64") that nothing on
this machine already uses.

The lab's IPv6 twin of free-subnet.py. A ULA prefix (RFC 4193) is fd00::/8 plus a random 40-bit global
ID: no registry hands it out and no network outside a site routes it, so two labs, or a lab and a real
site network, collide only by chance. The chance is checked, not assumed: a prefix is taken only when
none of these overlaps it:
  - an IPv6 route of any table, except the default route (a /64 route is more specific and would win);
  - an IPv6 address of any link;
  - an IPv6 resolver of /etc/resolv.conf;
  - a prefix given with --exclude (another lab of the same run).
Up to 64 random global IDs are tried; exit status 1, with the reasons, when all of them collide.

Usage: free-ula.py [--exclude PREFIX/LEN]...
"""
import ipaddress
import json
import re
import secrets
import subprocess
import sys


def ip_json(*args):
    out = subprocess.run(["ip", "-j", *args], check=True, capture_output=True, text=True).stdout
    return json.loads(out or "[]")


def claimed():
    nets = []
    for route in ip_json("-6", "route", "show", "table", "all"):
        dst = route.get("dst", "")
        if dst in ("default", "::/0", ""):
            continue
        nets.append((ipaddress.ip_network(dst if "/" in dst else dst + "/128", strict=False), f"route {dst} dev {route.get('dev', '?')}"))
    for link in ip_json("-6", "addr"):
        for info in link.get("addr_info", []):
            if info.get("family") == "inet6":
                net = ipaddress.ip_network(f"{info['local']}/{info['prefixlen']}", strict=False)
                nets.append((net, f"address {info['local']}/{info['prefixlen']} on {link.get('ifname')}"))
    try:
        with open("/etc/resolv.conf") as handle:
            for line in handle:
                match = re.match(r"\s*nameserver\s+([0-9A-Fa-f:]+)\s*$", line)
                if match:
                    nets.append((ipaddress.ip_network(match.group(1) + "/128"), f"resolver {match.group(1)}"))
    except FileNotFoundError:
        pass
    return nets


def main(argv):
    excluded = []
    args = iter(argv)
    for arg in args:
        if arg == "--exclude":
            value = next(args)
            excluded.append((ipaddress.ip_network(value, strict=False), f"another lab of this run ({value})"))
        else:
            print(f"free-ula.py: unknown argument {arg}", file=sys.stderr)
            return 2
    taken = claimed() + excluded
    reasons = []
    for _ in range(64):
        global_id = secrets.randbits(40)
        # fd + 40-bit global ID + subnet ID 1: fdGG:GGGG:GGGG:0001::/64
        prefix = ipaddress.ip_network(((0xFD << 120) | (global_id << 80) | (1 << 64), 64))
        clash = next((why for net, why in taken if net.overlaps(prefix)), None)
        if clash is None:
            groups = prefix.network_address.exploded.split(":")[:4]
            print(":".join(group.lstrip("0") or "0" for group in groups))
            return 0
        reasons.append(f"{prefix}: {clash}")
    print("free-ula.py: every random prefix collided:\n  " + "\n  ".join(reasons[:5]), file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
