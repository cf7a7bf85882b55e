import { describeLibvirtAgainstLab } from "./libvirt-suite";
import { openLabSsh } from "./ssh-helpers";

describeLibvirtAgainstLab("ssh forward to 127.0.0.1:2222", (lab) => openLabSsh(lab));
