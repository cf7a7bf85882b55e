/**
 * The gateway as a VM: a cloud-config that installs squid and writes the
 * gateway's files, and the same files as guest files, so that a change of the
 * members reaches the running gateway through its guest agent (common/
 * guest-files.ts) instead of replacing it. The document's identity leaves the
 * files out: members coming and going never change it, only a change of what
 * the VM is made of (the package, the commands) does.
 */
import { createHash } from "node:crypto";
import { runcmdEntry, writeFileEntry } from "../cloud-config";
import type { GuestFileText } from "../prefix-egress";
import { gatewayFiles, type GatewayFiles, type GatewaySettings } from "./squid-gateway";

/** Where the Debian/Ubuntu package's squid reads its configuration: the files go beside it. */
export const GATEWAY_VM_CONFIG_DIR = "/etc/squid";

/** squid reads them as the package's user: "proxy" on Debian, "squid" elsewhere. */
const CHGRP_SECRET_FILES = [
  "sh",
  "-c",
  `chgrp "$(getent group proxy >/dev/null && echo proxy || echo squid)" ${GATEWAY_VM_CONFIG_DIR}/squid.conf ${GATEWAY_VM_CONFIG_DIR}/users`,
];
/**
 * A configuration squid would refuse never reaches a reload: a refused reload
 * stops squid, and the gateway with it. The refusal is shown with every
 * `login=` credential hidden (the delivery reports a failed command's output).
 */
const PARSE_BEFORE_RELOAD = [
  "sh",
  "-c",
  `refusal=$(squid -k parse -f ${GATEWAY_VM_CONFIG_DIR}/squid.conf 2>&1) && exit 0; ` +
    `printf '%s\\n' "$refusal" | grep -E 'FATAL|ERROR' | sed -E 's/login=[^ ]*/login=(hidden)/g' >&2; exit 1`,
];
const RELOAD_SQUID = ["systemctl", "reload-or-restart", "squid"];

/** The gateway's files where the VM's squid reads them. */
export const gatewayVmFiles = (settings: Omit<GatewaySettings, "paths">): GatewayFiles =>
  gatewayFiles({ ...settings, paths: { configDir: GATEWAY_VM_CONFIG_DIR } });

function renderGatewayCloudConfig(
  files: GatewayFiles,
  shown: (file: GuestFileText) => GuestFileText,
): string {
  return [
    "#cloud-config",
    "# egress-proxies: the pool's gateway (squid in front of the pool's members)",
    "packages:",
    "  - squid",
    "write_files:",
    // Deferred: after the package, whose own squid.conf would otherwise replace ours.
    ...[files.config, files.users, files.authHelper].flatMap((file) =>
      writeFileEntry(shown(file), true),
    ),
    "runcmd:",
    runcmdEntry(CHGRP_SECRET_FILES),
    runcmdEntry(RELOAD_SQUID),
    "",
  ].join("\n");
}

/** The gateway VM's user-data, and what of it the running VM gets in place when the members change. */
export function gatewayVmSoftware(settings: Omit<GatewaySettings, "paths">): {
  userData: string;
  guestFiles: {
    files: GuestFileText[];
    commands: string[][];
    listensOn: number;
    userDataIdentity: string;
  };
} {
  const files = gatewayVmFiles(settings);
  const skeleton = renderGatewayCloudConfig(files, (file) => ({ ...file, content: "" }));
  return {
    userData: renderGatewayCloudConfig(files, (file) => file),
    guestFiles: {
      files: [files.config, files.users, files.authHelper],
      commands: [CHGRP_SECRET_FILES, PARSE_BEFORE_RELOAD, RELOAD_SQUID],
      listensOn: settings.port,
      userDataIdentity: createHash("sha256").update(skeleton).digest("hex"),
    },
  };
}
