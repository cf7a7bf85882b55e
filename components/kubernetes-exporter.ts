/**
 * The pool's watcher in the cluster: `egress-proxies check --serve` as a
 * Deployment beside the published endpoints, and a Service Prometheus
 * scrapes through the usual annotations. It reads the proxy list from the
 * Secret the pool publishes, mounted as a directory (not a subPath), so the
 * kubelet's in-place update of the Secret reaches the exporter, which reads
 * the file again before every check: a `pulumi up` that changes the pool
 * needs no restart of the exporter.
 *
 * The container runs the package with `npx` from a stock Node.js image: the
 * project ships no image of its own. `packageSpec` points npx elsewhere (a
 * private registry's copy, a tarball URL) where the cluster cannot reach the
 * public registry.
 */
import * as pulumi from "@pulumi/pulumi";
import { egressCheckProblems, egressCheckSchema } from "../provider/common/egress";
import { HOST_PORT, PROXIED_HTTP_URL } from "../provider/common/inputs";
import { packageVersion } from "../provider/common/version";

export interface CheckExporterArgs {
  /** An http:// URL every proxy must fetch (`check --target`). */
  target: string;
  /** host:port to open a CONNECT tunnel to through each proxy (`--connect`), e.g. example.com:443. */
  connect?: string;
  /** An echo service answering with the caller's address (`--egress-url`, `--egress-field`). */
  egressUrl?: string;
  egressField?: string;
  /** The echo service by its IPv6 literal, for members' IPv6 URLs (`--egress-url-ipv6`), e.g. http://[2001:db8::7]/ip. */
  egressUrlIpv6?: string;
  /** Seconds from one check's start to the next. Default 60. */
  intervalSeconds?: number;
  /** Budget per proxy and check, seconds. Default 10. */
  timeoutSeconds?: number;
  /** The port /metrics and /healthz are served on. Default 9464. */
  port?: number;
  /** A Node.js 22+ image with npm. Default `node:26-slim` (the current LTS). */
  image?: string;
  /** What npx runs. Default `egress-proxies@<this package's version>`. */
  packageSpec?: string;
  /**
   * The exporter writes the pool's EndpointSlices (`<name>-checked`, and
   * `<name>-checked-ipv6` for a pool with IPv6): the members the pool lists
   * in its Secret, each ready as the exporter's last check found it, so
   * readiness is as current as that check between `pulumi up`s (`check
   * --endpointslices`). Pulumi then declares no slice: one writer each.
   * Default true; false: Pulumi writes the slices `<name>-vms` with the
   * readiness of the last `up`, and the exporter's pod mounts no API token.
   */
  keepSliceReadiness?: boolean;
}

export const EXPORTER_DEFAULTS = {
  intervalSeconds: 60,
  timeoutSeconds: 10,
  port: 9464,
  image: "node:26-slim",
  packageSpec: `egress-proxies@${packageVersion}`,
} as const;

/** The node image's unprivileged user; npx runs as it, writing only under /tmp. */
const NODE_IMAGE_USER = 1000;

