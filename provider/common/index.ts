export * from "./errors";
export * from "./mark";
export * from "./names";
export * from "./redact";
export * from "./version";
