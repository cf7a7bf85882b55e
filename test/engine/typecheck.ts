import { spawnSync } from "node:child_process";
import { cpSync, readdirSync, writeFileSync } from "node:fs";
import { join, resolve } from "node:path";
import type { ConsumerProject } from "./harness";

const REPOSITORY = resolve(__dirname, "..", "..", "..");
export const EXAMPLES = join(REPOSITORY, "examples");
const TSC = join(REPOSITORY, "node_modules", "typescript", "bin", "tsc");

/** The example directories under examples/. */
export const exampleNames = (): string[] =>
  readdirSync(EXAMPLES, { withFileTypes: true })
    .filter((entry) => entry.isDirectory())
    .map((entry) => entry.name);

/** A stack to type-check: a copy of an example directory, its index.ts replaced when `index` is given. */
export interface StackToCheck {
  name: string;
  example: string;
  index?: string;
}

export interface TypeCheck {
  status: number | null;
  /** Every `error TS` line tsc printed. */
  errors: string[];
  /** tsc's diagnostics in the stacks' own index.ts, by stack name. */
  errorsByStack: Map<string, string[]>;
  output: string;
}

/**
 * Copies `stacks` into `<project>/<folder>` and type-checks them as one
 * strict tsc program (so the package's types are loaded once), resolving
 * the package from the consumer project's node_modules as users install it.
 */
export function typeCheckStacks(
  project: ConsumerProject,
  folder: string,
  stacks: readonly StackToCheck[],
  options: { skipLibCheck: boolean },
): TypeCheck {
  const root = join(project.dir, folder);
  for (const stack of stacks) {
    cpSync(join(EXAMPLES, stack.example), join(root, stack.name), { recursive: true });
    if (stack.index !== undefined) writeFileSync(join(root, stack.name, "index.ts"), stack.index);
  }
  writeFileSync(
    join(root, "tsconfig.json"),
    JSON.stringify({
      compilerOptions: {
        target: "ES2022",
        module: "commonjs",
        moduleResolution: "node",
        strict: true,
        esModuleInterop: true,
        skipLibCheck: options.skipLibCheck,
        noEmit: true,
        types: ["node"],
      },
      files: stacks.map((stack) => `${stack.name}/index.ts`),
    }),
  );
  const result = spawnSync(process.execPath, [TSC, "-p", root, "--pretty", "false"], {
    cwd: root,
    encoding: "utf8",
  });
  const errors = result.stdout.split("\n").filter((line) => /error TS/.test(line));
  const errorsByStack = new Map<string, string[]>();
  for (const line of errors) {
    const match = /^([^/]+)\/index\.ts\(\d+,\d+\): error/.exec(line);
    if (match) errorsByStack.set(match[1], [...(errorsByStack.get(match[1]) ?? []), line]);
  }
  return { status: result.status, errors, errorsByStack, output: result.stdout + result.stderr };
}
