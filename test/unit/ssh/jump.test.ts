import assert from "node:assert/strict";
import { validateKvmInputs } from "../../../provider/kvm/schema";
import { SshConfigError, parseProxyJump, sshTargetKey } from "../../../provider/ssh";

describe("jump hosts: OpenSSH's ProxyJump form", () => {
  it("reads [user@]host[:port] lists the way ssh -J does, IPv6 in brackets", () => {
    assert.deepEqual(parseProxyJump("bastion", "f"), [{ host: "bastion" }]);
    assert.deepEqual(parseProxyJump("admin@bastion.example:2222", "f"), [
      { host: "bastion.example", port: 2222, user: "admin" },
    ]);
    assert.deepEqual(parseProxyJump(" jump1 , ops@[2001:db8::1]:22,[::1]", "f"), [
      { host: "jump1" },
      { host: "2001:db8::1", port: 22, user: "ops" },
      { host: "::1" },
    ]);
  });

  for (const [text, pattern] of [
    ["", /f must list jump hosts separated by commas/],
    ["a,,b", /f must list jump hosts separated by commas/],
    ["2001:db8::1", /f is not \[user@\]host\[:port\] \(an IPv6 address in brackets\)/],
    ["a,b:99999", /f hop 2 \("b:99999"\): port 99999 is not between 1 and 65535/],
    ["ssh://bastion", /f is not \[user@\]host\[:port\]/],
    ["a@b@c", /f is not/],
  ] as const)
    it(`refuses ${JSON.stringify(text)}, naming the field and the hop`, () =>
      assert.throws(
        () => parseProxyJump(text, "f"),
        (error: unknown) => error instanceof SshConfigError && pattern.test(error.message),
      ));

  it("connection.proxyJump: text, or a list of text and objects, each checked with the field named", () => {
    const base = {
      owner: { project: "p", stack: "s", resource: "r" },
      vmName: "vm-1",
      pool: "default",
      image: { url: "https://images.example/debian.qcow2" },
    };
    const check = (proxyJump: unknown) =>
      validateKvmInputs({ ...base, connection: { host: "kvm1.lan", proxyJump } });
    assert.equal(check("admin@bastion:2222").ok, true);
    assert.equal(check(["bastion", { host: "jump2.lan", user: "ops", port: 2200 }]).ok, true);
    const problems = (proxyJump: unknown): string => {
      const result = check(proxyJump);
      assert.equal(result.ok, false, JSON.stringify(proxyJump));
      return JSON.stringify(result);
    };
    assert.match(problems("bad host!"), /connection\.proxyJump is not \[user@\]host\[:port\]/);
    assert.match(problems([]), /connection\.proxyJump must name at least one jump host/);
    assert.match(
      problems([{ host: "j", privateKey: "/home/me/.ssh/id" }]),
      /connection\.proxyJump\[\]\.privateKey must be the key's text/,
    );
    assert.match(problems([{ host: "j", hostname: "x" }]), /hostname/);
    assert.match(problems(Array(9).fill("j")), /at most 8 jump hosts/);
  });

  it("pools links by the whole path: the same host through another jump is another link", () => {
    const target = { username: "root", host: "10.0.0.5", port: 22 };
    const direct = sshTargetKey(target);
    const viaA = sshTargetKey({ ...target, jumps: [{ username: "ops", host: "a" }] });
    const viaB = sshTargetKey({ ...target, jumps: [{ username: "ops", host: "b" }] });
    assert.equal(new Set([direct, viaA, viaB]).size, 3);
    assert.equal(viaA, "ops@a:22>root@10.0.0.5:22#qemu:///system");
  });
});
