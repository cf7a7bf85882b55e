/**
 * Publishing a pool to Kubernetes: a Secret with the proxy URLs, and a
 * Service without a selector plus EndpointSlices listing the VMs, so pods
 * reach the pool at `http://<name>.<namespace>.svc:<port>` and kube-proxy
 * spreads connections over the VMs. No controller manages the slices (there
 * is no selector). One writer each: without the exporter's readiness keeping,
 * Pulumi writes the slices `<name>-vms`; with it, the exporter writes
 * `<name>-checked` from the member list Pulumi puts in the Secret, and
 * Pulumi declares no slice (cli/check/endpointslice.ts says why).
 *
 * `@pulumi/kubernetes` is an optional peer dependency: most stacks never
 * publish, and it costs them 24 MB, a provider plugin and a slower tsc. It is
 * loaded here, only when a pool has `kubernetes:` set, and no exported type
 * names it, so the package's .d.ts type-check in a stack that lacks it.
 */
import * as pulumi from "@pulumi/pulumi";

/** The optional peer dependency this module loads on first use. */
const KUBERNETES_PACKAGE = "@pulumi/kubernetes";
import {
  publishCheckExporter,
  type CheckExporterArgs,
  type ExporterObjects,
} from "./kubernetes-exporter";
import {
  checksAnnotation,
  CHECKS_ANNOTATION,
  proxiesJson,
  sliceEndpoint,
  type EndpointCheck,
} from "./published-checks";
import { SLICE_MEMBERS_KEY, sliceMembersJson, type SliceMembers } from "./slice-members";

export interface KubernetesPublishingArgs {
  /** Namespace for the Secret, Service and EndpointSlice; it must exist. */
  namespace: pulumi.Input<string>;
  /** Name of the Service and the Secret (a DNS label): pods use `http://<name>.<namespace>.svc:<port>`. */
  name: pulumi.Input<string>;
  /**
   * The cluster: a `k8s.Provider` from `@pulumi/kubernetes`; default: Pulumi's
   * default Kubernetes provider (your kubeconfig). Typed as Pulumi's base
   * class so stacks that never publish need no `@pulumi/kubernetes`.
   */
  provider?: pulumi.ProviderResource;
  /** Extra labels on every object (the app.kubernetes.io/* ones are always set). */
  labels?: Record<string, string>;
  /**
   * Also run `egress-proxies check --serve` in the cluster: a Deployment
   * reading this Secret's proxies.json and a Service `<name>-check` with the
   * prometheus.io scrape annotations (docs/egress.md, "Watching all the time").
   */
  exporter?: CheckExporterArgs;
}

export interface PublishedProxies {
  /** VM addresses (IPv4), unknown in preview. */
  addresses: pulumi.Input<string[]>;
  /**
   * Set when the pool's proxies take IPv6: their IPv6 addresses, published in
   * an EndpointSlice of their own (a slice holds one address type) beside a
   * Service that asks for both families. Unset: the objects stay IPv4 only.
   */
  ipv6Addresses?: pulumi.Input<string[]>;
  /** An output when publishing must wait for the pool's verdict (requireDistinctEgress). */
  port: pulumi.Input<number>;
  /** The URLs written to the Secret (with credentials when the pool has basic auth). */
  urls: pulumi.Input<string[]>;
  /** What readiness and the egress check found, one per URL in the same order. */
  checks?: pulumi.Input<EndpointCheck[]>;
}

/**
 * What a pool declared in the cluster. They are `k8s.core.v1.Secret`,
 * `k8s.core.v1.Service` and `k8s.discovery.v1.EndpointSlice`; typed as
 * Pulumi's base class so the package's types do not require
 * `@pulumi/kubernetes` (cast them where you need the Kubernetes fields).
 */
export interface KubernetesObjects {
  secret: pulumi.CustomResource;
  service: pulumi.CustomResource;
  /**
   * The EndpointSlice `<name>-vms`, when Pulumi writes the slices: absent
   * when the exporter keeps readiness (`exporter.keepSliceReadiness`, the
   * default with an exporter), which then writes `<name>-checked` itself.
   */
  endpointSlice?: pulumi.CustomResource;
  /** With IPv6 proxies: the EndpointSlice `<name>-vms-ipv6` (addressType IPv6), as endpointSlice. */
  endpointSliceIpv6?: pulumi.CustomResource;
  /** With `exporter`: the check exporter's Deployment and Service. */
  exporter?: ExporterObjects;
}

