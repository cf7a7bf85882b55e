"""Renders a NoCloud network-config the way Debian 12's cloud-init would, with its own code.

Usage: /usr/bin/python3 cloudinit_network.py NETWORK_CONFIG_FILE OUT_DIR
Parses the document with cloud-init's network_state (version 1 or 2), renders it
with the ENI (ifupdown) renderer, Debian 12's, under OUT_DIR, and prints JSON:
the interfaces file, the udev rules that name the NIC, and the parsed state's
interfaces. Touches nothing outside OUT_DIR.
"""
import json
import os
import sys

from cloudinit import safeyaml
from cloudinit.net import eni, network_state


def main():
    source, out = sys.argv[1], sys.argv[2]
    with open(source, encoding="utf-8") as handle:
        config = safeyaml.load(handle.read())
    state = network_state.parse_net_config_data(config)
    renderer = eni.Renderer({"eni_path": "etc/network/interfaces.d/50-cloud-init"})
    renderer.render_network_state(state, target=out)

    def read(path):
        full = os.path.join(out, path)
        if not os.path.exists(full):
            return None
        with open(full, encoding="utf-8") as handle:
            return handle.read()

    print(
        json.dumps(
            {
                "interfaces": read("etc/network/interfaces.d/50-cloud-init"),
                "udevRules": read("etc/udev/rules.d/70-persistent-net.rules"),
                "state": [
                    {
                        "name": iface.get("name"),
                        "mac_address": iface.get("mac_address"),
                        "subnets": iface.get("subnets"),
                    }
                    for iface in state.iter_interfaces()
                ],
            },
            default=str,
        )
    )


main()
