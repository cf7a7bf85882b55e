import { strict as assert } from "node:assert";
import { errorClassOf } from "../../../provider/common/errors";
import {
  announcedOverCap,
  DEFAULT_IMAGE_MAX_MIB,
  describeBytes,
  imageMaxBytes,
  poolTooSmall,
} from "../../../provider/kvm/image-limits";

const MIB = 1024 * 1024;
const url = "https://user:pw@images.example/debian.qcow2";
const space = (availableBytes: number) => ({
  pool: "default",
  host: "kvm1",
  availableBytes: BigInt(availableBytes),
});

describe("KvmProxy image limits (pure)", () => {
  it("caps at 8 GiB unless image.maxMiB says otherwise; exactly the cap is allowed", () => {
    assert.equal(DEFAULT_IMAGE_MAX_MIB, 8192);
    assert.equal(imageMaxBytes(undefined), 8 * 1024 * MIB);
    assert.equal(announcedOverCap(url, 4 * MIB, 4), undefined);
    const over = announcedOverCap(url, 4 * MIB + 1, 4);
    assert.equal(errorClassOf(over), "Permanent");
    assert.match(
      over!.message,
      /more than image\.maxMiB allows \(4\.0 MiB\); .*raise image\.maxMiB \(now 4\)/,
    );
    assert.match(
      announcedOverCap(url, 9 * 1024 * MIB, undefined)!.message,
      /\(now 8192, the default\)/,
    );
  });

  it("compares Content-Length, else the cap, with the pool's free space; exactly full fits", () => {
    assert.equal(poolTooSmall(url, 8 * MIB, undefined, space(8 * MIB)), undefined);
    const sized = poolTooSmall(url, 8 * MIB + 1, undefined, space(8 * MIB));
    assert.equal(errorClassOf(sized), "Permanent");
    assert.match(
      sized!.message,
      /is 8\.0 MiB, but pool default on kvm1 has 8\.0 MiB free; nothing was uploaded/,
    );
    assert.doesNotMatch(
      sized!.message,
      /set image\.maxMiB/,
      "the size is known: the cap is no fix",
    );
    assert.equal(poolTooSmall(url, undefined, 8, space(8 * MIB)), undefined);
    const unknown = poolTooSmall(url, undefined, undefined, space(100 * MIB));
    assert.match(
      unknown!.message,
      /sends no Content-Length, so it may be up to image\.maxMiB \(8\.0 GiB\)/,
    );
    assert.match(unknown!.message, /or set image\.maxMiB to the image's size/);
  });

  it("never shows URL credentials, and says sizes in the unit a person compares", () => {
    const error = poolTooSmall(url, 10 * MIB, undefined, space(MIB));
    assert.ok(!error!.message.includes("pw@"), error!.message);
    assert.equal(describeBytes(512), "512 bytes");
    assert.equal(describeBytes((3 * MIB) / 2), "1.5 MiB");
    assert.equal(describeBytes(5n * 1024n * BigInt(MIB)), "5.0 GiB");
  });
});