/** Every problem with the exporter's arguments, each naming the field and the fix. */
export function checkExporterArgsProblems(
  exporter: CheckExporterArgs | undefined,
  field = "kubernetes.exporter",
): string[] {
  if (exporter === undefined) return [];
  const problems: string[] = [];
  if (typeof exporter.target !== "string" || !PROXIED_HTTP_URL.test(exporter.target))
    problems.push(
      `${field}.target must be an http:// URL without credentials that every proxy can fetch, e.g. http://example.com/`,
    );
  if (exporter.connect !== undefined && !HOST_PORT.test(exporter.connect))
    problems.push(`${field}.connect must be host:port, e.g. example.com:443`);
  if (exporter.egressField !== undefined && exporter.egressUrl === undefined)
    problems.push(`${field}.egressField needs ${field}.egressUrl`);
  // The rules `check --egress-url` applies: a value it would refuse would crash-loop the pod.
  if (exporter.egressUrl !== undefined)
    problems.push(
      ...egressCheckProblems(
        { url: exporter.egressUrl, field: exporter.egressField },
        { url: `${field}.egressUrl`, field: `${field}.egressField` },
      ),
    );
  if (exporter.egressUrlIpv6 !== undefined) {
    if (exporter.egressUrl === undefined)
      problems.push(`${field}.egressUrlIpv6 needs ${field}.egressUrl`);
    const parsed = egressCheckSchema.shape.ipv6Url.safeParse(exporter.egressUrlIpv6);
    if (!parsed.success)
      problems.push(
        ...parsed.error.issues.map((issue) =>
          issue.message.replace("egressCheck.ipv6Url", `${field}.egressUrlIpv6`),
        ),
      );
  }
  const whole = (value: number | undefined, name: string, min: number, max: number) => {
    if (value !== undefined && (!Number.isInteger(value) || value < min || value > max))
      problems.push(`${field}.${name} must be a whole number from ${min} to ${max}`);
  };
  whole(exporter.intervalSeconds, "intervalSeconds", 1, 86_400);
  whole(exporter.timeoutSeconds, "timeoutSeconds", 1, 600);
  whole(exporter.port, "port", 1024, 65_535);
  if (exporter.keepSliceReadiness !== undefined && typeof exporter.keepSliceReadiness !== "boolean")
    problems.push(`${field}.keepSliceReadiness must be true or false`);
  return problems;
}

/** The container's command line: `npx` the package and run the exporter on the mounted list. */
export function exporterCommand(
  exporter: CheckExporterArgs,
  listPath: string,
  /** The pool's Service, `<namespace>/<name>`, whose slices the exporter writes. */
  slicesOf?: pulumi.Input<string>,
): pulumi.Input<string>[] {
  const port = exporter.port ?? EXPORTER_DEFAULTS.port;
  return [
    "npx",
    "--yes",
    exporter.packageSpec ?? EXPORTER_DEFAULTS.packageSpec,
    "check",
    "--serve",
    `:${port}`,
    "--interval",
    String(exporter.intervalSeconds ?? EXPORTER_DEFAULTS.intervalSeconds),
    "--timeout",
    String(exporter.timeoutSeconds ?? EXPORTER_DEFAULTS.timeoutSeconds),
    "--from",
    listPath,
    "--target",
    exporter.target,
    ...(exporter.connect === undefined ? [] : ["--connect", exporter.connect]),
    ...(exporter.egressUrl === undefined ? [] : ["--egress-url", exporter.egressUrl]),
    ...(exporter.egressUrlIpv6 === undefined ? [] : ["--egress-url-ipv6", exporter.egressUrlIpv6]),
    ...(exporter.egressField === undefined ? [] : ["--egress-field", exporter.egressField]),
    ...(slicesOf === undefined ? [] : ["--endpointslices", slicesOf]),
  ];
}

/** Not exported, so no declaration of this package names the optional peer (see kubernetes.ts). */
type KubernetesModule = typeof import("@pulumi/kubernetes");

export interface ExporterObjects {
  /** `k8s.apps.v1.Deployment` (typed as Pulumi's base class, as in KubernetesObjects). */
  deployment: pulumi.CustomResource;
  /** `k8s.core.v1.Service` with prometheus.io scrape annotations. */
  service: pulumi.CustomResource;
  /**
   * With keepSliceReadiness: the ServiceAccount, and the Role and RoleBinding
   * that let it read the pool's Secret and Service and write the pool's
   * EndpointSlices, and nothing else.
   */
  sliceAccess?: {
    serviceAccount: pulumi.CustomResource;
    role: pulumi.CustomResource;
    roleBinding: pulumi.CustomResource;
  };
}

/**
 * Declares the exporter. Called by publishToKubernetes, which has loaded
 * `@pulumi/kubernetes` already (and turned its absence into the install hint).
 */
