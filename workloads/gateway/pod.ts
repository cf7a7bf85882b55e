/**
 * The gateway in a pod: squid in the foreground, and a loop beside it that
 * reloads squid in place when the mounted Secret's files change. The
 * Deployment's pod template never changes with the members (the Secret does),
 * so a member added, drained or gone never rolls the pods: kubelet updates a
 * mounted Secret within its sync period, and the loop sees it within
 * `GATEWAY_RELOAD_POLL_SECONDS`.
 *
 * A new configuration squid does not accept (`squid -k parse`) is not
 * loaded: the running one stays, and the refusal is logged with every
 * `login=` credential hidden.
 */
import { gatewayFiles, type GatewayFiles, type GatewaySettings } from "./squid-gateway";

/** Where the pod mounts the gateway's Secret. */
export const GATEWAY_POD_CONFIG_DIR = "/etc/egress-gateway";
export const GATEWAY_RELOAD_POLL_SECONDS = 2;

/**
 * Where squid in the pod sends its log lines for the `gateway-metrics`
 * sidecar: loopback, which only the pod's own containers share.
 */
export const GATEWAY_POD_METRICS_UDP = "127.0.0.1:5140";

/**
 * The pod's paths: logs to the container's stdout/stderr, squid's own pid
 * file; with `metricsUdp`, each log line to the metrics sidecar as well.
 */
export const gatewayPodFiles = (
  settings: Omit<GatewaySettings, "paths">,
  options: { metricsUdp?: string } = {},
): GatewayFiles =>
  gatewayFiles({
    ...settings,
    paths: {
      configDir: GATEWAY_POD_CONFIG_DIR,
      accessLog: "stdio:/dev/stdout",
      cacheLog: "/dev/stderr",
      ...(options.metricsUdp === undefined ? {} : { metricsUdp: options.metricsUdp }),
    },
  });

/**
 * The container's command (`sh -c`): starts squid, reloads it when the
 * configuration's bytes change, stops it on SIGTERM. `configDir` and
 * `serviceName` are parameters so that the same script runs on a host beside
 * other squids: squid names its shared-memory segments in /dev/shm after its
 * service name (`-n`), "squid" unless given.
 */
export function gatewayEntrypointScript(
  configDir = GATEWAY_POD_CONFIG_DIR,
  serviceName?: string,
): string {
  return `set -u
conf=${configDir}/squid.conf
fingerprint() { cat ${configDir}/squid.conf ${configDir}/users ${configDir}/auth-helper.sh 2>/dev/null | cksum; }
squid -N ${serviceName === undefined ? "" : `-n ${serviceName} `}-f "$conf" &
squid_pid=$!
trap 'kill -TERM "$squid_pid" 2>/dev/null; wait "$squid_pid"; exit 0' TERM INT
seen=$(fingerprint)
while kill -0 "$squid_pid" 2>/dev/null; do
  sleep ${GATEWAY_RELOAD_POLL_SECONDS}
  now=$(fingerprint)
  [ "$now" = "$seen" ] && continue
  seen=$now
  if refusal=$(squid -k parse -f "$conf" 2>&1); then
    squid -k reconfigure -f "$conf" && echo "egress-gateway: configuration changed; squid reloaded in place"
  else
    echo "egress-gateway: the new configuration does not parse; squid keeps the one it runs:" >&2
    printf '%s\\n' "$refusal" | grep -E 'FATAL|ERROR' | sed -E 's/login=[^ ]*/login=(hidden)/g' >&2
  fi
done
wait "$squid_pid"
`;
}
