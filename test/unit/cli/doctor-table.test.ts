import { strict as assert } from "node:assert";
import { renderTable, wrapText, type HostReport } from "../../../cli/doctor/report";
import type { DoctorTarget } from "../../../cli/doctor/targets";
import type { Finding } from "../../../provider/kvm/preflight";
import { doctorTableRows, squashed } from "../../support/doctor-table";

const target = (name: string, label: string): DoctorTarget =>
  ({
    name,
    label,
    inputPrefix: "egress-proxies:pool.backends[0].kvm.",
    connectTo: { socketPath: "/var/run/libvirt/libvirt-sock" },
    wants: {},
  }) as unknown as DoctorTarget;

const POOL_FIX = [
  "virsh pool-define-as default dir --target /var/lib/libvirt/images",
  "virsh pool-build default",
  "virsh pool-start default",
  "virsh pool-autostart default",
];

const findings: Finding[] = [
  {
    check: "libvirt-version",
    status: "ok",
    input: "firmware",
    wanted: "uefi",
    hostHas: "libvirt 9.0.0",
    fix: [],
  },
  {
    check: "pool",
    status: "fail",
    input: "pool",
    wanted: "default",
    hostHas: "no such pool (no pools at all)",
    fix: POOL_FIX,
    safeFix: { kind: "create-default-pool" },
  } as Finding,
  {
    check: "network",
    status: "fail",
    input: "network.name",
    wanted: "default",
    hostHas: "defined but not active",
    fix: ["virsh net-start default", "virsh net-autostart default"],
  },
];

describe("doctor table", () => {
  const reports: HostReport[] = [
    { target: target("kvm-basement", "kvm-basement.home.arpa:2222"), findings, fixed: [] },
    {
      target: target("local", "local"),
      problem:
        "cannot connect to libvirt socket /var/run/libvirt/libvirt-sock: connect ENOENT; libvirtd is not running or listens elsewhere: start it (systemctl start libvirtd) or set socketPath",
      findings: [],
      fixed: [],
    },
  ];

  it("fits 80 columns however long the findings are", () => {
    const table = renderTable(reports);
    for (const line of table.split("\n")) assert.ok(line.length <= 80, `${line.length}: ${line}`);
    assert.match(table.split("\n")[0]!, /^HOST\s+CHECK\s+STATUS\s+WHAT\s+FIX$/);
    // Long enough to need wrapping: the pool row takes several lines.
    assert.ok(table.split("\n").length > 2 + reports.length + findings.length);
  });

  it("wraps WHAT and FIX without losing or repeating a word", () => {
    const table = renderTable(reports);
    const rows = doctorTableRows(table);
    assert.deepEqual(
      rows.map((row) => `${row.check} ${row.status}`),
      ["libvirt-version OK", "pool FAIL", "network FAIL", "connect FAIL"],
    );
    const pool = rows[1]!;
    assert.equal(
      squashed(pool.what),
      squashed("egress-proxies:pool.backends[0].kvm.pool=default: no such pool (no pools at all)"),
    );
    assert.equal(squashed(pool.fix), squashed(`${POOL_FIX.join("; ")} [--fix does this]`));
    assert.equal(squashed(rows[3]!.what), squashed(reports[1]!.problem!));
    assert.deepEqual(
      rows.map((row) => squashed(row.host)),
      [...findings.map(() => "kvm-basement(kvm-basement.home.arpa:2222)"), "local"],
    );
    // Said once: the problem and each fix appear in one row only, and the host on its first row.
    assert.equal(squashed(table).split("cannotconnecttolibvirtsocket").length, 2);
    assert.equal(squashed(table).split("virshpool-builddefault").length, 2);
    assert.equal(table.split("kvm-basement ").length, 2);
  });

  it("uses a wider terminal when it has one", () => {
    const wide = renderTable(reports, 200);
    assert.ok(wide.split("\n").some((line) => line.length > 80));
    assert.ok(wide.split("\n").every((line) => line.length <= 200));
  });

  it("wrapText keeps words whole and cuts only a word longer than the line", () => {
    assert.deepEqual(wrapText("aa bb cc", 5), ["aa bb", "cc"]);
    assert.deepEqual(wrapText("abcdefgh", 3), ["abc", "def", "gh"]);
    assert.deepEqual(wrapText("/var/lib/libvirt/images", 12), ["/var/lib/", "libvirt/", "images"]);
    assert.deepEqual(wrapText("", 10), [""]);
  });
});