export function publishCheckExporter(
  resourceNamePrefix: string,
  publishing: {
    namespace: pulumi.Input<string>;
    /** The Secret holding proxies.json and the Service's name, and the prefix of the exporter's objects. */
    name: pulumi.Input<string>;
    labels: pulumi.Input<Record<string, pulumi.Input<string>>>;
    annotations: Record<string, string>;
  },
  exporter: CheckExporterArgs,
  options: pulumi.CustomResourceOptions,
): ExporterObjects {
  // eslint-disable-next-line @typescript-eslint/no-require-imports -- optional peer, loaded only when publishing
  const k8s = require("@pulumi/kubernetes") as KubernetesModule;
  const port = exporter.port ?? EXPORTER_DEFAULTS.port;
  const name = pulumi.interpolate`${publishing.name}-check`;
  const selector = {
    "app.kubernetes.io/instance": name,
    "app.kubernetes.io/component": "check-exporter",
  };
  const labels = pulumi
    .output(publishing.labels)
    .apply((base) => ({ ...base, ...selector, "app.kubernetes.io/name": "egress-proxy-check" }));
  const metadata = {
    name,
    namespace: publishing.namespace,
    labels,
    annotations: publishing.annotations,
  };
  const sliceAccess =
    exporter.keepSliceReadiness === false
      ? undefined
      : declareSliceAccess(k8s, resourceNamePrefix, metadata, publishing.name, options);
  const deployment = new k8s.apps.v1.Deployment(
    `${resourceNamePrefix}-check`,
    {
      metadata,
      spec: {
        replicas: 1,
        selector: { matchLabels: selector },
        template: {
          metadata: { labels },
          spec: exporterPodSpec(exporter, publishing.name, port, {
            ...(sliceAccess === undefined
              ? {}
              : {
                  serviceAccountName: name,
                  slicesOf: pulumi.interpolate`${publishing.namespace}/${publishing.name}`,
                }),
          }),
        },
      },
    },
    // After what it reads (in options) and, with an account, after that account may act.
    {
      ...options,
      dependsOn: [
        ...(Array.isArray(options.dependsOn) ? (options.dependsOn as pulumi.Resource[]) : []),
        ...(sliceAccess === undefined ? [] : [sliceAccess.roleBinding]),
      ],
    },
  );

  const service = new k8s.core.v1.Service(
    `${resourceNamePrefix}-check-service`,
    {
      metadata: {
        ...metadata,
        annotations: {
          ...publishing.annotations,
          "prometheus.io/scrape": "true",
          "prometheus.io/port": String(port),
          "prometheus.io/path": "/metrics",
        },
      },
      spec: {
        type: "ClusterIP",
        selector,
        ports: [{ name: "metrics", port, targetPort: "metrics", protocol: "TCP" }],
      },
    },
    options,
  );

  return { deployment, service, ...(sliceAccess === undefined ? {} : { sliceAccess }) };
}

/**
 * The exporter's own identity: a ServiceAccount whose Role lets it read the
 * pool's Secret and Service and write the pool's EndpointSlices
 * (`<name>-checked`, `<name>-checked-ipv6`), by name. Creating a slice is
 * the one verb Kubernetes cannot narrow by name (RBAC's `create` rules
 * ignore resourceNames), so `create` covers endpointslices in this namespace.
 */
