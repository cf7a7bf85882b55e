export { buildNoCloudSeed, metaDataFor, vendorDataFor, SEED_VOLUME_LABEL } from "./seed";
export type { NoCloudSeed, NoCloudSeedInput, Payload } from "./seed";
export { GUEST_AGENT_SCRIPT, GUEST_AGENT_SCRIPT_NAME } from "./guest-agent-script";
export { sniffPayload, buildMultipart } from "./mime";
