/**
 * Adoption by `KvmProxy.get`: the creating arguments libvirt cannot report,
 * kept in the domain's ownership mark (common/mark.ts, `creation`) so an
 * adopted VM reads back as the program that made it declares it (docs/kvm.md,
 * "Adopting a VM"). Pure.
 *
 * The image URL stays out on purpose: a signed download URL carries its
 * credential in the query, and the mark is plaintext on the host.
 *
 * FROZEN, the field names and value forms below: they are written into the
 * metadata of every domain created since; add fields, never rename.
 */
import type { OwnershipMark } from "../common/mark";
import type { KvmProxyInputs } from "./schema";

type Props = Record<string, unknown>;

/** What create writes into the mark: nothing secret (cloud-init and keys stay out). */
export function creationOf(inputs: KvmProxyInputs): Record<string, string> {
  const creation: Record<string, string> = {
    installGuestAgent: String(inputs.installGuestAgent),
    imageFormat: inputs.image.format,
  };
  if (inputs.image.sha256 !== undefined) creation.imageDigest = inputs.image.sha256;
  if (inputs.vmNameChosenBy !== undefined) creation.vmNameChosenBy = inputs.vmNameChosenBy;
  return creation;
}

/**
 * The creating inputs a mark holds, in the inputs' own types; empty for a
 * mark written before creation fields existed: then these inputs stay out of
 * the adopted state, and diff leaves them out of the comparison
 * (common/diff.ts). A field that does not parse is left out the same way.
 */
export function adoptedCreation(mark: OwnershipMark): Props {
  const creation = mark.creation ?? {};
  const inputs: Props = {};
  if (creation.installGuestAgent === "true" || creation.installGuestAgent === "false")
    inputs.installGuestAgent = creation.installGuestAgent === "true";
  if (creation.vmNameChosenBy === "user" || creation.vmNameChosenBy === "provider")
    inputs.vmNameChosenBy = creation.vmNameChosenBy;
  if (creation.imageFormat === "qcow2" || creation.imageFormat === "raw")
    inputs.image = {
      format: creation.imageFormat,
      ...(creation.imageDigest === undefined ? {} : { sha256: creation.imageDigest }),
    };
  return inputs;
}

/**
 * Create adopting a domain it finds by name (a `.get` turned into `new`, a
 * resumed create): the domain must be the one the program describes. Its disk
 * is an overlay of the image it was made from, so a mark that names another
 * image is refused rather than recorded as the program's; undefined when it
 * agrees or does not say (an older mark, an image without sha256).
 */
export function creationMismatch(mark: OwnershipMark, inputs: KvmProxyInputs): string | undefined {
  const creation = mark.creation ?? {};
  const differing: string[] = [];
  if (creation.imageFormat !== undefined && creation.imageFormat !== inputs.image.format)
    differing.push(`image.format ${creation.imageFormat}`);
  const digest = inputs.image.sha256;
  if (creation.imageDigest !== undefined && digest !== undefined && creation.imageDigest !== digest)
    differing.push(`image.sha256 ${creation.imageDigest}`);
  if (differing.length === 0) return undefined;
  return `its mark says it was made from ${differing.join(", ")}, which the program does not ask for; declare it with the image it was made from, or choose another vmName`;
}
