import assert from "node:assert/strict";
import { inspect } from "node:util";
import { PartialCreateError } from "../../provider/common/partial-create";

describe("PartialCreateError in a log", () => {
  it("names what it records, never the values (the connection's key and token)", () => {
    const key =
      "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjE\n-----END OPENSSH PRIVATE KEY-----";
    const error = new PartialCreateError(
      "hosts/kvm1:22/domains/p-1",
      {
        connection: { host: "kvm1", privateKey: key },
        apiToken: "root@pam!ci=0f1e2d",
        state: "stopped",
      },
      new Error("domainCreate failed: network default is not active"),
      { __provider: "serialized" },
    );
    const shown = inspect(error);
    assert.doesNotMatch(shown, /PRIVATE KEY|b3BlbnNzaC1rZXktdjE|0f1e2d/);
    assert.match(shown, /^PartialCreateError: domainCreate failed: network default is not active/);
    assert.match(shown, /id: hosts\/kvm1:22\/domains\/p-1/);
    assert.match(
      shown,
      /properties recorded: __provider, apiToken, connection, createIncomplete, state/,
    );
    // What the engine stores is unchanged.
    assert.equal((error.properties.connection as { privateKey: string }).privateKey, key);
  });
});
