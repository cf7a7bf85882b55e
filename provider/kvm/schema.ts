/**
 * KvmProxy inputs. Every message names the field and says what to write
 * instead; `check` reports them as Pulumi check failures. Pure: no I/O, so
 * `pulumi preview` validates without reaching any host.
 */
import { z } from "zod";
import { guestFilesSchema } from "../common/guest-files";
import { egressCheckSchema } from "../common/egress";
import { ipFamiliesShape, ipFamilyProblems } from "../common/ip-families";
import { parseProxyJump } from "../ssh/jump";
import {
  ownerSchema,
  PROXIED_HTTP_URL,
  readinessSchema,
  timeoutsSchema,
  vmLifecycleShape,
  validateWithUnknowns,
  vmNameSchema,
  wholeNumber,
  type ValidationResult,
} from "../common/inputs";

const HOST_NAME =
  /^(\[[0-9a-fA-F:.]+\]|[0-9a-fA-F:]+:[0-9a-fA-F:.]*|[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?)$/;
const POOL_NAME = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$/;
const BRIDGE_NAME = /^[A-Za-z][A-Za-z0-9_.-]{0,14}$/;
const NETWORK_NAME = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$/;
const SHA256 = /^[0-9a-f]{64}$/;
const CPU_MODEL = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$/;

const DEFAULT_SOCKET_PATH = "/var/run/libvirt/libvirt-sock";

/** The SSH settings a hop and the hypervisor share, their messages naming `field` (e.g. "connection"). */
function sshLoginFields<User extends z.ZodType>(field: string, whose: string, user: User) {
  return {
    host: z
      .string({
        error: `${field}.host must be the ${whose} host name or address, e.g. "kvm1.lan"`,
      })
      .regex(HOST_NAME, {
        error: `${field}.host must be a host name or IP address without user or port (use ${field}.user and ${field}.port), e.g. "kvm1.lan"`,
      }),
    port: wholeNumber(`${field}.port`, 1, 65535, 22).default(22),
    user,
    privateKey: z
      .string({ error: `${field}.privateKey must be the private key text (PEM or OpenSSH format)` })
      .includes("PRIVATE KEY-----", {
        error: `${field}.privateKey must be the key's text (-----BEGIN ... PRIVATE KEY-----), not a path; read the file with fs.readFileSync`,
      })
      .optional(),
    passphrase: z.string({ error: `${field}.passphrase must be a string` }).optional(),
    /** OpenSSH known_hosts content; without it ~/.ssh/known_hosts is read. */
    knownHosts: z
      .string({
        error: `${field}.knownHosts must be known_hosts text (lines like "host ssh-ed25519 AAAA...")`,
      })
      .optional(),
    /** Skips host-key verification. Insecure: anyone on the path can impersonate the host. */
    insecureIgnoreHostKey: z
      .boolean({ error: `${field}.insecureIgnoreHostKey must be true or false` })
      .default(false),
    /** ssh-agent socket; defaults to SSH_AUTH_SOCK. */
    agentSocket: z.string({ error: `${field}.agentSocket must be a path` }).optional(),
  };
}

const SSH_USER = /^[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}$/;
const sshUser = (field: string) =>
  z
    .string({ error: `${field}.user must be the SSH user name, e.g. "root"` })
    .regex(SSH_USER, { error: `${field}.user must be a plain user name (letters, digits, _ . -)` });

/**
 * A jump host as an object: its own login and host-key check. What it leaves
 * out comes from the connection (user, key, passphrase, agent, known_hosts),
 * except insecureIgnoreHostKey, which is never inherited.
 */
const jumpHostSchema = z.strictObject({
  ...sshLoginFields(
    "connection.proxyJump[]",
    "jump host's",
    sshUser("connection.proxyJump[]").optional(),
  ),
});

/** OpenSSH's one-line form, checked here so preview reports it; the same parser reads it when dialling. */
const proxyJumpText = z
  .string({ error: "connection.proxyJump must be text or a list" })
  .superRefine((text, context) => {
    try {
      parseProxyJump(text, "connection.proxyJump");
    } catch (error) {
      context.addIssue({ code: "custom", message: (error as Error).message });
    }
  });

export const MAX_JUMP_HOSTS = 8;

export const connectionSchema = z.strictObject({
  ...sshLoginFields("connection", "hypervisor's", sshUser("connection").default("root")),
  dialTimeoutSeconds: wholeNumber("connection.dialTimeoutSeconds", 1, 600, 15).default(15),
  /**
   * Jump hosts in front of the hypervisor, first to last, like OpenSSH's
   * ProxyJump: `"admin@bastion:22"`, `"jump1,jump2:2222"`, or a list whose
   * items are such text or objects with their own credentials and known_hosts.
   */
  proxyJump: z
    .preprocess(
      (value) => (typeof value === "string" ? [value] : value),
      z
        .array(z.union([proxyJumpText, jumpHostSchema]), {
          error: "connection.proxyJump must be text or a list of jump hosts",
        })
        .min(1, {
          error: "connection.proxyJump must name at least one jump host; leave it out for none",
        })
        .max(MAX_JUMP_HOSTS, {
          error: `connection.proxyJump takes at most ${MAX_JUMP_HOSTS} jump hosts`,
        }),
    )
    .optional(),
});

export type JumpHostInput = z.output<typeof jumpHostSchema>;

const imageSchema = z
  .strictObject({
    url: z
      .string({
        error:
          'image.url must be the https URL of a cloud image, e.g. "https://cloud.debian.org/images/cloud/bookworm/latest/debian-12-genericcloud-amd64.qcow2"',
      })
      .superRefine((text, context) => {
        let url: URL;
        try {
          url = new URL(text);
        } catch {
          context.addIssue({
            code: "custom",
            message: "image.url is not a URL; give the full https://... address",
          });
          return;
        }
        if (url.protocol !== "https:" && url.protocol !== "http:")
          context.addIssue({
            code: "custom",
            message: `image.url must use https (or http with image.sha256), not ${url.protocol}`,
          });
        if (url.username !== "" || url.password !== "")
          context.addIssue({
            code: "custom",
            message:
              "image.url must not carry credentials (user:password@); serve the image from an address that needs none",
          });
      }),
    sha256: z
      .string({ error: "image.sha256 must be 64 hex characters" })
      .transform((digest) => digest.toLowerCase())
      .pipe(
        z.string().regex(SHA256, {
          error: "image.sha256 must be 64 hex characters (the output of sha256sum)",
        }),
      )
      .optional(),
    format: z
      .enum(["qcow2", "raw"], { error: 'image.format must be "qcow2" or "raw"' })
      .default("qcow2"),
    /**
     * The most the download may bring, in MiB; DEFAULT_IMAGE_MAX_MIB (8 GiB)
     * when unset. No default here: state written before this input existed
     * must compare equal to a program that does not set it.
     */
    maxMiB: wholeNumber("image.maxMiB", 1, 1_048_576, 8192).optional(),
  })
  .refine((image) => !image.url.startsWith("http:") || image.sha256 !== undefined, {
    error:
      "image.url uses plain http, so image.sha256 is required to make sure the image is the one you meant",
    path: ["sha256"],
  });

const networkSchema = z.union(
  [
    z.strictObject({
      bridge: z.string().regex(BRIDGE_NAME, {
        error: 'network.bridge must be a Linux bridge name (at most 15 characters), e.g. "br0"',
      }),
    }),
    z.strictObject({
      name: z.string().regex(NETWORK_NAME, {
        error: 'network.name must be a libvirt network name, e.g. "default"',
      }),
    }),
  ],
  { error: 'network must be { bridge: "br0" } or { name: "default" } (a libvirt network)' },
);

const cpuModeSchema = z.union(
  [
    z.enum(["host-passthrough", "host-model", "maximum"]),
    z.strictObject({
      model: z
        .string()
        .regex(CPU_MODEL, { error: 'cpuMode.model must be a QEMU CPU model name, e.g. "qemu64"' }),
    }),
  ],
  { error: 'cpuMode must be "host-passthrough", "host-model", "maximum" or { model: "qemu64" }' },
);

const kvmReadinessSchema = readinessSchema.extend({
  /** An http:// URL fetched through the proxy once the port answers; a 2xx-3xx status means ready. */
  probeUrl: z
    .string({ error: "readiness.probeUrl must be an http:// URL fetched through the proxy" })
    .regex(PROXIED_HTTP_URL, {
      error:
        'readiness.probeUrl must be an http:// URL without credentials, e.g. "http://example.com/"',
    })
    .optional(),
});

export const kvmProxyInputsSchema = z
  .strictObject({
    // Where. Without a connection the local libvirt socket is used.
    connection: connectionSchema.optional(),
    socketPath: z
      .string({ error: "socketPath must be an absolute path" })
      .regex(/^\/[^\0]*$/, {
        error: `socketPath must be an absolute path, e.g. "${DEFAULT_SOCKET_PATH}"`,
      })
      .default(DEFAULT_SOCKET_PATH),
    pool: z
      .string()
      .regex(POOL_NAME, { error: 'pool must be a libvirt storage pool name, e.g. "default"' })
      .default("default"),
    network: networkSchema.default({ name: "default" }),
    ...ipFamiliesShape,
    // Machine.
    vmName: vmNameSchema.optional(),
    /** "user" when the name was given, "provider" when check generated it (diff decides deleteBeforeReplace). FROZEN key and values: old state. */
    vmNameChosenBy: z.enum(["user", "provider"]).optional(),
    vcpus: wholeNumber("vcpus", 1, 128, 2).default(1),
    memoryMiB: wholeNumber("memoryMiB", 256, 1_048_576, 1024).default(1024),
    diskGiB: wholeNumber("diskGiB", 1, 16_384, 10).default(10),
    firmware: z
      .enum(["uefi", "bios"], { error: 'firmware must be "uefi" or "bios"' })
      .default("uefi"),
    domainType: z
      .enum(["kvm", "qemu"], {
        error:
          'domainType must be "kvm" or "qemu" (software emulation, for hosts without /dev/kvm)',
      })
      .default("kvm"),
    cpuMode: cpuModeSchema.optional(),
    image: imageSchema,
    // cloud-init.
    userData: z
      .string({ error: "userData must be a string (any format cloud-init accepts)" })
      .optional(),
    /** For binary user-data (gzip): the bytes as base64. */
    userDataBase64: z.base64({ error: "userDataBase64 must be base64 text" }).optional(),
    vendorData: z.string({ error: "vendorData must be a string" }).optional(),
    installGuestAgent: z
      .boolean({ error: "installGuestAgent must be true or false" })
      .default(true),
    networkConfig: z
      .string({ error: "networkConfig must be NoCloud network-config text (v1 or v2)" })
      .optional(),
    /** Files the user-data writes, delivered in place when they change (common/guest-files.ts). */
    guestFiles: guestFilesSchema,
    // Behaviour.
    ...vmLifecycleShape,
    readiness: kvmReadinessSchema.default({ mode: "port", port: 3128 }),
    egressCheck: egressCheckSchema.optional(),
    timeouts: timeoutsSchema.default({ createSeconds: 900, readySeconds: 600, deleteSeconds: 300 }),
    owner: ownerSchema,
  })
  .refine((inputs) => inputs.userData === undefined || inputs.userDataBase64 === undefined, {
    error: "give userData or userDataBase64, not both",
    path: ["userDataBase64"],
  })
  .superRefine((inputs, context) => {
    for (const [field, message] of ipFamilyProblems(inputs))
      context.addIssue({ code: "custom", message, path: [field] });
  });

/** Checked inputs, defaults applied; check always fills vmName. */
export type KvmProxyInputs = z.output<typeof kvmProxyInputsSchema> & { vmName: string };

export function validateKvmInputs(
  raw: Record<string, unknown>,
): ValidationResult<z.output<typeof kvmProxyInputsSchema>> {
  return validateWithUnknowns(kvmProxyInputsSchema, raw, "KvmProxy", "docs/kvm.md");
}

/** The CPU mode a domain gets: passthrough on KVM, a model TCG can emulate on plain QEMU. */
export function effectiveCpuMode(
  inputs: Pick<KvmProxyInputs, "cpuMode" | "domainType">,
): KvmProxyInputs["cpuMode"] & {} {
  return inputs.cpuMode ?? (inputs.domainType === "kvm" ? "host-passthrough" : { model: "qemu64" });
}
