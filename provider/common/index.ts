export * from "./deadline";
export * from "./errors";
export * from "./mark";
export * from "./names";
export * from "./partial-create";
export * from "./readiness";
export * from "./redact";
export * from "./version";