/** `kubernetes:` is set but the optional peer dependency is not installed. */
export class KubernetesPackageMissingError extends Error {
  override readonly name = "KubernetesPackageMissingError";
}

type KubernetesModule = typeof import("@pulumi/kubernetes");

/**
 * `require`d at call time, not imported: a stack without `@pulumi/kubernetes`
 * must load this package. Only the package itself missing is turned into the
 * install hint; any other failure while loading it surfaces unchanged.
 */
function loadKubernetes(owner: string): KubernetesModule {
  try {
    // eslint-disable-next-line @typescript-eslint/no-require-imports -- optional peer, loaded only when publishing
    return require(KUBERNETES_PACKAGE) as KubernetesModule;
  } catch (error) {
    const { code, message } = error as { code?: string; message?: string };
    if (code === "MODULE_NOT_FOUND" && message?.includes(`'${KUBERNETES_PACKAGE}'`))
      throw new KubernetesPackageMissingError(
        `${owner}: kubernetes is set, which publishes the pool with ${KUBERNETES_PACKAGE}, ` +
          `but that package is not installed in this stack. Run \`npm install ${KUBERNETES_PACKAGE}\` ` +
          `(it is an optional peer dependency of egress-proxies), or remove kubernetes from the pool's arguments.`,
        { cause: error },
      );
    throw error;
  }
}

/** Conventional labels (https://kubernetes.io/docs/concepts/overview/working-with-objects/common-labels/). */
function publishingLabels(
  instance: pulumi.Input<string>,
  extra: Record<string, string> = {},
): pulumi.Input<Record<string, pulumi.Input<string>>> {
  return {
    ...extra,
    "app.kubernetes.io/name": "egress-proxy",
    "app.kubernetes.io/instance": instance,
    "app.kubernetes.io/component": "proxy",
    "app.kubernetes.io/part-of": "egress-proxies",
    "app.kubernetes.io/managed-by": "pulumi",
  };
}

/**
 * The Secret's keys: `proxies.txt` (one URL a line) and `proxies.json` (an
 * array of `{ url, ready, egressIp, checkedAt }`, see published-checks.ts);
 * with the exporter writing the slices, `endpoints.json`, the members it
 * lists, and no readiness in proxies.json: only the exporter's is current,
 * and it is in the slices (a copy here would go stale between `up`s).
 */
function secretDocuments(
  urls: readonly string[],
  checks: readonly EndpointCheck[] | undefined,
  members: SliceMembers | undefined,
): Record<string, string> {
  return {
    "proxies.txt": urls.map((url) => `${url}\n`).join(""),
    "proxies.json": proxiesJson(urls, checks, { readiness: members === undefined }),
    ...(members === undefined ? {} : { [SLICE_MEMBERS_KEY]: sliceMembersJson(members) }),
  };
}

/**
 * Fails with the install hint when `@pulumi/kubernetes` cannot be loaded; the
 * pool calls it before declaring anything, so a missing package never leaves
 * half a pool behind.
 */
export function assertKubernetesAvailable(owner: string): void {
  loadKubernetes(owner);
}

