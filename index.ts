// The root Pulumi program. The pool issue replaces this placeholder with a pool
// built from stack config; until then it only proves the package loads.
import * as pulumi from "@pulumi/pulumi";
import { packageVersion } from "./provider";

export const egressProxiesVersion = pulumi.output(packageVersion);
