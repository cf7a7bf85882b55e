/**
 * The gateway's counters in Prometheus' text exposition format (0.0.4), as
 * `gateway-metrics` serves them on /metrics. Pure: counters in, text out.
 * Every family is written with its HELP and TYPE even before its first
 * sample, so a dashboard finds the names from the first scrape on.
 */
import { labelSet } from "../check/report";
import type { GatewayCounters } from "./intake";

interface Family {
  name: string;
  help: string;
  samples: Array<{ labels: Record<string, string>; value: number }>;
}

export function renderGatewayMetrics(counters: GatewayCounters): string {
  const families: Family[] = [
    {
      name: "egress_gateway_requests_total",
      help: 'Requests the gateway answered, by the member squid chose ("" when none), the base user ("" when the client gave none) and how they ended: routed (a member answered), failed (no answer came through: 5xx or none) or refused (squid answered itself: credentials, access rules).',
      samples: counters.requests.entries(),
    },
    {
      name: "egress_gateway_response_bytes_total",
      help: "Bytes the gateway sent to clients, by member and base user (a CONNECT tunnel counts what came back through it).",
      samples: counters.responseBytes.entries(),
    },
    {
      name: "egress_gateway_refused_total",
      help: 'Requests squid answered itself without asking a member (407 credentials, 403 access rules, or another 4xx), by the base user the client named ("" when none).',
      samples: counters.refused.entries(),
    },
    {
      name: "egress_gateway_session_requests_total",
      help: 'Requests whose user name carried -session-<id>, by the member squid chose ("" when none).',
      samples: counters.sessionRequests.entries(),
    },
    {
      name: "egress_gateway_log_lines_unreadable_total",
      help: "Access-log lines received that are not in the egress_gateway logformat (a squid.conf of another version, or a truncated datagram).",
      samples: [{ labels: {}, value: counters.unreadableLines }],
    },
  ];
  return families
    .map(
      (family) =>
        `# HELP ${family.name} ${escapeHelp(family.help)}\n# TYPE ${family.name} counter\n` +
        family.samples
          .map(
            ({ labels, value }) =>
              `${family.name}${Object.keys(labels).length === 0 ? "" : labelSet(labels)} ${value}\n`,
          )
          .join(""),
    )
    .join("");
}

/** HELP text escapes only backslash and line feed (the exposition format's rule). */
const escapeHelp = (text: string): string => text.replace(/\\/g, "\\\\").replace(/\n/g, "\\n");
