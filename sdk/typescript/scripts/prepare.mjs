// `npm install /path/to/sdk/typescript` (or a git checkout of it) runs this to build `dist/`
// from the sources: npm gives a folder dependency neither its dev dependencies nor a build, so
// a fresh clone would install a package with nothing to import. The compiler and the types
// come from this folder's own locked dev dependencies, installed here first when absent.

import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = join(dirname(fileURLToPath(import.meta.url)), "..");
const tsc = join(here, "node_modules", "typescript", "bin", "tsc");

/** npm settings that reach where packages come from (kept, so a mirror, a proxy or an offline
 * cache still applies); every other `npm_config_*` the outer install set (`--omit=dev`,
 * `--global`, `--save`, ...) is about that install and would break this one. */
const KEEP = /^npm_config_(cache|registry|userconfig|globalconfig|(https?_)?proxy|no_?proxy|strict_ssl|cafile|ca|offline|prefer_(offline|online)|fetch_.*|loglevel|@.*|\/\/.*)$/i;

function run(command, args) {
  const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !/^npm_config_/i.test(k) || KEEP.test(k)));
  const r = spawnSync(command, args, { cwd: here, env, stdio: "inherit", shell: process.platform === "win32" });
  if (r.error) throw new Error(`tether-sandbox prepare: cannot run ${command}: ${r.error.message}`);
  if (r.status !== 0) {
    console.error(`tether-sandbox prepare: \`${command} ${args.join(" ")}\` failed (exit ${r.status}) in ${here}`);
    process.exit(r.status ?? 1);
  }
}

if (!existsSync(tsc)) {
  // --ignore-scripts: this install must not run this script again.
  run("npm", ["ci", "--include=dev", "--ignore-scripts", "--no-audit", "--no-fund"]);
}
run(process.execPath, [tsc, "-p", "tsconfig.build.json"]);