export function publishToKubernetes(
  resourceNamePrefix: string,
  args: KubernetesPublishingArgs,
  proxies: PublishedProxies,
  parent: pulumi.Resource,
): KubernetesObjects {
  const k8s = loadKubernetes(`EgressProxyPool ${resourceNamePrefix}`);
  const options: pulumi.CustomResourceOptions = { parent, provider: args.provider };
  const labels = publishingLabels(args.name, args.labels);
  const annotations = { "egress-proxies.dev/pool": resourceNamePrefix };
  const exporterWritesSlices =
    args.exporter !== undefined && args.exporter.keepSliceReadiness !== false;

  const secret = declareSecret(k8s, `${resourceNamePrefix}-urls`, {
    metadata: { name: args.name, namespace: args.namespace, labels, annotations },
    proxies,
    exporterWritesSlices,
    options,
  });

  const service = new k8s.core.v1.Service(
    `${resourceNamePrefix}-service`,
    {
      metadata: { name: args.name, namespace: args.namespace, labels, annotations },
      spec: {
        // No selector: the endpoints are VMs outside the cluster, listed by the slice below.
        type: "ClusterIP",
        // Pods of either family reach the pool; a single-stack cluster gives its one family.
        ...(proxies.ipv6Addresses === undefined ? {} : { ipFamilyPolicy: "PreferDualStack" }),
        ports: [
          { name: "http-proxy", port: proxies.port, targetPort: proxies.port, protocol: "TCP" },
        ],
      },
    },
    options,
  );

  // The "<service>-" prefix is the convention; the slice's label is what ties it to the Service.
  const sliceName = pulumi.interpolate`${args.name}-vms`;
  const slice = (
    resourceName: string,
    name: pulumi.Input<string>,
    addressType: "IPv4" | "IPv6",
    addresses: pulumi.Input<string[]>,
  ) =>
    declareEndpointSlice(k8s, resourceName, {
      name,
      namespace: args.namespace,
      serviceName: args.name,
      labels,
      annotations,
      addressType,
      addresses,
      proxies,
      // The slice is useless before the Service it names.
      options: { ...options, dependsOn: [service] },
    });
  const endpointSlice = exporterWritesSlices
    ? undefined
    : slice(`${resourceNamePrefix}-endpoints`, sliceName, "IPv4", proxies.addresses);
  // One slice per address family: an EndpointSlice holds addresses of one type only.
  const endpointSliceIpv6 =
    exporterWritesSlices || proxies.ipv6Addresses === undefined
      ? undefined
      : slice(
          `${resourceNamePrefix}-endpoints-ipv6`,
          pulumi.interpolate`${args.name}-vms-ipv6`,
          "IPv6",
          proxies.ipv6Addresses,
        );

  const exporter =
    args.exporter === undefined
      ? undefined
      : publishCheckExporter(
          resourceNamePrefix,
          {
            namespace: args.namespace,
            name: args.name,
            labels,
            annotations,
          },
          args.exporter,
          // It reads the Secret and writes the Service's slices: declared after both.
          { ...options, dependsOn: [secret, service] },
        );
  return {
    secret,
    service,
    ...(endpointSlice === undefined ? {} : { endpointSlice }),
    ...(endpointSliceIpv6 === undefined ? {} : { endpointSliceIpv6 }),
    ...(exporter === undefined ? {} : { exporter }),
  };
}

/** The Secret: the URLs, and with the exporter writing the slices, the members it lists. */
function declareSecret(
  k8s: KubernetesModule,
  resourceName: string,
  secret: {
    metadata: Record<string, unknown>;
    proxies: PublishedProxies;
    exporterWritesSlices: boolean;
    options: pulumi.CustomResourceOptions;
  },
) {
  const { proxies } = secret;
  return new k8s.core.v1.Secret(
    resourceName,
    {
      metadata: secret.metadata,
      type: "Opaque",
      stringData: pulumi.secret(
        pulumi
          .all([
            proxies.urls,
            proxies.checks,
            proxies.port,
            proxies.addresses,
            proxies.ipv6Addresses,
          ])
          .apply(([urls, checks, port, ipv4, ipv6]) =>
            secretDocuments(
              urls,
              checks,
              secret.exporterWritesSlices
                ? { port, ipv4, ...(ipv6 === undefined ? {} : { ipv6 }) }
                : undefined,
            ),
          ),
      ),
    },
    secret.options,
  );
}

/** One EndpointSlice of the pool's Service: the VMs of one address family, with their checks. */
function declareEndpointSlice(
  k8s: ReturnType<typeof loadKubernetes>,
  resourceName: string,
  slice: {
    name: pulumi.Input<string>;
    namespace: pulumi.Input<string>;
    serviceName: pulumi.Input<string>;
    labels: ReturnType<typeof publishingLabels>;
    annotations: Record<string, string>;
    addressType: "IPv4" | "IPv6";
    addresses: pulumi.Input<string[]>;
    proxies: PublishedProxies;
    options: pulumi.CustomResourceOptions;
  },
) {
  const { proxies } = slice;
  return new k8s.discovery.v1.EndpointSlice(
    resourceName,
    {
      metadata: {
        name: slice.name,
        namespace: slice.namespace,
        labels: pulumi.output(slice.labels).apply((base) => ({
          ...base,
          "kubernetes.io/service-name": slice.serviceName,
          "endpointslice.kubernetes.io/managed-by": "egress-proxies.dev",
        })),
        annotations: pulumi.output(proxies.checks ?? []).apply((checks) => ({
          ...slice.annotations,
          [CHECKS_ANNOTATION]: checksAnnotation(checks),
        })),
      },
      addressType: slice.addressType,
      ports: [{ name: "http-proxy", port: proxies.port, protocol: "TCP" }],
      endpoints: pulumi.all([slice.addresses, proxies.checks ?? []]).apply(([known, checks]) =>
        known.map((address) =>
          sliceEndpoint(
            address,
            checks.find((check) => check.address === address),
          ),
        ),
      ),
    },
    slice.options,
  );
}