function declareSliceAccess(
  k8s: KubernetesModule,
  resourceNamePrefix: string,
  metadata: {
    name: pulumi.Input<string>;
    namespace: pulumi.Input<string>;
    labels: pulumi.Input<Record<string, pulumi.Input<string>>>;
    annotations: Record<string, string>;
  },
  poolName: pulumi.Input<string>,
  options: pulumi.CustomResourceOptions,
): NonNullable<ExporterObjects["sliceAccess"]> {
  const named = (suffix: string) => pulumi.interpolate`${poolName}${suffix}`;
  const serviceAccount = new k8s.core.v1.ServiceAccount(
    `${resourceNamePrefix}-check-account`,
    { metadata, automountServiceAccountToken: false },
    options,
  );
  const role = new k8s.rbac.v1.Role(
    `${resourceNamePrefix}-check-slice`,
    {
      metadata,
      rules: [
        {
          apiGroups: ["discovery.k8s.io"],
          resources: ["endpointslices"],
          resourceNames: [named("-checked"), named("-checked-ipv6")],
          verbs: ["get", "patch"],
        },
        { apiGroups: ["discovery.k8s.io"], resources: ["endpointslices"], verbs: ["create"] },
        {
          apiGroups: [""],
          resources: ["secrets", "services"],
          resourceNames: [named("")],
          verbs: ["get"],
        },
      ],
    },
    options,
  );
  const roleBinding = new k8s.rbac.v1.RoleBinding(
    `${resourceNamePrefix}-check-slice`,
    {
      metadata,
      roleRef: { apiGroup: "rbac.authorization.k8s.io", kind: "Role", name: metadata.name },
      subjects: [{ kind: "ServiceAccount", name: metadata.name, namespace: metadata.namespace }],
    },
    { ...options, dependsOn: [serviceAccount, role] },
  );
  return { serviceAccount, role, roleBinding };
}

/** Where the pod mounts the Secret's proxies.json. */
const LIST_DIRECTORY = "/proxies";

/** The exporter's pod: non-root, read-only root, the proxy list from the Secret, probes on /healthz. */
function exporterPodSpec(
  exporter: CheckExporterArgs,
  secretName: pulumi.Input<string>,
  port: number,
  sliceAccess: { serviceAccountName?: pulumi.Input<string>; slicesOf?: pulumi.Input<string> },
) {
  const probe = (initialDelaySeconds: number) => ({
    httpGet: { path: "/healthz", port: "metrics" },
    initialDelaySeconds,
    periodSeconds: 30,
    timeoutSeconds: 5,
    failureThreshold: 3,
  });
  return {
    // The API token only when the exporter keeps the slice current, and then only its own account's.
    ...(sliceAccess.serviceAccountName === undefined
      ? { automountServiceAccountToken: false }
      : { serviceAccountName: sliceAccess.serviceAccountName, automountServiceAccountToken: true }),
    securityContext: {
      runAsNonRoot: true,
      runAsUser: NODE_IMAGE_USER,
      runAsGroup: NODE_IMAGE_USER,
      // The Secret's files are root's; fsGroup makes them group-readable by the node user.
      fsGroup: NODE_IMAGE_USER,
      seccompProfile: { type: "RuntimeDefault" },
    },
    containers: [
      {
        name: "check",
        image: exporter.image ?? EXPORTER_DEFAULTS.image,
        command: exporterCommand(exporter, `${LIST_DIRECTORY}/proxies.json`, sliceAccess.slicesOf),
        // npx installs into its cache: HOME and the cache on the writable emptyDir.
        env: [
          { name: "HOME", value: "/tmp" },
          { name: "npm_config_cache", value: "/tmp/.npm" },
          { name: "npm_config_update_notifier", value: "false" },
        ],
        ports: [{ name: "metrics", containerPort: port, protocol: "TCP" }],
        // The first start downloads the package: liveness waits for it.
        livenessProbe: probe(300),
        readinessProbe: { ...probe(5), periodSeconds: 10 },
        resources: {
          requests: { cpu: "20m", memory: "96Mi" },
          limits: { memory: "256Mi" },
        },
        securityContext: {
          allowPrivilegeEscalation: false,
          readOnlyRootFilesystem: true,
          capabilities: { drop: ["ALL"] },
        },
        volumeMounts: [
          { name: "proxies", mountPath: LIST_DIRECTORY, readOnly: true },
          { name: "tmp", mountPath: "/tmp" },
        ],
      },
    ],
    volumes: [
      {
        name: "proxies",
        // A directory mount (no subPath): the kubelet updates it when the Secret changes.
        secret: {
          secretName,
          items: [{ key: "proxies.json", path: "proxies.json" }],
          defaultMode: 0o440,
        },
      },
      { name: "tmp", emptyDir: { sizeLimit: "512Mi" } },
    ],
  };
}
