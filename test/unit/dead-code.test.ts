/**
 * No dead code a reader trips over: every export of product code is used
 * somewhere (by product code, a test, or its own module), unless it is part of
 * a public face: the package's entry points, the root program's stack outputs,
 * or the barrels of the two self-contained libraries. And every barrel
 * (index.ts) under provider/ is imported by someone.
 *
 * Reads the TypeScript sources with the compiler's own checker, so a use
 * through an import alias or a re-export counts.
 */
import assert from "node:assert/strict";
import { join, relative, resolve } from "node:path";
import ts from "typescript";

const REPOSITORY = resolve(__dirname, "..", "..", "..");
const PRODUCT = /^(provider|components|reaper|cli)\/|^index\.ts$/;
/** What users (or Pulumi) reach without importing a module by path. */
const PUBLIC_FACES = [
  "index.ts",
  "components/index.ts",
  "provider/index.ts",
  "provider/libvirt-rpc-xdr/index.ts",
  "provider/iso9660-writer/index.ts",
];

/**
 * The stored provider is the implementation module itself (docs/frozen-api.md): Pulumi's
 * dynamic-provider server calls these on it, and closures stored by 0.1.0 call remove.
 */
const SERVER_CALLS = new Set(["configure", "check", "diff", "create", "read", "update", "delete"]);
const STORED_PROVIDER_MODULES = [
  "provider/kvm/provider.ts",
  "provider/proxmox/provider.ts",
  "provider/static/provider.ts",
];

describe("no dead code", function () {
  this.timeout(120_000);
  let program: ts.Program;
  let checker: ts.TypeChecker;
  let ours: ts.SourceFile[];
  const name = (file: ts.SourceFile): string => relative(REPOSITORY, file.fileName);

  function resolveAlias(symbol: ts.Symbol): ts.Symbol {
    let current = symbol;
    while (current.flags & ts.SymbolFlags.Alias) current = checker.getAliasedSymbol(current);
    return current;
  }

  before(() => {
    const config = ts.getParsedCommandLineOfConfigFile(
      join(REPOSITORY, "tsconfig.json"),
      undefined,
      {
        ...ts.sys,
        onUnRecoverableConfigFileDiagnostic: (diagnostic) => {
          throw new Error(ts.flattenDiagnosticMessageText(diagnostic.messageText, "\n"));
        },
      },
    )!;
    program = ts.createProgram(config.fileNames, { ...config.options, noEmit: true });
    checker = program.getTypeChecker();
    ours = program
      .getSourceFiles()
      .filter((file) => !file.fileName.includes("node_modules") && !file.isDeclarationFile);
  });

  /** Files that mention each symbol, apart from its own declaration and re-export lists. */
  function usesBySymbol(): Map<ts.Symbol, Set<string>> {
    const uses = new Map<ts.Symbol, Set<string>>();
    const note = (symbol: ts.Symbol, file: string): void => {
      if (!uses.has(symbol)) uses.set(symbol, new Set());
      uses.get(symbol)!.add(file);
    };
    for (const file of ours) {
      const visit = (node: ts.Node): void => {
        if (ts.isIdentifier(node) && !ts.isExportSpecifier(node.parent)) {
          const parent = node.parent;
          // `{ name }` uses the variable `name`; any other declaration's own name is not a use.
          const symbol = ts.isShorthandPropertyAssignment(parent)
            ? checker.getShorthandAssignmentValueSymbol(parent)
            : isDeclarationName(node)
              ? undefined
              : checker.getSymbolAtLocation(node);
          if (symbol) {
            note(symbol, file.fileName);
            note(resolveAlias(symbol), file.fileName);
          }
        }
        ts.forEachChild(node, visit);
      };
      visit(file);
    }
    return uses;
  }

  /** `node` names the thing its parent declares (not a use of anything). */
  function isDeclarationName(node: ts.Identifier): boolean {
    const parent = node.parent;
    const declares =
      ts.isVariableDeclaration(parent) ||
      ts.isFunctionDeclaration(parent) ||
      ts.isClassDeclaration(parent) ||
      ts.isInterfaceDeclaration(parent) ||
      ts.isTypeAliasDeclaration(parent) ||
      ts.isEnumDeclaration(parent) ||
      ts.isModuleDeclaration(parent);
    return declares && parent.name === node;
  }

  function exportsOf(file: ts.SourceFile): ts.Symbol[] {
    const module = checker.getSymbolAtLocation(file);
    return module === undefined ? [] : checker.getExportsOfModule(module);
  }

  it("every export of product code is used somewhere or is part of a public face", () => {
    const publicSymbols = new Set<ts.Symbol>();
    for (const face of PUBLIC_FACES) {
      const file = program.getSourceFile(join(REPOSITORY, face));
      assert.ok(file, `${face} is not in the program`);
      for (const symbol of exportsOf(file)) publicSymbols.add(resolveAlias(symbol));
    }
    const uses = usesBySymbol();
    const unused: string[] = [];
    let checked = 0;
    for (const file of ours.filter((candidate) => PRODUCT.test(name(candidate)))) {
      for (const exported of exportsOf(file)) {
        const symbol = resolveAlias(exported);
        if (symbol.declarations?.[0]?.getSourceFile() !== file) continue; // a re-export
        checked++;
        if (publicSymbols.has(symbol) || (uses.get(symbol)?.size ?? 0) > 0) continue;
        if (STORED_PROVIDER_MODULES.includes(name(file)) && SERVER_CALLS.has(exported.name))
          continue;
        unused.push(`${name(file)}: ${exported.name}`);
      }
    }
    assert.ok(checked > 300, `only ${checked} exports seen: the scan is broken`);
    assert.deepEqual(unused, [], "exported but used nowhere: remove them");
  });

  it("every barrel under provider/ is imported by someone or is a public face", () => {
    const imported = new Set<string>();
    for (const file of ours)
      for (const statement of file.statements)
        if (
          (ts.isImportDeclaration(statement) || ts.isExportDeclaration(statement)) &&
          statement.moduleSpecifier !== undefined
        ) {
          const target = checker.getSymbolAtLocation(statement.moduleSpecifier);
          const source = target?.declarations?.[0]?.getSourceFile();
          if (source && source !== file) imported.add(name(source));
        }
    const barrels = ours
      .map(name)
      .filter((file) => file.startsWith("provider/") && file.endsWith("/index.ts"));
    assert.ok(barrels.length > 0);
    const unimported = barrels.filter((b) => !imported.has(b) && !PUBLIC_FACES.includes(b));
    assert.deepEqual(unimported, []);
  });
});
