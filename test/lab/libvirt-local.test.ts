import { openLocalLibvirt } from "../../provider/ssh/local";
import { describeLibvirtAgainstLab } from "./libvirt-suite";

describeLibvirtAgainstLab("local unix socket", (lab) =>
  openLocalLibvirt({ socketPath: lab.libvirtSocket, uri: lab.uri }),
);
