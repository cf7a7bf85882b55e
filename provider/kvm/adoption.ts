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
