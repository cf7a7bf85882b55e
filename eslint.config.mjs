// @ts-check
import js from "@eslint/js";
import tseslint from "typescript-eslint";

export default tseslint.config(
  { ignores: ["dist/**", "node_modules/**", "**/*.js", "**/*.mjs"] },
  js.configs.recommended,
  ...tseslint.configs.recommended,
  {
    rules: {
      "@typescript-eslint/no-unused-vars": [
        "error",
        { argsIgnorePattern: "^_", varsIgnorePattern: "^_" },
      ],
      "no-restricted-imports": "off",
    },
  },
  {
    // A file holds one concern and a function tells one step: past these sizes a module wants
    // splitting by concern (docs/architecture.md, "Layout"). Tests are exempt (a spec may be long).
    files: [
      "index.ts",
      "provider/**/*.ts",
      "components/**/*.ts",
      "workloads/**/*.ts",
      "reaper/**/*.ts",
      "cli/**/*.ts",
    ],
    rules: {
      "max-lines": ["error", { max: 500 }],
      "max-lines-per-function": [
        "error",
        { max: 100, skipBlankLines: true, skipComments: true, IIFEs: true },
      ],
    },
  },
  {
    // The two self-contained libraries must stay publishable on their own.
    files: ["provider/libvirt-rpc-xdr/**/*.ts", "provider/iso9660-writer/**/*.ts"],
    rules: {
      "no-restricted-imports": [
        "error",
        {
          patterns: [
            {
              group: ["../*", "!./*"],
              message: "this library imports nothing else from the project",
            },
          ],
        },
      ],
    },
  },
  {
    files: ["provider/common/**/*.ts"],
    rules: {
      "no-restricted-imports": [
        "error",
        {
          patterns: [
            {
              group: ["../kvm/*", "../proxmox/*", "../../components/*"],
              message: "common imports no backend",
            },
          ],
        },
      ],
    },
  },
);
