//! Templates (E2B's `base` and `data-science`), as `tether image build --template NAME` builds
//! them: where a local one is kept, and what `create({ template })` sends as the image. The
//! CLI's `cli/src/templates/mod.rs` is the other half of this convention: the local provider
//! runs `DATA/templates/NAME/image` as `oci:PATH`, a cloud provider the image built under
//! `tether-NAME`.

import { existsSync } from "node:fs";
import { join } from "node:path";

import { TemplateNotBuiltError } from "./errors.js";

/** Every template, as `tether image templates` lists them. */
export const TEMPLATES = ["base", "data-science"] as const;
/** The prefix of a template's name on a cloud provider. */
const PROVIDER_PREFIX = "tether-";

/** The data directory of a relay on this machine, as the CLI finds it. */
function dataDir(): string {
  const env = process.env;
  if (env.TETHER_HOME) return env.TETHER_HOME;
  if (env.XDG_DATA_HOME) return join(env.XDG_DATA_HOME, "tether");
  return join(env.HOME || "/root", ".local/share/tether");
}

/** The built template `name`'s OCI layout on this machine. */
export function templateLayout(name: string): string {
  return join(dataDir(), "templates", name, "image");
}

/** Whether `tether image build --template NAME` has built `name` on this machine. */
export function isTemplateBuilt(name: string): boolean {
  const layout = templateLayout(name);
  return existsSync(join(layout, "index.json")) && existsSync(join(layout, "..", "template.json"));
}

function isLocal(provider: string | undefined): boolean {
  return provider === undefined || provider === "local";
}

/** The image a sandbox of template `name` on `provider` is created from. Throws a
 * `TypeError` for an unknown name and `TemplateNotBuiltError` for a local template not built
 * here. */
export function templateImage(name: string, provider: string | undefined): string {
  if (!(TEMPLATES as readonly string[]).includes(name)) {
    throw new TypeError(`there is no template "${name}"; the templates are ${TEMPLATES.join(", ")}`);
  }
  if (!isLocal(provider)) return PROVIDER_PREFIX + name;
  if (!isTemplateBuilt(name)) throw new TemplateNotBuiltError(name, templateLayout(name));
  return `oci:${templateLayout(name)}`;
}

